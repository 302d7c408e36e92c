"""Warm starts: what lets a second process skip the work the first one did for `torch.compile(backend="tpu")`.

The persistent tier (`runtime.persistent`) holds executables keyed by their StableHLO, so on its own a warm process
still runs AOTAutograd and re-traces our lowerings to find that key. Two layers remove that work:

1. AOTAutograd's own cache (`torch._functorch._aot_autograd.autograd_cache`). Our compilers are
   `SerializableAOTDispatchCompiler`s returning `GraphCode`, an `OutputCode` that carries the ATen graph
   (pickled by `GraphPickler`, which keeps the FakeTensor metadata the lowerings read), and entries are bundled
   (`bundled_autograd_cache`), so a hit skips AOTAutograd's tracing, functionalization and partitioning.
   PyTorch keys the entry (Dynamo graph, input metadata, torch configs and sources) and stores it under its
   cache directory (`TORCHINDUCTOR_CACHE_DIR`, `aotautograd/`); we add a salt to the key: the torch_tpu
   sources, which ops are lowered and the backend options, which decide the decompositions and what our
   compilers build.
2. A graph-keyed index (`graph_key`): a fingerprint of the ATen graph (code, every node's dtype/shape/device
   and the content of its lowering, constants' values), the inputs' shapes and dtypes, compiled-in sizes,
   precision, XLA options, JAX flags, torch_tpu sources and versions names the executable the graph compiled
   to, so a warm process loads it without lowering. Anything not in the key misses, it never guesses: a graph
   with a lowering whose content cannot be read (`Unidentified`) is not indexed.

Both are off with `TORCH_TPU_PERSISTENT_CACHE=0` or `torch.compiler.config.force_disable_caches`, and when a
`debug_callback` is given (it must see the lowering); the first also with `TORCHINDUCTOR_AUTOGRAD_CACHE=0`.
What a warm process still pays is Dynamo's tracing: in torch 2.13 its precompile cache
(`torch._dynamo.config.caching_precompile`) bypasses an optimizer step's graph (parameters as static addresses)
and then fails, and `torch._dynamo.aot_compile` needs `fullgraph=True`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import jax
import numpy as np
import torch
import torch._functorch.config
from torch._dynamo.backends.common import aot_autograd
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._inductor.output_code import OutputCode
from torch._ops import OpOverload

from torch_tpu import precision
from torch_tpu.ops.decompositions import lowered_ops
from torch_tpu.ops.registry import graph_lowering
from torch_tpu.runtime import persistent as cache
from torch_tpu.runtime import trace_context

_COMPILERS = {"fw_compiler": "forward", "bw_compiler": "backward", "inference_compiler": "inference"}


def enabled() -> bool:
    """Whether the warm-start layers are used (they follow the persistent tier and PyTorch's master switch)."""
    return cache.enabled() and not torch.compiler.config.force_disable_caches


def aot_enabled() -> bool:
    """Whether AOTAutograd's cache is used too. It costs a cold process ~10% more (PyTorch's key imports Inductor
    and hashes torch's sources; the entry is pickled), so PyTorch's own switch turns it off
    (`TORCHINDUCTOR_AUTOGRAD_CACHE=0`, `torch._functorch.config.enable_autograd_cache`)."""
    return enabled() and torch._functorch.config.enable_autograd_cache


@functools.cache
def sources() -> str:
    """A hash of torch_tpu's Python sources: lowerings and decompositions change with them, the version
    string does not (one hash per process; ~3 ms)."""
    digest = hashlib.sha256()
    package = pathlib.Path(__file__).resolve().parent.parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# --- layer 1: AOTAutograd's cache -------------------------------------------------------------------------------


def _fake_tensor(
    state: Any,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    device: torch.device,
    requires_grad: bool,
) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad)
        return FakeTensor(state.fake_mode, meta, device)


def _pickler() -> type:
    """GraphPickler with a lean form for static-shape FakeTensors: the lowering reads only their dtype, shape
    and device, and rebuilding each through the meta converter (views, storages) costs ~0.2 ms a node.
    Symbolic ones keep GraphPickler's full form (their ShapeEnv matters)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx._graph_pickler import GraphPickler

    class Pickler(GraphPickler):
        def reducer_override(self, obj: object) -> Any:
            if isinstance(obj, FakeTensor) and not any(
                isinstance(size, torch.SymInt) for size in (*obj.shape, *obj.stride(), obj.storage_offset())
            ):
                return _fake_tensor, (
                    self._unpickle_state,
                    obj.dtype,
                    tuple(obj.shape),
                    obj.stride(),
                    obj.device,
                    obj.requires_grad,
                )
            return super().reducer_override(obj)

    return Pickler


@dataclasses.dataclass
class GraphCode(OutputCode):
    """One ATen graph as our backend compiles it, in the form AOTAutograd's cache stores and reloads.

    `factory(gm)` builds the callable (a `CompiledGraph`); it must pickle by reference. Lowering and XLA
    compilation happen at the first call, as without the cache.
    """

    factory: Callable[[torch.fx.GraphModule], Callable[..., Any]] | None = None
    gm: torch.fx.GraphModule | None = None
    serialized: bytes | None = None

    def __post_init__(self) -> None:
        self._boxed_call = True
        self._run: Callable[..., Any] | None = None
        if self.gm is not None:
            self._build(self.gm)

    def _build(self, gm: torch.fx.GraphModule) -> None:
        assert self.factory is not None
        self.gm = gm
        self._run = torch._dynamo.disable(self.factory(gm), reason="torch_tpu runs the graph as one executable")

    def __call__(self, inputs: Sequence[Any]) -> Any:
        """Run the graph (boxed calling convention, as AOTAutograd calls an `OutputCode`)."""
        assert self._run is not None, "GraphCode called before post_compile"
        return self._run(*inputs)

    def prepare_for_serialization(self) -> None:
        """Turn the graph into bytes (on the copy AOTAutograd pickles; the live object keeps running)."""
        from torch.fx._graph_pickler import Options

        if self.gm is not None:
            # Only what the lowering reads: values (dtype/shape/device) and source lines for error messages.
            options = Options(ops_filter=None, node_metadata_key_filter=lambda key: key in ("val", "stack_trace"))
            self.serialized = _pickler().dumps(self.gm, options)
        self.gm = None
        self._run = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """On a cache hit: rebuild the graph, its FakeTensors in the fake mode of `example_inputs`, and the
        callable."""
        if self._run is not None:
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler

        assert self.serialized is not None
        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
        gm = GraphPickler.loads(self.serialized, fake_mode)
        assert isinstance(gm, torch.fx.GraphModule)
        gm.recompile()
        self._build(gm)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        """No Triton here."""


def _graph_code(
    factory: Callable[[torch.fx.GraphModule], Callable[..., Any]],
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
) -> GraphCode:
    return GraphCode(factory=factory, gm=gm)


def cached_aot_autograd(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any],
    factory: Callable[[str], Callable[[torch.fx.GraphModule], Callable[..., Any]]],
    **aot_kwargs: Any,
) -> Callable[..., Any]:
    """`aot_autograd(...)(gm, example_inputs)` with AOTAutograd's cache: a warm process gets the partitioned
    graphs back from disk instead of tracing them. `factory(kind)` builds a graph's callable and must pickle."""
    # PyTorch hashes the Dynamo graph module's attributes into the key: this one makes the key ours too. Which
    # ops are lowered decides what AOTAutograd decomposes; what the lowerings compute is in the graph index's key.
    lowered = hashlib.sha256(repr(sorted(map(str, lowered_ops()))).encode()).hexdigest()
    patches = {"bundled_autograd_cache": True, "force_non_lazy_backward_lowering": True}
    try:
        kernels = _kernel_tokens(gm)
    except Unidentified:  # a custom op whose lowering we cannot fingerprint: its graphs are traced in every process
        kernels, patches["enable_autograd_cache"] = "unidentified", False
    gm._torch_tpu_cache_salt = f"{sources()};{lowered};{kernels};{sorted(options.items())!r}"
    compilers = {
        argument: SerializableAOTDispatchCompiler(GraphCode, functools.partial(_graph_code, factory(kind)))
        for argument, kind in _COMPILERS.items()
    }
    # Bundled entries hold our OutputCode itself (unbundled ones point into Inductor's FX graph cache). The
    # backward is compiled now, not at the first backward, so that the entry is saved inside this patch.
    with torch._functorch.config.patch(**patches):
        return aot_autograd(**compilers, **aot_kwargs)(gm, example_inputs)


def _kernel_tokens(gm: torch.fx.GraphModule) -> str:
    """The content of the lowerings of the custom ops the Dynamo graph calls (a `jax_op`, a user's
    `register_lowering`): the fake implementation, hence the ATen graph AOTAutograd caches, is derived from
    it, so a kernel changed under the same name must miss (its output shape may have changed)."""
    tokens = set()
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if node.op == "call_function" and isinstance(node.target, OpOverload):
                    tokens.add(f"{node.target}={_lowering_token(node.target)}")
    return hashlib.sha256(repr(sorted(tokens)).encode()).hexdigest()


# --- layer 2: graph-keyed executables ---------------------------------------------------------------------------


def _value_token(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}@{value.device.type}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_token(v) for v in value) + ")"
    return type(value).__name__ if value is None else f"{type(value).__name__}:{value}"


def _constant_token(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        # A fresh dense copy: `contiguous()` keeps a size-1 dimension's stride, which may be 0 (an expanded
        # constant), and a byte view needs unit stride.
        data = torch.empty(value.shape, dtype=value.dtype).copy_(value.detach()).reshape(-1)
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()
        return f"{_value_token(value)}:{digest}"
    return repr(value)


class Unidentified(Exception):
    """A lowering whose content cannot be hashed (it reads an object we cannot fingerprint): its graph is not
    indexed, so every process lowers it afresh."""


# Code a version or hash in the key already identifies: torch_tpu's own (`sources()`) and these libraries.
_VERSIONED = frozenset({"jax", "jaxlib", "numpy", "torch", "ml_dtypes", "builtins", "math", "operator", "functools"})
_SIMPLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, np.dtype, type(Ellipsis))


def _versioned(module: str | None) -> bool:
    root = (module or "").partition(".")[0]
    return root == "torch_tpu" or root in _VERSIONED or (root.startswith("_") and root in sys.builtin_module_names)


def _code_content(code: types.CodeType, scope: dict[str, Any], seen: set[int]) -> str:
    consts = [_code_content(c, scope, seen) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    names = [f"{name}={_content(scope[name], seen)}" for name in code.co_names if name in scope]
    return f"code({code.co_code.hex()};{consts};{code.co_names};{names})"


def _content(value: Any, seen: set[int]) -> str:
    """What a lowering computes, as text: its code recursively (bytecode, constants, defaults, closure values and
    the globals it names), down to code identified by a version (`_versioned`). Raises `Unidentified`."""
    if isinstance(value, _SIMPLE):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_content(v, seen) for v in value]
        return f"{type(value).__name__}({','.join(sorted(items) if isinstance(value, (set, frozenset)) else items)})"
    if isinstance(value, dict):
        return "dict(" + ",".join(sorted(f"{_content(k, seen)}:{_content(v, seen)}" for k, v in value.items())) + ")"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", getattr(value, "__name__", type(value).__name__))
    if isinstance(value, types.FunctionType):
        if _versioned(module):
            return f"function:{module}.{name}"
        if id(value) in seen:  # recursion
            return f"recursive:{module}.{name}"
        seen.add(id(value))
        closure = [_content(cell.cell_contents, seen) for cell in value.__closure__ or ()]
        defaults = _content((value.__defaults__, value.__kwdefaults__), seen)
        return f"function({_code_content(value.__code__, value.__globals__, seen)};{closure};{defaults})"
    if isinstance(value, functools.partial):
        return f"partial({_content((value.func, value.args, value.keywords), seen)})"
    if hasattr(value, "__wrapped__"):  # jax.jit, functools.wraps
        return f"wrapped:{type(value).__qualname__}({_content(value.__wrapped__, seen)})"
    if isinstance(value, (np.ndarray, jax.Array)):
        data = np.asarray(value)
        return f"array:{data.dtype}{data.shape}:{hashlib.sha256(data.tobytes()).hexdigest()}"
    if isinstance(value, torch.Tensor):
        return f"tensor:{_constant_token(value)}"
    if callable(value) and _versioned(
        module if isinstance(value, (type, types.BuiltinFunctionType)) else type(value).__module__
    ):
        return f"{type(value).__module__}.{type(value).__qualname__}:{module}.{name}"  # e.g. a jnp ufunc
    raise Unidentified(f"{type(value).__qualname__} {name}")


def _lowering_token(target: Any) -> str:
    lowering = graph_lowering(target) if isinstance(target, OpOverload) else None
    if lowering is None:
        return ""
    return f"{_content(lowering.fn, set())}:{sorted(lowering.static)}:{lowering.rng}"


def graph_fingerprint(gm: torch.fx.GraphModule) -> str | None:
    """What of an ATen graph its lowering depends on: the code of it and of its subgraphs, every node's
    FakeTensor value (dtype, shape, device) and lowering (its content, `_content`: a lowering may be registered
    or changed by the user; torch_tpu's own code is in `sources()`), and the values of the constants it reads.
    None when a lowering's content cannot be identified."""
    digest = hashlib.sha256()
    tokens: dict[Any, str] = {}
    try:
        for name, module in gm.named_modules():
            if isinstance(module, torch.fx.GraphModule):
                digest.update(f"{name}\n{module.code}\n".encode())
                for node in module.graph.nodes:
                    if node.target not in tokens:
                        tokens[node.target] = _lowering_token(node.target)
                    digest.update(f"{node.name}:{_value_token(node.meta.get('val'))}:{tokens[node.target]}\n".encode())
                    if node.op == "get_attr":
                        digest.update(_constant_token(getattr(module, node.target)).encode())
    except Unidentified:
        return None
    return digest.hexdigest()


def _input_token(value: Any) -> str:
    """An input as the program sees it: an array (the RNG key's numpy one too, and the abstract value a graph
    compiled ahead is lowered for) by its shape and dtype, not its value; a compiled-in size by its value."""
    if isinstance(value, (jax.Array, jax.ShapeDtypeStruct, np.ndarray)):
        weak = getattr(value, "weak_type", False)
        return f"{np.dtype(value.dtype)}{tuple(value.shape)}w{int(weak)}"
    return f"{type(value).__name__}:{value!r}"


def graph_key(fingerprint: str, inputs: Sequence[Any]) -> str:
    """The index key of a graph called with `inputs` (jax values, the RNG key first, and compiled-in sizes)
    under the precision, XLA options and JAX flags in force now."""
    text = "\n".join(
        [
            "graph",
            cache.environment(),
            sources(),
            fingerprint,
            repr(trace_context.cache_token()),
            repr(sorted(precision.compiler_options().items())),
            repr(sorted(jax.config.values.items())),
            ";".join(_input_token(value) for value in inputs),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _index_path(key: str) -> pathlib.Path:
    return cache.root() / "graphs" / key[:2] / f"{key}.idx"


def load(key: str) -> tuple[Any, dict[int, int]] | None:
    """The executable a graph compiled to and the sizes its lowering returned, if an earlier process stored
    them under `key` and the executable is still on disk."""
    record = cache.read_entry(_index_path(key))
    if record is not None:
        program, sizes = record
        executable = cache.load(program)
        if executable is not None:
            cache.stats.graph_hits += 1
            cache.stats.hits += 1
            return executable, sizes
    cache.stats.graph_misses += 1
    return None


def store(key: str, program: str | None, sizes: dict[int, int]) -> None:
    """Record that the graph under `key` compiled to the executable stored under `program`."""
    if program is not None and cache.write_entry(_index_path(key), (program, sizes)):
        cache.stats.graph_writes += 1


_fingerprints: weakref.WeakKeyDictionary[torch.fx.GraphModule, str | None] = weakref.WeakKeyDictionary()


def executable(
    gm: torch.fx.GraphModule,
    traced_sizes: dict[tuple, dict[int, int]],
    values: Sequence[Any],
    lower: Callable[[], jax.stages.Lowered],
    usable: bool = True,
) -> tuple[Any, bool]:
    """The executable of `gm` called with `values` (the RNG key, then the inputs; ints are compiled-in sizes),
    and whether it came from disk: through the index when an earlier process recorded it, else `lower()` then
    the StableHLO-keyed tier, recording the result. `traced_sizes` is the lowering's record of the sizes it
    returned (`graph.to_jax`), filled from the index on a hit. `usable=False` (a debug callback) skips the
    index, so that the lowering runs."""
    key, static, compiled = from_index(gm, traced_sizes, values, usable)
    if compiled is not None:
        return compiled, True
    return compile_indexed(key, static, traced_sizes, lower)


def executable_soon(
    gm: torch.fx.GraphModule,
    traced_sizes: dict[tuple, dict[int, int]],
    values: Sequence[Any],
    lower: Callable[[], jax.stages.Lowered],
    pool: Executor,
) -> cache.Soon:
    """`executable` with XLA's compile on `pool` (`compile.ahead`): the index and the disk are read, the graph
    lowered and its index entry written now, on the caller's thread; the program is stored once compiled, called
    or not."""
    key, static, compiled = from_index(gm, traced_sizes, values)
    if compiled is not None:
        return cache.Soon(None, None, compiled)
    return compile_indexed_soon(key, static, traced_sizes, lower, pool)


def from_index(
    gm: torch.fx.GraphModule, traced_sizes: dict[tuple, dict[int, int]], values: Sequence[Any], usable: bool = True
) -> tuple[str | None, tuple, Any]:
    """`gm`'s index key for a call with `values` (None: not indexed), its compiled-in sizes, and the executable an
    earlier process recorded under that key, its traced sizes put in `traced_sizes` (None: not recorded)."""
    key = _index_key(gm, values) if usable else None
    static = tuple(value for value in values if isinstance(value, int))
    loaded = load(key) if key is not None else None
    if loaded is None:
        return key, static, None
    compiled, traced_sizes[static] = loaded
    return key, static, compiled


def compile_indexed(
    key: str | None, static: tuple, traced_sizes: dict[tuple, dict[int, int]], lower: Callable[[], jax.stages.Lowered]
) -> tuple[Any, bool]:
    """The program `lower()` gives, compiled or loaded from the StableHLO-keyed tier (then True), and recorded in
    the index under `key` (`from_index`'s, after a miss)."""
    if key is None:
        return cache.compile_lowered(lower())
    compiled, from_disk, program = cache.compile_keyed(lower())
    store(key, program, traced_sizes.get(static, {}))
    return compiled, from_disk


def compile_indexed_soon(
    key: str | None,
    static: tuple,
    traced_sizes: dict[tuple, dict[int, int]],
    lower: Callable[[], jax.stages.Lowered],
    pool: Executor,
) -> cache.Soon:
    """`compile_indexed` with XLA's compile on `pool`: lowered and recorded now, stored once compiled."""
    soon = cache.compile_soon(lower(), pool)
    soon.store_when_compiled()
    if key is not None:
        store(key, soon.key, traced_sizes.get(static, {}))
    return soon


def _index_key(gm: torch.fx.GraphModule, values: Sequence[Any]) -> str | None:
    """`gm`'s key in the graph index for a call with `values` (None: the index is off, or a lowering of the graph
    cannot be identified, so that it is lowered in every process)."""
    if not enabled():
        return None
    if gm not in _fingerprints:
        _fingerprints[gm] = graph_fingerprint(gm)
    fingerprint = _fingerprints[gm]
    return None if fingerprint is None else graph_key(fingerprint, values)
