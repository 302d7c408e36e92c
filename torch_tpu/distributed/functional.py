"""Functional collectives (`torch.distributed._functional_collectives`, the `_c10d_functional::*` ops) on tpu.

Each op is a lowering like any other, registered in the one registry (`ops.registry.lower_in_graphs`): a JAX
function of this rank's array that calls the collective (`psum`, `all_gather`, `psum_scatter`, `all_to_all`)
over the group's axis of the program's mesh (`tracing`: a group's 1-D mesh, or one axis per dimension of the
DeviceMesh whose dimensions the groups are). It runs where a program is SPMD over that mesh (`distributed.spmd`):
a compiled graph holding collectives, a Fused-mode cluster recorded under `spmd_safe`, or, alone, an eager call.
`wait_tensor` is the identity: a collective's value is ready when its program has run.

In eager mode (`distributed.eager_functional` installs the kernels) each collective runs alone, so ranks whose
code diverges fail on that collective instead of deadlocking inside a larger program; under `spmd_safe` the
caller promises every rank records the same ops, and Fused mode then records collectives into its cluster.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.distributed as dist

from torch_tpu.distributed.collectives import AXIS, BOOL_OPS, FOLDS, reduce
from torch_tpu.ops.registry import lower_in_graphs

ops = torch.ops._c10d_functional
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
REDUCE_OPS = ("sum", "avg", "max", "min", *FOLDS)


def group_name(group: Any) -> str:
    """A collective's group argument as its name (graphs carry the name; eager callers may pass the group)."""
    return group if isinstance(group, str) else dist.ProcessGroup.unbox(group).group_name


def group_ranks(name: str) -> tuple[int, ...]:
    """The global ranks of the group called `name` now, in group-rank order: resolved at each call (two lookups),
    since a name is reused by the next job's groups after `destroy_process_group()` and a new one."""
    return tuple(dist.get_process_group_ranks(dist.distributed_c10d._resolve_process_group(name)))


Axis = str | tuple[str, ...]


class _Tracing(threading.local):
    """Inside the SPMD program being traced on this thread: each group's ranks (in group-rank order) and the mesh
    axis (or axes, major first) its collectives run over. None: not inside one."""

    axes: dict[tuple[int, ...], Axis] | None = None


tracing = _Tracing()


def _axis(group: Any, collective: str) -> tuple[int, Axis]:
    """The group's size and its axis in the mesh of the program being traced (a one-rank group needs none)."""
    ranks = group_ranks(group_name(group))
    if len(ranks) == 1:
        return 1, AXIS
    axis = None if tracing.axes is None else tracing.axes.get(ranks)
    if axis is None:
        where = "outside an SPMD program" if tracing.axes is None else f"in a program over groups {list(tracing.axes)}"
        raise NotImplementedError(
            f"torch_tpu: {collective} over ranks {ranks} traced {where}; the collectives of one compiled graph or "
            f"fused cluster must be over groups that are dimensions of its mesh"
        )
    return len(ranks), axis


def _op(reduce_op: str, dtype: Any, collective: str) -> str:
    op = reduce_op.lower()
    if op not in REDUCE_OPS:
        raise NotImplementedError(f"torch_tpu: {collective} does not support reduce_op {reduce_op!r}")
    floating = jnp.issubdtype(dtype, jnp.inexact)
    if op in ("band", "bor", "bxor") and floating:
        raise RuntimeError(f"torch_tpu: {collective} with reduce_op {op!r} needs an integer or bool dtype, got {dtype}")
    if op == "avg" and not floating:
        raise RuntimeError(f"torch_tpu: {collective} with reduce_op 'avg' needs a floating dtype, got {dtype}")
    return BOOL_OPS[op] if dtype == jnp.bool_ else op


def _reduced(block: jax.Array, reduce_op: str, size: int, axis: Axis, collective: str) -> jax.Array:
    op = _op(reduce_op, block.dtype, collective)
    if block.dtype == jnp.bool_:  # a logical or/and as the maximum/minimum of bytes
        return reduce(block.astype(jnp.uint8), op, size, axis).astype(jnp.bool_)
    return reduce(block, op, size, axis)


@lower_in_graphs(ops.all_reduce.default)
def all_reduce(input: jax.Array, reduce_op: str, group: Any) -> jax.Array:
    return _reduced(input, reduce_op, *_axis(group, "all_reduce"), "all_reduce")


@lower_in_graphs(ops.all_reduce_coalesced.default)
def all_reduce_coalesced(inputs: list[jax.Array], reduce_op: str, group: Any) -> list[jax.Array]:
    return [all_reduce(x, reduce_op, group) for x in inputs]


def _check_group_size(group_size: int, group: Any, collective: str) -> tuple[int, Axis]:
    size, axis = _axis(group, collective)
    if group_size != size:
        raise ValueError(f"torch_tpu: {collective} got group_size={group_size} for a group of {size} ranks")
    return size, axis


@lower_in_graphs(ops.all_gather_into_tensor.default)
def all_gather_into_tensor(input: jax.Array, group_size: int, group: Any) -> jax.Array:
    """Every rank's input concatenated along dim 0 in group-rank order."""
    size, axis = _check_group_size(group_size, group, "all_gather_into_tensor")
    if size == 1:
        return input
    if input.ndim == 0:
        return jax.lax.all_gather(input, axis)
    return jax.lax.all_gather(input, axis, tiled=True)


@lower_in_graphs(ops.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(inputs: list[jax.Array], group_size: int, group: Any) -> list[jax.Array]:
    return [all_gather_into_tensor(x, group_size, group) for x in inputs]


@lower_in_graphs(ops.reduce_scatter_tensor.default)
def reduce_scatter_tensor(input: jax.Array, reduce_op: str, group_size: int, group: Any) -> jax.Array:
    """Rank r's result: block r (of dim 0 split in group_size) of every rank's input, reduced."""
    size, axis = _check_group_size(group_size, group, "reduce_scatter_tensor")
    if input.ndim == 0 or input.shape[0] % size:
        raise ValueError(
            f"torch_tpu: reduce_scatter_tensor input dim 0 ({input.shape[:1]}) is not divisible by {size} ranks"
        )
    op = _op(reduce_op, input.dtype, "reduce_scatter_tensor")
    if size == 1:
        return input
    if op == "sum" and input.dtype != jnp.bool_:
        return jax.lax.psum_scatter(input, axis, tiled=True)
    reduced = _reduced(input, reduce_op, size, axis, "reduce_scatter_tensor")
    rows = input.shape[0] // size
    return jax.lax.dynamic_slice_in_dim(reduced, jax.lax.axis_index(axis) * rows, rows)


@lower_in_graphs(ops.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(
    inputs: list[jax.Array], reduce_op: str, group_size: int, group: Any
) -> list[jax.Array]:
    return [reduce_scatter_tensor(x, reduce_op, group_size, group) for x in inputs]


def uneven_splits(shape: tuple[int, ...], output_split_sizes: Any, input_split_sizes: Any, size: int) -> str | None:
    """Why an all_to_all_single of an input of `shape` cannot be in a compiled program (None: it can). Uneven
    splits are each rank's own compile-time sizes (and in general its own shapes), so ranks would compile
    different programs where one SPMD program is needed; eager runs them (torch's kernel)."""
    rows = shape[0] // size if shape else 0
    even = [rows] * size
    uneven = not shape or shape[0] % size or list(input_split_sizes or even) != even
    if not uneven and list(output_split_sizes or even) == even:
        return None
    return (
        f"torch_tpu: all_to_all_single with input splits {list(input_split_sizes or [])} and output splits "
        f"{list(output_split_sizes or [])} of dim 0 ({list(shape[:1])}) in a compiled program: only even splits "
        f"over {size} ranks are supported (uneven splits differ per rank, and all ranks run one SPMD program); "
        "run this call eagerly, e.g. in a function under torch.compiler.disable"
    )


@lower_in_graphs(ops.all_to_all_single.default)
def all_to_all_single(
    input: jax.Array,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group: Any,
) -> jax.Array:
    """Block j of dim 0 goes to rank j; blocks must be even (`uneven_splits`)."""
    size, axis = _axis(group, "all_to_all_single")
    problem = uneven_splits(tuple(input.shape), output_split_sizes, input_split_sizes, size)
    if problem is not None:
        raise NotImplementedError(problem)
    if size == 1:
        return input
    return jax.lax.all_to_all(input, axis, split_axis=0, concat_axis=0, tiled=True)


@lower_in_graphs(ops.broadcast.default)
def broadcast(input: jax.Array, src: int, group: Any) -> jax.Array:
    """Group rank `src`'s input on every rank, bit for bit: a psum of its bits, every other rank adding zeros."""
    size, axis = _axis(group, "broadcast")
    if not 0 <= src < size:
        raise ValueError(f"torch_tpu: broadcast from group rank {src} of a group of {size} ranks")
    if size == 1:
        return input
    unsigned = _UNSIGNED.get(input.dtype.itemsize)
    if unsigned is None or jnp.issubdtype(input.dtype, jnp.complexfloating) or input.dtype == jnp.bool_:
        return jax.lax.all_gather(input, axis)[src]
    bits = jax.lax.bitcast_convert_type(input, unsigned)
    mine = jax.lax.axis_index(axis) == src
    summed = jax.lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), axis)
    return jax.lax.bitcast_convert_type(summed, input.dtype)


@lower_in_graphs(ops.wait_tensor.default)
def wait_tensor(tensor: jax.Array) -> jax.Array:
    """The identity: inside one program a collective's value is ready where it is used."""
    return tensor


COLLECTIVES = {
    ops.all_reduce.default: "all_reduce",
    ops.all_reduce_coalesced.default: "all_reduce_coalesced",
    ops.all_gather_into_tensor.default: "all_gather_into_tensor",
    ops.all_gather_into_tensor_coalesced.default: "all_gather_into_tensor_coalesced",
    ops.reduce_scatter_tensor.default: "reduce_scatter_tensor",
    ops.reduce_scatter_tensor_coalesced.default: "reduce_scatter_tensor_coalesced",
    ops.all_to_all_single.default: "all_to_all_single",
    ops.broadcast.default: "broadcast",
}
"""The ops that communicate, by name; their last argument is the group."""


def group_argument(op: Any, args: tuple) -> Any:
    """The group (name or object) a collective `op` is called with: its last argument."""
    return args[len(op._schema.arguments) - 1]
