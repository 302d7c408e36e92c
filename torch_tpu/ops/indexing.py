"""Lowerings: indexing (advanced indexing, gather/scatter, masks), sorting and selection, searching, counting.

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
    before, rows, after = values.shape[:leading], values.shape[leading], values.shape[leading + 1:]
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
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    return self[_along(_dim(dim, self.ndim), index)]


def _scatter_target(self, dim, index):
    if self.ndim == 0:
        return self.reshape(1).at[index.reshape(-1)]
    return self.at[_along(_dim(dim, self.ndim), index)]


_SCATTER_REDUCE = {None: "set", "add": "add", "multiply": "multiply", "sum": "add", "prod": "multiply",
                   "amax": "max", "amin": "min"}


def _scatter(self, dim, index, src, reduce=None):
    _check_range(index, self.shape[_dim(dim, self.ndim)] if self.ndim else 1, dim)
    src = jnp.asarray(_fit_source(src, index)).astype(self.dtype)
    return getattr(_scatter_target(self, dim, index), _SCATTER_REDUCE[reduce])(src).reshape(self.shape)


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
    return jnp.stack(jnp.nonzero(self, size=size, fill_value=fill_value), axis=1).astype(np.int64)


@lower(aten.take.default)
def take(self, index):
    return self.reshape(-1)[index]


@lower(aten.put.default)
def put(self, index, source, accumulate=False):
    target = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return (target.add(source) if accumulate else target.set(source)).reshape(self.shape)


def _sort(self, dim, descending=False):
    """Values and int64 indices sorted stably along `dim` (NaN sorts above every number, as in PyTorch)."""
    if self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    order = jnp.argsort(self, axis=dim, stable=True, descending=descending)
    return jnp.take_along_axis(self, order, axis=dim), order.astype(np.int64)


@lower(aten.sort.stable)
def sort(self, *, stable, dim=-1, descending=False):
    return _sort(self, dim, descending)


@lower(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    moved = jnp.moveaxis(self, dim, -1)
    if largest and self.dtype != np.bool_:
        values, order = jax.lax.top_k(moved, k)
    else:
        values, order = _sort(moved, -1, largest)
        values, order = values[..., :k], order[..., :k]
    return jnp.moveaxis(values, -1, dim), jnp.moveaxis(order, -1, dim).astype(np.int64)


def _pick(values, order, position, dim, keepdim):
    """Element `position` (an int, or one per row) along `dim` of sorted values and their indices."""
    position = jnp.broadcast_to(position, values.shape[:dim] + values.shape[dim + 1:])
    position = jnp.expand_dims(position, dim)
    value = jnp.take_along_axis(values, position, axis=dim)
    index = jnp.take_along_axis(order, position, axis=dim)
    return (value, index) if keepdim else (jnp.squeeze(value, dim), jnp.squeeze(index, dim))


@lower(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    dim = _dim(dim, self.ndim)
    values, order = _sort(self, dim)
    return _pick(values, order, k - 1, dim, keepdim)


def _median_position(self, dim, skip_nan=False):
    """The lower median's position in sorted `values` (NaNs sort last): of the non-NaN values with `skip_nan`,
    else the first NaN's when there is one (NaN propagates)."""
    size = self.shape[dim]
    if not jnp.issubdtype(self.dtype, jnp.floating):
        return (size - 1) // 2
    nans = jnp.sum(jnp.isnan(self), axis=dim)
    if skip_nan:
        return jnp.maximum((size - nans - 1) // 2, 0)
    return jnp.where(nans > 0, size - nans, (size - 1) // 2)


def _median(self, dim, keepdim, skip_nan):
    """(values, indices) of the lower median along `dim` (of all elements for `dim` None)."""
    if dim is None:
        self, dim = self.reshape(-1), 0
    elif self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    dim = _dim(dim, self.ndim)
    values, order = _sort(self, dim)
    return _pick(values, order, _median_position(self, dim, skip_nan), dim, keepdim)


@lower(aten.median.default)
def median(self):
    return _median(self, None, False, skip_nan=False)[0]


@lower(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _median(self, dim, keepdim, skip_nan=False)


@lower(aten.nanmedian.default)
def nanmedian(self):
    return _median(self, None, False, skip_nan=True)[0]


@lower(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _median(self, dim, keepdim, skip_nan=True)


@lower(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    """The most frequent value along `dim` (the smallest on ties) and the index of its last occurrence."""
    if self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    dim = _dim(dim, self.ndim)
    values, order = _sort(jnp.moveaxis(self, dim, -1), -1)
    size = values.shape[-1]
    position = jnp.arange(size)
    starts = jnp.concatenate([jnp.ones_like(values[..., :1], bool), values[..., 1:] != values[..., :-1]], -1)
    ends = jnp.concatenate([starts[..., 1:], jnp.ones_like(starts[..., :1])], -1)
    run_start = jax.lax.cummax(jnp.where(starts, position, 0), axis=values.ndim - 1)
    frequency = jnp.where(ends, position - run_start + 1, 0)
    best = jnp.argmax(frequency, axis=-1)
    value, index = _pick(values, order, best, values.ndim - 1, keepdim)
    return (jnp.moveaxis(value, -1, dim), jnp.moveaxis(index, -1, dim)) if keepdim else (value, index)


def _empty_index():
    return jnp.zeros((0,), np.int64)


@lower(aten._unique2.default, jit=False)
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    inverse = inverse.reshape(self.shape) if return_inverse else _empty_index()
    return values, inverse, counts if return_counts else _empty_index()


@lower(aten.unique_dim.default, jit=False)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(self, return_inverse=True, return_counts=True, axis=dim)
    return values, inverse.reshape(-1), counts


@lower(aten.unique_consecutive.default, jit=False)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    data = self.reshape(-1) if dim is None else jnp.moveaxis(self, dim, 0)
    if data.shape[0] == 0:
        return self, _empty_index(), _empty_index()
    differs = (data[1:] != data[:-1]).reshape(data.shape[0] - 1, -1).any(axis=1)
    starts = np.concatenate([[True], np.asarray(differs)])
    values = data[np.flatnonzero(starts)]
    if dim is not None:
        values = jnp.moveaxis(values, 0, dim)
    inverse = jnp.asarray(np.cumsum(starts) - 1)
    inverse = inverse.reshape(self.shape) if dim is None else inverse
    counts = jnp.asarray(np.diff(np.append(np.flatnonzero(starts), starts.size)))
    return values, inverse if return_inverse else _empty_index(), counts if return_counts else _empty_index()


def _search(sorted_sequence, values, side):
    if sorted_sequence.ndim <= 1:
        return jnp.searchsorted(sorted_sequence, values, side=side)
    rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    found = jax.vmap(functools.partial(jnp.searchsorted, side=side))(rows, values.reshape(rows.shape[0], -1))
    return found.reshape(values.shape)


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    return _search(sorted_sequence, jnp.asarray(self), side or ("right" if right else "left"))


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, jnp.asarray(self), side="right" if right else "left")


@lower(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    x = self.reshape(-1)
    low, high = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    automatic = low == high
    low = jnp.where(automatic, jnp.min(x, initial=jnp.inf), low)
    high = jnp.where(automatic, jnp.max(x, initial=-jnp.inf), high)
    low, high = jnp.where(low == high, low - 1, low), jnp.where(low == high, high + 1, high)
    position = jnp.clip(jnp.floor((x - low) / (high - low) * bins).astype(np.int64), 0, bins - 1)
    position = jnp.where((x >= low) & (x <= high), position, bins)
    return jnp.zeros((bins,), x.dtype).at[position].add(1, mode="drop")


@lower(aten.bincount.default, jit=False)
def bincount(self, weights=None, minlength=0):
    length = max(int(jnp.max(self)) + 1 if self.size else 0, minlength)
    if weights is None:
        return jnp.bincount(self, length=length).astype(np.int64)
    dtype = np.float32 if weights.dtype == np.float32 else np.float64
    return jnp.bincount(self, weights.astype(dtype), length=length)
