"""An ATen FX graph replayed through the lowering registry into one JAX function.

The same lowerings as eager run here; each node's output is cast to the dtype its FakeTensor value says,
exactly as eager casts to its meta kernel's dtype. Random ops get keys folded from one key input, so a
compiled graph draws from the device RNG stream like eager does.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import jax
import torch
from torch._ops import OpOverload
from torch.fx.node import map_aggregate

from torch_tpu import precision
from torch_tpu.ops.random import threefry_key
from torch_tpu.ops.registry import graph_lowering
from torch_tpu.runtime import checks, dtypes, float64, platform

aten = torch.ops.aten


class UnsupportedOp(NotImplementedError):
    """An op in a compiled graph that has no lowering; names the op and the user's source line."""


def user_line(node: torch.fx.Node) -> str:
    """`File "...", line N, in f: code` of the innermost user frame that produced `node`."""
    lines = [line.strip() for line in (node.meta.get("stack_trace") or "").splitlines()]
    frames = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not frames:
        return "(no source line recorded)"
    last = frames[-1]
    code = lines[last + 1] if last + 1 < len(lines) else ""
    return f"{lines[last]}: {code}"


def _out_dtypes(node: torch.fx.Node) -> Any:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return dtypes.to_jax(value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(dtypes.to_jax(v.dtype) if isinstance(v, torch.Tensor) else None for v in value)
    return None


def _cast(result: Any, out_dtypes: Any) -> Any:
    if out_dtypes is None or result is None:
        return result
    if isinstance(out_dtypes, tuple):
        return type(result)(_cast(r, d) for r, d in zip(result, out_dtypes, strict=False))
    return result if getattr(result, "dtype", out_dtypes) == out_dtypes else result.astype(out_dtypes)


# Size queries: with dynamic dimensions, sizes are Python ints at run time (each size compiles its own program).
_SIZES = {
    aten.sym_size.int: lambda tensor, dim: tensor.shape[dim],
    aten.sym_numel.default: lambda tensor: tensor.size,
    aten.sym_storage_offset.default: lambda tensor: 0,
}


def check_supported(gm: torch.fx.GraphModule) -> None:
    """Raise `UnsupportedOp` for the first node with no lowering, before anything is traced or run."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, OpOverload):
            if node.target is aten.copy_.default or node.target in _SIZES:
                continue
            float64.check(str(node.target), _node_dtypes(node))
            lowering = graph_lowering(node.target)
            if lowering is None:
                raise UnsupportedOp(
                    f"torch_tpu: '{node.target}' has no tpu lowering (in a torch.compile graph), "
                    f"from: {user_line(node)}"
                )
            if not lowering.jit and not _traceable(lowering, node):
                raise UnsupportedOp(
                    f"torch_tpu: '{node.target}' has a data-dependent output shape and cannot be compiled, "
                    f"from: {user_line(node)}"
                )


def _node_dtypes(node: torch.fx.Node) -> list:
    """The 64-bit JAX dtypes among those of a node's tensor inputs and outputs that the float64 policy counts
    (`float64.counted`, as in eager)."""
    flat = lambda value: list(value) if isinstance(value, (list, tuple)) else [value]
    inputs = [t for a in node.all_input_nodes for t in flat(a.meta.get("val")) if isinstance(t, torch.Tensor)]
    outputs = [t.dtype for t in flat(node.meta.get("val")) if isinstance(t, torch.Tensor)]
    return [dtypes.to_jax(d) for d in float64.counted(inputs, outputs) if d in dtypes.SIXTY_FOUR_BIT]


class _DataDependent(Exception):
    """A size with no value while compiling (an unbacked size: it depends on data)."""


def _hint(size: Any) -> Any:
    if not isinstance(size, torch.SymInt):
        return size
    if size.node.hint is None:
        raise _DataDependent
    return size.node.hint


def _abstract(value: Any) -> Any:
    """A node's FakeTensor value as what the lowering sees while tracing (sizes at their current hints)."""
    if isinstance(value, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(_hint(s) for s in value.shape), dtypes.to_jax(value.dtype))
    return _hint(value)


def _traceable(lowering: Any, node: torch.fx.Node) -> bool:
    """Whether a lowering that eager runs unjitted (`jit=False`: it may read values to find its output shape)
    traces at this node's argument types, as `aten.index.Tensor` does for integer indices (only boolean masks
    make its shape data-dependent). Tried on abstract values, so nothing runs."""
    platform.devices()  # x64 first: int64 arguments stay int64
    arrays: list[jax.ShapeDtypeStruct] = []
    try:
        map_aggregate(node.meta.get("val"), _abstract)  # its own sizes must be known
    except _DataDependent:
        return False

    def abstract(arg: Any) -> Any:
        value = _abstract(arg.meta.get("val")) if isinstance(arg, torch.fx.Node) else arg
        if isinstance(value, jax.ShapeDtypeStruct):
            arrays.append(value)
            return _Slot(len(arrays) - 1)
        return value

    try:
        args, kwargs = map_aggregate((node.args, node.kwargs), abstract)
    except _DataDependent:
        return False

    def call(*traced: Any) -> Any:
        fill = lambda a: traced[a.index] if isinstance(a, _Slot) else a
        return lowering.fn(*map_aggregate(args, fill), **map_aggregate(kwargs, fill))

    try:
        jax.eval_shape(checks.collecting(call), *arrays)  # its device-side checks stay in this trace
    except (jax.errors.ConcretizationTypeError, jax.errors.NonConcreteBooleanIndexError):
        return False
    return True


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where an array argument goes back into a node's arguments."""

    index: int


class Replay:
    """The graph as a JAX function, `replay(key, *inputs) -> outputs` (a `Checked` output when its trace made
    device-side checks: `checks.take` unpacks it), with what its caller puts back into the outputs it returns as
    None:

    `sizes[static size inputs][position]`: the outputs that are sizes (Python ints, known while tracing), as the
    trace under those static inputs found them;
    `passthrough[position]`: the input index of an output that is an input the graph does not write, returned as
    it is: an opaque input (`opaque_inputs`: a DTensor's DeviceMesh, which AOTAutograd passes beside its local
    tensor; opaque inputs are not arguments of the function, no op reads them), or a tensor, such as a weight a
    forward graph saves for its backward, which the program would otherwise copy into a new buffer (as Inductor's
    code, the caller's tensor is returned).
    """

    def __init__(self, trace: Callable[..., tuple], passthrough: dict[int, int]) -> None:
        self._trace = trace
        self.passthrough = passthrough
        self.sizes: dict[tuple[int, ...], dict[int, int]] = {}
        self._collected = checks.collecting(self._replay)
        self.__name__ = self.__qualname__ = "replay"  # jax.jit names the program after it

    def _replay(self, key: jax.Array, *inputs: Any) -> tuple:
        with precision.tracing():
            outputs = self._trace(key, *inputs)
        static = tuple(value for value in inputs if isinstance(value, int))
        self.sizes[static] = {i: value for i, value in enumerate(outputs) if isinstance(value, int)}
        return tuple(None if isinstance(value, int) else value for value in outputs)

    def __call__(self, key: jax.Array, *inputs: Any) -> Any:
        return self._collected(key, *inputs)


def to_jax(gm: torch.fx.GraphModule, program_returns_inputs: bool = False) -> tuple[Replay, list[tuple[int, int]]]:
    """The graph as a `Replay` (`replay(key, *inputs) -> outputs`), and the (input index, output index) pairs of
    the input mutations (`aten.copy_` into a placeholder) that the caller must write back; their values are
    appended to the outputs. With `program_returns_inputs` (an exported program, which runs without our caller),
    an output that is a tensor input is the program's, not a passthrough."""
    check_supported(gm)
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    opaque = set(opaque_inputs(gm))
    arguments = [p for i, p in enumerate(placeholders) if i not in opaque]
    copies = [n for n in nodes if n.op == "call_function" and n.target is aten.copy_.default]
    mutated = list(dict.fromkeys(n.args[0] for n in copies))
    output_node = next(n for n in nodes if n.op == "output")
    n_outputs = len(output_node.args[0])
    mutations = [(placeholders.index(p), n_outputs + i) for i, p in enumerate(mutated)]

    def trace(key: jax.Array, *inputs: Any) -> tuple:
        """Every output, sizes included, then the mutated inputs' new values."""
        env: dict[torch.fx.Node, Any] = dict(zip(arguments, inputs, strict=True))
        env.update((placeholders[i], None) for i in opaque)
        written: dict[torch.fx.Node, Any] = {}
        draws = 0
        for node in nodes:
            if node.op != "call_function":
                if node.op == "get_attr":
                    env[node] = _constant(getattr(gm, node.target))
                continue
            args = map_aggregate(node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
            kwargs = map_aggregate(node.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
            target = node.target
            if target is operator.getitem:
                env[node] = args[0][args[1]]
                continue
            if target in _SIZES:
                env[node] = _SIZES[target](*args, **kwargs)
                continue
            if not isinstance(target, OpOverload):  # Python arithmetic on sizes (operator.mul, sym_max, ...)
                env[node] = target(*args, **kwargs)
                continue
            if target is aten.copy_.default:  # (None: a `writes=` lowering left the input as it is)
                value = args[0] if args[1] is None else jax.numpy.broadcast_to(args[1], args[0].shape)
                value = value.astype(args[0].dtype)
                written[node.args[0]] = env[node] = value
                continue
            lowering = graph_lowering(target)
            if lowering.rng:
                kwargs = dict(kwargs, key=jax.random.key_data(jax.random.fold_in(threefry_key(key), draws)))
                draws += 1
            with jax.named_scope(str(target)):
                env[node] = _cast(lowering.fn(*args, **kwargs), _out_dtypes(node))
        outputs = map_aggregate(output_node.args[0], lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        outputs = [None if position in passthrough else value for position, value in enumerate(outputs)]
        return tuple(outputs) + tuple(written[p] for p in mutated)

    passthrough = {
        position: placeholders.index(node)
        for position, node in enumerate(output_node.args[0])
        if isinstance(node, torch.fx.Node)
        and node.op == "placeholder"
        and (placeholders.index(node) in opaque or (not program_returns_inputs and _unwritten_tensor(node, mutated)))
    }
    return Replay(trace, passthrough), mutations


def _unwritten_tensor(node: torch.fx.Node, mutated: list[torch.fx.Node]) -> bool:
    """Whether the placeholder `node` is a tensor the graph does not write (its output is the input as it is)."""
    return isinstance(node.meta.get("val"), torch.Tensor) and node not in mutated


def opaque_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """The positions of the graph's inputs that are opaque objects (neither tensors nor numbers)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [
        i
        for i, node in enumerate(placeholders)
        if not isinstance(node.meta.get("val"), (torch.Tensor, torch.SymInt, torch.SymFloat, int, float, bool))
        and "val" in node.meta
    ]


def _constant(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        from torch_tpu.runtime import storage

        return storage.value(value) if value.device.type == "tpu" else storage.to_device(value)
    return value
