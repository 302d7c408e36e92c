"""The one registry of ATen -> JAX lowerings, used by every eager mode and by the compiler.

A lowering is a pure function of jax.Arrays (and static Python values) registered for the *functional*
overloads it implements with `@lower(aten.x.y, ...)`. In-place (`x_`) and `out=` variants are derived from
the functional op's schema; they are never written by hand. An op that updates other arguments in place
(batch norm's running statistics) is lowered as its functional form, whose trailing outputs are those arguments'
new values, with `writes=` naming them: the mutating overload is found from the schemas' alias info, and eager
writes the values into its arguments (compiled graphs see the functional form already); a None value (per tensor)
leaves its argument as it is, so that eager neither copies nor writes it. `eager_dtypes=` gives an eager kernel's
output dtypes where PyTorch's CPU kernel and its meta kernel disagree (the executable casts to them).
`@kernel` registers a direct torch kernel for the minimal tier (views, copies, scalars) that must not go through
JAX tracing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
from torch._ops import OpOverload

from torch_tpu.ops import emulated
from torch_tpu.runtime import compat

aten = compat.aten  # torch.ops.aten, where an op this torch lacks registers nothing


@dataclasses.dataclass(frozen=True)
class Lowering:
    """How one functional ATen overload runs on JAX.

    `static` names Scalar arguments that shape the program (e.g. `arange`'s end) and so are compiled in
    rather than passed at run time, and `scalars` the `float` arguments passed at run time instead of compiled in
    (an optimizer's learning rate, which a schedule changes every step); `rng` lowerings receive a PRNG key as the
    keyword `key`; `jit=False` marks ops whose output shape depends on data (`nonzero`), run op by op outside
    `jax.jit`. `writes` names the
    arguments `mutating` (the overload updating them in place) writes: `fn`'s trailing outputs, in that order.
    `eager_dtypes(dtypes, *args, **kwargs)` gives an eager kernel's output dtypes (JAX's) from the meta kernel's,
    where CPU's differ (saved statistics); its executable computes them, with no cast of its own after it.
    `checks_empty` lowerings run, for their device-side checks, even when every output is empty (CPU validates
    the op's indices then too); eager skips the others then (so they need not handle zero sizes). `donate` names
    tensor arguments whose buffers eager's executable may reuse for its outputs (`jax.jit`'s `donate_argnums`; the
    caller then treats those tensors as consumed: `kernels.jax_op`).
    """

    op: OpOverload
    fn: Callable
    static: frozenset[str] = frozenset()
    scalars: frozenset[str] = frozenset()
    rng: bool = False
    jit: bool = True
    writes: tuple[str, ...] = ()
    mutating: OpOverload | None = None
    eager_dtypes: Callable | None = None
    checks_empty: bool = False
    donate: frozenset[str] = frozenset()


LOWERINGS: dict[OpOverload, Lowering] = {}
KERNELS: dict[OpOverload, Callable] = {}
# Lowerings only the graph compiler uses: views, allocation and copies, which eager runs as direct kernels
# (a view must share storage in eager; in a functional graph it is just a value).
GRAPH_LOWERINGS: dict[OpOverload, Lowering] = {}


def _check_new(op: OpOverload, composite: bool = False) -> None:
    if not isinstance(op, OpOverload):
        raise TypeError(f"torch_tpu: register an OpOverload such as aten.add.Tensor, not {op!r}")
    if op in LOWERINGS or op in KERNELS:
        raise ValueError(f"torch_tpu: {op} is registered twice")
    if not composite and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        raise ValueError(f"torch_tpu: {op} is CompositeImplicitAutograd; lower the ops it decomposes into")


def lower(
    *ops: OpOverload,
    static: Iterable[str] = (),
    scalars: Iterable[str] = (),
    rng: bool = False,
    jit: bool = True,
    writes: Iterable[str] = (),
    eager_dtypes: Callable | None = None,
    checks_empty: bool = False,
    composite: bool = False,
    donate: Iterable[str] = (),
) -> Callable[[Callable], Callable]:
    """Register `fn` as the JAX lowering of functional overloads `ops`; with `writes`, also of the overload of each
    that updates those arguments in place (`mutating_variant`). `composite` lowers a CompositeImplicitAutograd op
    whole, in place of its decomposition: only for an op without gradients (its autograd formula is the
    decomposition's) whose decomposition on a device skips CPU's checks (one_hot's)."""
    writes = tuple(writes)

    def register(fn: Callable) -> Callable:
        pointwise = emulated.lifted(fn)  # a single float64 value on the TPU, among copies (ops/emulated.py)
        for op in compat.present(ops):
            _check_new(op, composite)
            mutating = mutating_variant(op, writes) if writes else None
            if mutating is not None:
                _check_new(mutating)
            statics, runtime = frozenset(static), frozenset(scalars)
            lowered = pointwise if torch.Tag.pointwise in op.tags else fn
            LOWERINGS[op] = Lowering(
                op, lowered, statics, runtime, rng, jit, writes, mutating, eager_dtypes, checks_empty, frozenset(donate)
            )
        return fn

    return register


def lower_in_graphs(*ops: OpOverload, rng: bool = False) -> Callable[[Callable], Callable]:
    """Register `fn` as the JAX lowering of `ops` inside compiled graphs only (see GRAPH_LOWERINGS)."""

    def register(fn: Callable) -> Callable:
        for op in compat.present(ops):
            if op in GRAPH_LOWERINGS or op in LOWERINGS:
                raise ValueError(f"torch_tpu: {op} is registered twice")
            GRAPH_LOWERINGS[op] = Lowering(op, fn, rng=rng)
        return fn

    return register


def graph_lowering(op: OpOverload) -> Lowering | None:
    """The lowering the compiler uses for `op`: the shared one, else a graph-only one."""
    return LOWERINGS.get(op) or GRAPH_LOWERINGS.get(op)


def kernel(*ops: OpOverload) -> Callable[[Callable], Callable]:
    """Register `fn` as the direct PrivateUse1 kernel of `ops` (minimal tier: no JAX tracing)."""

    def register(fn: Callable) -> Callable:
        for op in compat.present(ops):
            _check_new(op)
            KERNELS[op] = fn
        return fn

    return register


def mutated_args(op: OpOverload) -> list[torch._C.Argument]:
    """The arguments `op` writes to, in schema order."""
    return [a for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _signature(op: OpOverload) -> tuple[tuple[str, str], ...]:
    return tuple(
        (a.name, str(a.type))
        for a in op._schema.arguments
        if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)
    )


def inplace_variant(op: OpOverload) -> OpOverload | None:
    """The `aten.x_` overload with functional `op`'s arguments that mutates only `self`, if any."""
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1] + "_", None)
    if packet is None:
        return None
    signature = [(a.name, str(a.type)) for a in op._schema.arguments[1:]]
    for name in packet.overloads():
        candidate = getattr(packet, name)
        writes = mutated_args(candidate)
        if len(writes) == 1 and writes[0].name == "self":
            if [(a.name, str(a.type)) for a in candidate._schema.arguments[1:]] == signature:
                return candidate
    return None


def mutating_variant(op: OpOverload, writes: tuple[str, ...]) -> OpOverload:
    """The overload that is functional `op` updating the arguments `writes` in place: named `op`'s name without
    `_functional` or with `_`, with `op`'s arguments, mutating exactly `writes` (per its schema's alias info) and
    returning `op`'s results but the trailing ones, which are the new values of `writes`."""
    name = op._schema.name.split("::")[1]
    arguments = [(a.name, str(a.type)) for a in op._schema.arguments]
    for packet_name in (name.removesuffix("_functional"), name + "_"):
        packet = getattr(torch.ops.aten, packet_name, None) if packet_name != name else None
        for overload in packet.overloads() if packet is not None else ():
            candidate = getattr(packet, overload)
            if tuple(a.name for a in mutated_args(candidate)) != writes:
                continue
            if [(a.name, str(a.type)) for a in candidate._schema.arguments] != arguments:
                continue
            if len(candidate._schema.returns) + len(writes) == len(op._schema.returns):
                return candidate
    raise ValueError(f"torch_tpu: no overload of {op} updates {writes} in place")


def out_variant(op: OpOverload) -> OpOverload | None:
    """The `out=` overload whose non-out arguments equal those of functional `op`."""
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1])
    signature = _signature(op)
    for name in packet.overloads():
        candidate = getattr(packet, name)
        writes = mutated_args(candidate)
        if candidate is op or not writes or not all(a.kwarg_only for a in writes):
            continue
        if _signature(candidate) == signature:
            return candidate
    return None
