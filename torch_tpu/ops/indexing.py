"""Lowerings: indexing (advanced indexing, gather/scatter, index_* and masked ops, take/put); sorting, selection,
unique, searching and histograms are in `sorting`.

Boolean masks in `index`/`index_put` make shapes data-dependent: those lowerings run eagerly (`jit=False`), turn
masks into integer indices, and call a jitted kernel. A lone mask written with `index_put` needs no host sync.

Index bounds are not checked by default (that would wait for the device): each op's docstring says what an
out-of-range index does. With TORCH_TPU_ENABLE_DEBUG_CHECKS=1 (`debug_checks`), gather, index_select, index,
index_put and the scatters run unjitted, read their indices on the host and raise `IndexOutOfRangeError` (an
IndexError, and a RuntimeError like CPU's gather/scatter errors) as PyTorch's CPU kernels do.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.registry import aten, lower

_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.uint8))


def debug_checks() -> bool:
    """Whether TORCH_TPU_ENABLE_DEBUG_CHECKS=1 asks index ops to check bounds on the host (a device sync per op).

    Read once, when the lowerings register: the checked lowerings then run unjitted (so they see index values),
    which also keeps them out of torch.compile graphs.
    """
    return os.environ.get("TORCH_TPU_ENABLE_DEBUG_CHECKS") == "1"


_CHECKED = debug_checks()


class IndexOutOfRangeError(IndexError, RuntimeError):
    """An index outside its dimension (debug checks); PyTorch's CPU raises IndexError or RuntimeError by op."""


def _check_range(index, size, dim, negative=False):
    """With debug checks, raise as PyTorch's CPU does if `index` has an entry outside [0, size), or outside
    [-size, size) when `negative` indices count from the end."""
    if not _CHECKED or index is None or isinstance(index, jax.core.Tracer):
        return
    host = np.asarray(index)
    bad = (host >= size) | (host < (-size if negative else 0))
    if bad.any():
        raise IndexOutOfRangeError(f"index {host[bad].flat[0]} is out of bounds for dimension {dim} with size {size}")


def _check_dims(self, indices):
    """Debug checks for advanced indexing: index k (masks already expanded) addresses dimension k of `self`."""
    for dim, index in enumerate(indices):
        if index is not None:
            _check_range(index, self.shape[dim], dim, negative=True)


def _dim(dim, ndim):
    return dim % ndim if ndim else 0


def _is_mask(index):
    return index is not None and index.dtype in _MASK_DTYPES


def _index_tuple(indices):
    """ATen's index list (None = the whole dimension) as a NumPy-style index."""
    return tuple(slice(None) if index is None else index for index in indices)


def _masks_to_positions(indices):
    """Replace each k-dimensional mask by the k integer index arrays of its True elements (a host sync)."""
    expanded = []
    for index in indices:
        expanded.extend(jnp.nonzero(index) if _is_mask(index) else [index])
    return tuple(expanded)


@jax.jit
def _gather(self, indices):
    return self[_index_tuple(indices)]


@functools.partial(jax.jit, static_argnums=3)
def _put(self, indices, values, accumulate):
    target = self.at[_index_tuple(indices)]
    values = values.astype(self.dtype)
    return target.add(values) if accumulate else target.set(values)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _put_through_mask(self, mask, values, leading, accumulate):
    """`self[:, ..., mask] = values` (`leading` whole dimensions first) without a host sync: the k-th True
    element takes the k-th row of `values`, or `values` broadcasts over every True element."""
    trailing = self.ndim - leading - mask.ndim
    values = values.astype(self.dtype)
    values = values.reshape((1,) * (leading + 1 + trailing - values.ndim) + values.shape)
    before, rows, after = values.shape[:leading], values.shape[leading], values.shape[leading + 1 :]
    if rows > 1:
        order = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, rows - 1)
        values = jnp.take(values, order, axis=leading).reshape(before + mask.shape + after)
    else:
        values = values.reshape(before + (1,) * mask.ndim + after)
    where = mask.reshape((1,) * leading + mask.shape + (1,) * trailing)
    return jnp.where(where, self + values if accumulate else values, self)


@lower(aten.index.Tensor, jit=False)
def index(self, indices):
    """NOTE: out-of-range indices are clamped, unchecked unless TORCH_TPU_ENABLE_DEBUG_CHECKS=1."""
    positions = _masks_to_positions(indices)
    _check_dims(self, positions)
    return _gather(self, positions)


@lower(aten._unsafe_index.Tensor)
def _unsafe_index(self, indices):
    return self[_index_tuple(indices)]


@lower(aten.index_put.default, aten._index_put_impl.default, jit=False)
def index_put(self, indices, values, accumulate=False, unsafe=False):
    """NOTE: writes at out-of-range indices are dropped, unchecked unless TORCH_TPU_ENABLE_DEBUG_CHECKS=1."""
    given = [i for i, index in enumerate(indices) if index is not None]
    if len(given) == 1 and _is_mask(indices[given[0]]):
        if jnp.size(values) == 0:
            return self
        return _put_through_mask(self, indices[given[0]].astype(bool), jnp.asarray(values), given[0], accumulate)
    positions = _masks_to_positions(indices)
    _check_dims(self, positions)
    return _put(self, positions, values, accumulate)


@lower(aten._unsafe_index_put.default)
def _unsafe_index_put(self, indices, values, accumulate=False):
    target = self.at[_index_tuple(indices)]
    return target.add(values.astype(self.dtype)) if accumulate else target.set(values.astype(self.dtype))


@lower(aten.index_select.default, jit=not _CHECKED)
def index_select(self, dim, index):
    """NOTE: out-of-range indices read NaN (floats) or a fill value and negative ones wrap, unchecked unless
    TORCH_TPU_ENABLE_DEBUG_CHECKS=1."""
    _check_range(index, self.shape[_dim(dim, self.ndim)] if self.ndim else 1, dim)
    if self.ndim == 0:
        return self[None][index.reshape(-1)].reshape(())
    return jnp.take(self, index.reshape(-1), axis=_dim(dim, self.ndim))


def _along(dim, index):
    """Coordinates that address `index.shape` positions, with `index` itself along `dim` (gather/scatter)."""
    grid = jnp.indices(index.shape, sparse=True)
    return tuple(index if d == dim else grid[d] for d in range(index.ndim))


def _fit_source(src, index):
    return src[tuple(slice(0, n) for n in index.shape)] if jnp.ndim(src) else src


@lower(aten.gather.default, jit=not _CHECKED)
def gather(self, dim, index, *, sparse_grad=False):
    """NOTE: out-of-range indices are clamped and negative ones wrap, unchecked unless
    TORCH_TPU_ENABLE_DEBUG_CHECKS=1."""
    _check_range(index, self.shape[_dim(dim, self.ndim)] if self.ndim else 1, dim)
    if index.size == 0:  # an empty index may have any number of dimensions
        return jnp.zeros(index.shape, self.dtype)
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    return self[_along(_dim(dim, self.ndim), index)]


def _scatter_target(self, dim, index):
    if self.ndim == 0:
        return self.reshape(1).at[index.reshape(-1)]
    return self.at[_along(_dim(dim, self.ndim), index)]


_SCATTER_REDUCE = {
    None: "set",
    "add": "add",
    "multiply": "multiply",
    "sum": "add",
    "prod": "multiply",
    "amax": "max",
    "amin": "min",
    "mean": "add",
}
_BOOL_REDUCE = {"add": "max", "multiply": "min"}  # or, and


def _updater(target, reduce, dtype):
    """The `.at[]` method that combines updates with `reduce` (ATen's names) into `target`."""
    method = _SCATTER_REDUCE[reduce]
    return getattr(target, _BOOL_REDUCE.get(method, method) if dtype == np.bool_ else method)


def _scatter(self, dim, index, src, reduce=None):
    _check_range(index, self.shape[_dim(dim, self.ndim)] if self.ndim else 1, dim)
    if index.size == 0:  # an empty index may have any number of dimensions
        return self
    src = jnp.asarray(_fit_source(src, index)).astype(self.dtype)
    return _updater(_scatter_target(self, dim, index), reduce, self.dtype)(src).reshape(self.shape)


@lower(aten.scatter.src, aten.scatter.value, jit=not _CHECKED)
def scatter(self, dim, index, src):
    """NOTE: writes at out-of-range indices are dropped and negative ones wrap, unchecked unless
    TORCH_TPU_ENABLE_DEBUG_CHECKS=1 (as for every scatter)."""
    return _scatter(self, dim, index, src)


@lower(aten.scatter.reduce, aten.scatter.value_reduce, jit=not _CHECKED)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    return _scatter(self, dim, index, src, reduce)


@lower(aten.scatter_add.default, jit=not _CHECKED)
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


def _reduction_identity(reduce, dtype):
    if reduce in ("sum", "mean", "prod"):
        return int(reduce == "prod")
    if dtype == np.bool_:
        return reduce == "amin"
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@lower(aten.scatter_reduce.two, jit=not _CHECKED)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    base = self
    if not include_self:
        base = _scatter(self, dim, index, jnp.full(index.shape, _reduction_identity(reduce, self.dtype)))
    if reduce != "mean":
        return _scatter(base, dim, index, src, reduce)
    total = _scatter(base, dim, index, src, "add")
    count = _scatter(jnp.full(self.shape, int(include_self), self.dtype), dim, index, jnp.ones(index.shape), "add")
    count = jnp.where(count == 0, 1, count)
    if jnp.issubdtype(self.dtype, jnp.floating):
        return total / count
    return jnp.floor_divide(total, count)


@lower(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """`self` with `source`'s slices combined (prod, mean, amax, amin) into those `index` picks along `dim`."""
    if self.ndim == 0:
        flat = index_reduce(self.reshape(1), 0, index, jnp.reshape(source, (-1,)), reduce, include_self=include_self)
        return flat.reshape(())
    where = _along_dim(self, dim, index)
    source = _index_source(self, dim, source)
    base = self
    if not include_self:
        base = self.at[where].set(jnp.asarray(_reduction_identity(reduce, self.dtype), self.dtype))
    if reduce != "mean":
        return _updater(base.at[where], reduce, self.dtype)(source)
    total = base.at[where].add(source)
    count = jnp.full(self.shape, int(include_self), self.dtype).at[where].add(jnp.ones_like(source))
    count = jnp.where(count == 0, 1, count)
    return total / count if jnp.issubdtype(self.dtype, jnp.floating) else jnp.floor_divide(total, count)


def _along_dim(self, dim, index):
    return (slice(None),) * _dim(dim, self.ndim) + (index.reshape(-1),)


def _index_source(self, dim, source):
    """`source` with the indexed dimension present (ATen allows a 0-d source for 1-element indexing)."""
    source = jnp.asarray(source).astype(self.dtype)
    return source if source.ndim == self.ndim else jnp.expand_dims(source, _dim(dim, self.ndim))


@lower(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    if self.ndim == 0:
        return self + source * alpha
    return self.at[_along_dim(self, dim, index)].add(_index_source(self, dim, source * alpha))


@lower(aten.index_copy.default)
def index_copy(self, dim, index, source):
    if self.ndim == 0:
        return jnp.asarray(source).astype(self.dtype)
    return self.at[_along_dim(self, dim, index)].set(_index_source(self, dim, source))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    if self.ndim == 0:
        return jnp.asarray(value).astype(self.dtype)
    return self.at[_along_dim(self, dim, index)].set(jnp.asarray(value).astype(self.dtype))


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)


@lower(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    self, mask = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape)
    if source.size == 0:
        return self
    order = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, source.size - 1)
    taken = source.reshape(-1)[order].reshape(shape).astype(self.dtype)
    return jnp.where(mask, taken, self)


@lower(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad_output, mask, sizes):
    numel = int(np.prod(sizes))
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    target = jnp.where(mask, jnp.cumsum(mask) - 1, numel)
    result = jnp.zeros((numel,), grad_output.dtype).at[target].set(grad_output.reshape(-1), mode="drop")
    return result.reshape(sizes)


@lower(aten.masked_select.default, jit=False)
def masked_select(self, mask):
    shape = jnp.broadcast_shapes(self.shape, mask.shape) or (1,)
    return _gather(jnp.broadcast_to(self, shape), jnp.nonzero(jnp.broadcast_to(mask, shape)))


@lower(aten.nonzero.default, jit=False)
def nonzero(self):
    host = np.asarray(self)
    return jnp.asarray(np.argwhere(host) if host.ndim else np.zeros((int(host != 0), 0), np.int64))


@lower(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    if self.ndim == 0:
        return jnp.zeros((size, 0), np.int64)
    if self.size == 0:
        return jnp.full((size, self.ndim), fill_value, np.int64)
    return jnp.stack(jnp.nonzero(self, size=size, fill_value=fill_value), axis=1).astype(np.int64)


@lower(aten.take.default)
def take(self, index):
    return self.reshape(-1)[index]


@lower(aten.put.default)
def put(self, index, source, accumulate=False):
    target = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return (target.add(source) if accumulate else target.set(source)).reshape(self.shape)
