"""Collectives on tpu tensors as XLA programs over a group's devices, one program per (collective, group,
shape, dtype, op), compiled once and reused.

Each process holds one device. A rank's local array becomes its shard of a global array on a 1-D mesh of the
group's devices in group-rank order (`jax.make_array_from_single_device_arrays`), a jitted `shard_map` runs the
collective (`psum`, `pmax`, `all_gather`, `psum_scatter`, `all_to_all`, ...), and the local shard of the result
is the rank's answer. On XLA:CPU the program runs synchronously in the caller.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from torch_tpu.runtime import platform

AXIS = "ranks"
# How many collective programs were built (tests check that steady state builds none).
compiles = 0

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


@functools.cache
def mesh(ranks: tuple[int, ...]) -> Mesh:
    """The 1-D mesh of the devices of global `ranks`, in that order (JAX process index == torch rank)."""
    return grid_mesh(ranks, (len(ranks),), (AXIS,))


@functools.cache
def grid_mesh(ranks: tuple[int, ...], shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    """The mesh of the devices of global `ranks` (row-major) laid out in `shape`, one axis per name (a DeviceMesh's
    rank tensor as a JAX mesh)."""
    kind = platform.devices()[0].platform
    by_process = {device.process_index: device for device in jax.devices(kind)}
    missing = [rank for rank in ranks if rank not in by_process]
    if missing:
        raise RuntimeError(f"tpu_dist: ranks {missing} have no device in the JAX job of {len(by_process)} processes")
    return Mesh(np.array([by_process[rank] for rank in ranks]).reshape(shape), names)


def _fold(values: jax.Array, combine: Callable) -> jax.Array:
    """Combine the rows of `values` in rank order, as a local loop over the ranks would."""
    result = values[0]
    for index in range(1, values.shape[0]):
        result = combine(result, values[index])
    return result


# Bool reductions run on uint8: a sum or maximum is a logical or, a product or minimum a logical and.
BOOL_OPS = {"sum": "max", "max": "max", "bor": "max", "product": "min", "min": "min", "band": "min", "bxor": "bxor"}
FOLDS = {"product": jnp.multiply, "band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}


def reduce(block: jax.Array, op: str, size: int, axis: str | tuple[str, ...] = AXIS) -> jax.Array:
    """The reduction of every rank's `block` over the `size` ranks of mesh `axis` (the same on all ranks; rank
    order for the folds, as a local loop over the ranks would). Eager programs and compiled SPMD graphs share it;
    a one-rank group's block is its own reduction (a graph over one rank is not mapped over an axis)."""
    if size == 1:
        return block
    if op == "sum":
        return jax.lax.psum(block, axis)
    if op == "avg":
        return jax.lax.psum(block, axis) / jnp.asarray(size, block.dtype)
    if op == "max":
        return jax.lax.pmax(block, axis)
    if op == "min":
        return jax.lax.pmin(block, axis)
    return _fold(jax.lax.all_gather(block, axis), FOLDS[op])


def _broadcast(block: jax.Array, root: int) -> jax.Array:
    """Root's block on every rank, bit for bit: a psum of its bits with every other rank contributing zeros."""
    mine = jax.lax.axis_index(AXIS) == root
    unsigned = _UNSIGNED.get(block.dtype.itemsize)
    if unsigned is None or jnp.issubdtype(block.dtype, jnp.complexfloating) or block.dtype == jnp.bool_:
        return jax.lax.all_gather(block, AXIS)[root]
    bits = jax.lax.bitcast_convert_type(block, unsigned)
    summed = jax.lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), AXIS)
    return jax.lax.bitcast_convert_type(summed, block.dtype)


def _body(kind: str, op: str, size: int, root: int) -> Callable[[jax.Array], jax.Array]:
    """The per-shard function: one rank's array in, its result out (the global arrays concatenate them)."""

    def body(local: jax.Array) -> jax.Array:
        if kind == "all_reduce":
            result = reduce(local, op, size)
        elif kind == "broadcast":
            result = _broadcast(local, root)
        elif kind == "all_gather":  # (size, *shape)
            result = jax.lax.all_gather(local, AXIS)
        elif kind == "reduce_scatter":  # (size * n, ...) -> (n, ...)
            reduced = reduce(local, op, size)
            rows = local.shape[0] // size
            result = jax.lax.dynamic_slice_in_dim(reduced, jax.lax.axis_index(AXIS) * rows, rows)
        elif kind == "all_to_all":  # (size * n, ...): row block j goes to rank j
            result = jax.lax.all_to_all(local, AXIS, split_axis=0, concat_axis=0, tiled=True)
        elif kind == "scatter":  # root's (size * n, ...): row block j goes to rank j
            result = jax.lax.all_to_all(local, AXIS, split_axis=0, concat_axis=0, tiled=True)
            rows = local.shape[0] // size
            result = jax.lax.dynamic_slice_in_dim(result, root * rows, rows)
        elif kind == "send":  # from position `root` of a two-rank mesh to the other
            result = jax.lax.ppermute(local, AXIS, [(root, 1 - root)])
        else:
            raise ValueError(f"tpu_dist: unknown collective {kind!r}")
        return result

    return body


_programs: dict[tuple, Callable] = {}


def program(kind: str, ranks: tuple[int, ...], shape: tuple[int, ...], dtype: np.dtype, op: str, root: int):
    """The jitted collective for this key, built once."""
    global compiles
    key = (kind, ranks, shape, dtype, op, root)
    found = _programs.get(key)
    if found is None:
        body = _body(kind, op, len(ranks), root)
        mapped = jax.shard_map(body, mesh=mesh(ranks), in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False)
        found = _programs[key] = jax.jit(mapped)
        compiles += 1
    return found


@functools.cache
def _sharding(ranks: tuple[int, ...]) -> NamedSharding:
    """Dimension 0 split over the ranks' mesh (made once: ~35 us a call otherwise, a tenth of a 4 B all_reduce)."""
    return NamedSharding(mesh(ranks), P(AXIS))


def run(kind: str, ranks: tuple[int, ...], local: jax.Array, op: str = "", root: int = 0) -> jax.Array:
    """This rank's result of collective `kind` over `ranks`, given its `local` array.

    The global array is the ranks' arrays concatenated along dimension 0, so no reshape is needed on either
    side (a 0-d array travels as shape (1,)).
    """
    scalar = local.ndim == 0
    if scalar:
        local = local.reshape((1,))
    shape = tuple(local.shape)
    whole = jax.make_array_from_single_device_arrays((len(ranks) * shape[0], *shape[1:]), _sharding(ranks), [local])
    out = program(kind, ranks, shape, local.dtype, op, root)(whole).addressable_data(0)
    return out.reshape(out.shape[:-1]) if scalar else out
