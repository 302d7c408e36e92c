"""`torch.compile(backend="tpu")`: Dynamo FX -> AOTAutograd (min-cut partitioner) -> ATen graphs -> the same
lowerings as eager -> one `jax.jit` per graph -> StableHLO -> an XLA executable."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torch_tpu import metrics
from torch_tpu import random as tpu_random
from torch_tpu.compile import ahead as compile_ahead
from torch_tpu.compile import buckets, graph, runahead, tiers, warm
from torch_tpu.eager import fused
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.ops.decompositions import for_graphs as decompositions
from torch_tpu.runtime import arguments, checks, memory, platform, storage, trace_context
from torch_tpu.runtime import persistent as cache
from torch_tpu.runtime.hooks import hooks

_OPTIONS = {"async_compile", "num_dynamic_buckets", "bucket_size", "serializable", "debug_callback", "name"}


class CompiledGraph:
    """One ATen graph as a cached XLA executable, called with and returning ordinary torch tensors.

    With bucket options and a dynamic size, the graph runs padded (`buckets.Plan`): one executable per bucket of
    padded sizes, at most `num_buckets` of them. `kind`: AOTAutograd's ("forward", "backward", "inference"); a
    training graph's program compiles ahead of its first call (`_AHEAD`, `compile.ahead`).
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        debug_callback: Callable | None,
        bucket_options: buckets.Options | None = None,
        kind: str = "inference",
    ) -> None:
        self.name = name
        self.kind = kind
        self.token_position: int | None = None  # a backward's output that the next forward waits for (`runahead`)
        graph.check_supported(gm)
        arity = sum(1 for node in gm.graph.nodes if node.op == "placeholder")  # the caller's arguments
        self.plan = buckets.plan(gm, name) if bucket_options is not None else None
        if self.plan is not None:
            gm = self.plan.gm
        self.bucket_options = bucket_options
        self.buckets: list[tuple[int, ...]] = []
        self.fn, self.mutations = graph.to_jax(gm)
        self.opaque = set(graph.opaque_inputs(gm))
        self.kept = [i for i in range(arity) if i not in self.opaque]  # the arguments the executable takes
        self.kept_position = {index: position for position, index in enumerate(self.kept)}
        self.spmd = hooks.spmd_plan(gm) if hooks.spmd_plan is not None else None
        self.donated = self._donated() if self.spmd is None and self.plan is None else []
        # the arguments that may arrive as their storage's array in another shape, reshaped in the program
        written = {index for index, _ in self.mutations}
        plain = self.spmd is None and self.plan is None
        self.as_stored = frozenset(i for i in self.kept if i not in written) if plain else frozenset()
        output_node = next(n for n in gm.graph.nodes if n.op == "output")
        placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        self.sized = not all(isinstance(placeholders[i].meta.get("val"), torch.Tensor) for i in self.kept)
        # per mutation, the position of the input whose buffer, read whole, takes the new value as its array: the
        # program writes a value of the input's shape and dtype as traced (`graph.to_jax`; `arguments.write_back`)
        self.replaced_at = [self.kept_position.get(index) if plain else None for index, _ in self.mutations]
        self.host_outputs = [
            isinstance(v := getattr(o, "meta", {}).get("val"), torch.Tensor) and v.device.type == "cpu"
            for o in output_node.args[0]
        ]
        self.debug_callback = debug_callback
        self.gm = gm
        # a training graph's program compiles now, on a thread, while AOTAutograd and Dynamo finish (compile/ahead.py)
        self.ahead = None
        if kind in _AHEAD and plain and debug_callback is None and compile_ahead.enabled():
            lowering = lambda k, v: self._lowering(k, v, ())
            self.ahead = compile_ahead.start(gm, self.kept, self.fn.sizes, lowering, kind == "backward")

    def _donated(self) -> list[tuple[int, int]]:
        """(argument index, position among the executable's inputs) of each input the graph writes back: its
        memory may hold the new value (donate_argnums), as an optimizer step updates parameters and state in
        place, so the step needs no second copy of them."""
        return [(index, self.kept_position[index]) for index, _ in self.mutations if index in self.kept_position]

    def _owned_or_copied(self, inputs: list[Any], held: list[Any]) -> None:
        """Each donated input as an array the executable may consume: one only the written tensor's storage (and
        `inputs`) holds, which the write-back then replaces; an array held elsewhere too (another tensor's
        storage, a cache, the user's JAX code, a second position of `inputs`) is passed as a copy."""
        for _, position in self.donated:
            array = inputs[position]
            if type(array) is int:
                continue
            # references: `inputs`, `array`, getrefcount's argument, and the storage when the tensor is all of it
            if sys.getrefcount(array) > 3 + (held[position] is not None):
                inputs[position] = storage.copy_array(array)

    def _compile(self, key: Any, inputs: list[Any], reshapes: tuple = ()) -> tuple[Any, Entry]:
        """Trace (afresh: the precision in force is read while tracing), compile or load, and run once; or take
        the program compiled ahead where this call is the one it was compiled for."""
        platform.devices()
        start = time.perf_counter()
        ahead, self.ahead = self.ahead, None
        ready = ahead.take(inputs, reshapes) if ahead is not None else None
        if ready is not None:
            return self._run_ahead(key, inputs, reshapes, ready)
        if self.spmd is None:
            executable, from_disk = self._compile_plain(key, inputs, reshapes)
        else:  # its ranks agree first, then each lowers it (which records its 0-d outputs) and compiles or loads it
            self.spmd.agree(self.name, inputs)
            executable, from_disk = cache.compile_lowered(self._lowering(key, inputs, reshapes)(), self.spmd.devices)
        outputs = jax.block_until_ready(self._run(executable, key, inputs))
        entry = Entry(
            self.name,
            cache.fast_call(executable),
            time.perf_counter() - start,
            source="disk" if from_disk else "compiled",
            temp_bytes=cache.temp_bytes(executable),
        )
        return outputs, entry

    def _compile_plain(self, key: Any, inputs: list[Any], reshapes: tuple) -> tuple[Any, bool]:
        """The graph's program for one device, through the graph index (`warm.executable`); where clusters
        compile in two tiers, a graph of independent computations (an optimizer step's) runs its parts while its
        whole program compiles (`compile.tiers`)."""
        values = [key, *inputs]
        simple = self.plan is None and self.debug_callback is None and not reshapes
        if simple and cache.tiering() and not any(isinstance(value, int) for value in inputs):
            trace = functools.partial(self._traced, key, inputs, reshapes)
            donated = self._donate_argnums()
            return tiers.compile_graph(self.gm, self.fn.sizes, values, trace, donated, f"compiled_{self.name}")
        lower = self._lowering(key, inputs, reshapes)
        return warm.executable(self.gm, self.fn.sizes, values, lower, usable=self.debug_callback is None)

    def _run_ahead(self, key: Any, inputs: list[Any], reshapes: tuple, ready: tuple) -> tuple[Any, Entry]:
        """Run the program compiled ahead (`compile.ahead`); where inputs arrive reshaped, through a
        `Reshaping` while the program that takes them as they are compiles."""
        executable, from_disk, seconds = ready
        call = cache.fast_call(executable)
        if reshapes:
            lower = self._lowering(key, inputs, reshapes)
            exact = warm.executable_soon(self.gm, self.fn.sizes, [key, *inputs], lower, fused.compiler())
            call = compile_ahead.Reshaping(call, reshapes, exact)
        outputs = jax.block_until_ready(self._run(call, key, inputs))
        source = "disk" if from_disk else "compiled"
        return outputs, Entry(self.name, call, seconds, source=source, temp_bytes=cache.temp_bytes(executable))

    def _lowering(self, key: Any, inputs: list[Any], reshapes: tuple) -> Callable[[], jax.stages.Lowered]:
        """The function that lowers the graph for a call with `key` and `inputs` (arrays or abstract values).

        Integer inputs are sizes of dynamic dimensions: they are compiled in, one program per size (per bucket
        when padded; the real sizes are then traced scalar inputs). `reshapes`: (position, shape) of each input
        given as its storage's array (`arguments.read`), which the program reshapes to the argument's shape.
        """

        def lower() -> jax.stages.Lowered:
            if self.spmd is None:
                lowered = self._traced(key, inputs, reshapes).lower()
            else:
                lowered = self.spmd.lower(self._fresh(reshapes), [key, *inputs])
            if self.debug_callback is not None:
                self.debug_callback(self.gm.code, lowered.as_text())
            return lowered

        return lower

    def _traced(self, key: Any, inputs: list[Any], reshapes: tuple) -> jax.stages.Traced:
        """The graph traced for one device (`_lowering`), consuming the inputs it writes back."""
        sizes = tuple(i + 1 for i, value in enumerate(inputs) if isinstance(value, int))
        fresh = self._fresh(reshapes)
        return jax.jit(fresh, static_argnums=sizes, donate_argnums=self._donate_argnums()).trace(key, *inputs)

    def _donate_argnums(self) -> tuple[int, ...]:
        """The program's positions of the inputs it consumes (`donated`), after the RNG key."""
        return tuple(position + 1 for _, position in self.donated)

    def _fresh(self, reshapes: tuple) -> Callable:
        """A new function of the graph (JAX caches traces per function), reshaping the inputs at `reshapes`."""
        targets = {position + 1: shape for position, shape in reshapes}  # after the RNG key

        def fresh(*values: Any) -> Any:
            if targets:
                values = tuple(v.reshape(targets[i]) if i in targets else v for i, v in enumerate(values))
            return self.fn(*values)

        fresh.__name__ = fresh.__qualname__ = f"compiled_{self.name}"  # its module: jit_compiled_graph_forward
        return fresh

    def _run(self, executable: Callable, key: jax.Array, inputs: list[Any]) -> Any:
        if self.spmd is not None:
            return self.spmd.call(executable, [key, *inputs])
        if self.sized:
            inputs = [value for value in inputs if not isinstance(value, int)]
        return executable(key, *inputs)

    def __call__(self, *args: Any) -> list[Any]:
        key = tpu_random.next_key()
        fused.flush()  # a compiled graph runs on computed values
        if self.kind == "forward":
            runahead.before_forward()
        inputs, held, stored = arguments.read(args, self.kept, self.as_stored)
        reshapes = tuple((position, tuple(args[self.kept[position]].shape)) for position in stored)
        self._owned_or_copied(inputs, held)
        if self.plan is None:
            shape_key = tuple(value for value in inputs if isinstance(value, int)) if self.sized else ()
        else:
            real = self.plan.sizes(inputs)
            shape_key = self._bucket(real)
            inputs = self.plan.pad(inputs, real, shape_key)
        cache_key = ("graph", self.name, id(self), trace_context.cache_token(), shape_key, reshapes)
        entry = executables.lookup(cache_key)
        try:
            if entry is None:  # first call, or first call under this precision state
                outputs, entry = self._compile(key, inputs, reshapes)
                executables.insert(cache_key, entry)
                metrics.compiled("graph", entry.source, entry.compilation_duration)
            else:
                outputs = self._run(entry.executable, key, inputs)
        except jax.errors.JaxRuntimeError as error:
            if memory.is_oom(error):  # compiling (a program that cannot fit) or running
                raise memory.out_of_memory(error) from error
            raise
        outputs = list(checks.take(outputs))  # device-side checks left pending (runtime/checks.py)
        if self.kind == "backward":
            if self.token_position is None:
                self.token_position = runahead.smallest(outputs)
            runahead.backward_ran(outputs[self.token_position] if self.token_position is not None else None)
        if self.plan is None:
            for position, size in self.fn.sizes.get(shape_key, {}).items():
                outputs[position] = size
        else:
            outputs = self.plan.finish(outputs, self.mutations, real)
        self._pass_through(args, outputs, held)
        replaced = [None if at is None else held[at] for at in self.replaced_at]
        arguments.write_back(
            [args[index] for index, _ in self.mutations], [outputs[p] for _, p in self.mutations], replaced
        )
        results = []  # the graph's own outputs; the written-back values after them are not the caller's
        own = outputs[: len(outputs) - len(self.mutations)]
        for value, host in zip(own, self.host_outputs + [False] * len(own), strict=False):
            if isinstance(value, jax.Array):
                wrapped = storage.wrap(value)
                results.append(wrapped.cpu() if host else wrapped)
            else:
                results.append(value)
        return results

    def _pass_through(self, args: Sequence[Any], outputs: list[Any], held: list[Any]) -> None:
        """Put the inputs the graph returns as they are (`Replay.passthrough`) among its outputs: the caller's own
        object where it is all of its storage (a weight a forward saves for its backward), else its value as a new
        array, which a backward compiled ahead (`compile.ahead`) takes as its key expects, not in another shape."""
        for position, index in self.fn.passthrough.items():
            value = args[index]
            kept = self.kept_position.get(index)
            whole = kept is None or held[kept] or not isinstance(value, torch.Tensor) or value.device.type != "tpu"
            outputs[position] = value if whole else storage.value(value)

    def _bucket(self, real: tuple[int, ...]) -> tuple[int, ...]:
        """The padded sizes for these real sizes; a bucket beyond `num_buckets` is an error, not a compile."""
        options = self.bucket_options
        bucket = self.plan.bucket(real, options.bucket_size)
        if bucket not in self.buckets:
            if len(self.buckets) >= options.num_buckets:
                named = self.plan.named
                raise RuntimeError(
                    f"torch_tpu: graph '{self.name}' needs more than num_dynamic_buckets={options.num_buckets} "
                    f"programs: dynamic sizes {named(real)} pad to {named(bucket)} (bucket_size="
                    f"{options.bucket_size}), and the buckets {[named(b) for b in self.buckets]} are compiled "
                    f"already. Raise num_dynamic_buckets (at most {buckets.MAX_BUCKETS}) or bucket_size."
                )
            self.buckets.append(bucket)
        return bucket


_AHEAD = ("forward", "backward")
"""The graphs whose programs compile ahead (`compile.ahead`): a training graph's pair, both run in a step. An
inference graph's program compiles at its first call: that call follows at once, and a graph of independent
computations (an optimizer step's) runs its parts meanwhile (`compile.tiers`)."""


def _compiler(
    kind: str, name: str, debug_callback: Callable | None, bucket_options: buckets.Options | None
) -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        compiled = CompiledGraph(gm, f"{name}:{kind}", debug_callback, bucket_options, kind=kind)
        return make_boxed_func(torch._dynamo.disable(compiled))

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None, **_: Any) -> Callable:
    """The Dynamo backend registered as "tpu"."""
    options = dict(options or {})
    if not torch._dynamo.config.assume_static_by_default:
        raise NotImplementedError(
            "torch_tpu: torch.compile(dynamic=True) is not supported: XLA compiles static shapes. Leave `dynamic` "
            "unset (each new shape compiles its own program) or mark a dimension with torch._dynamo.mark_dynamic "
            "and bound the programs with options num_dynamic_buckets/bucket_size."
        )
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"torch_tpu: unknown torch.compile options {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    name = options.get("name", "graph")
    debug_callback = options.get("debug_callback")
    bucket_options = buckets.Options.parse(options)
    aot_options = {
        "partition_fn": min_cut_rematerialization_partition,
        "decompositions": decompositions(),
        "keep_inference_input_mutations": True,
    }
    if debug_callback is None and warm.aot_enabled():  # AOTAutograd's cache, so that a warm process skips it
        return warm.cached_aot_autograd(
            gm,
            example_inputs,
            options,
            lambda kind: functools.partial(
                CompiledGraph,
                name=f"{name}:{kind}",
                debug_callback=None,
                bucket_options=bucket_options,
                kind=kind,
            ),
            **aot_options,
        )
    return aot_autograd(
        fw_compiler=_compiler("forward", name, debug_callback, bucket_options),
        bw_compiler=_compiler("backward", name, debug_callback, bucket_options),
        inference_compiler=_compiler("inference", name, debug_callback, bucket_options),
        **aot_options,
    )(gm, example_inputs)
