"""Lowerings: indexing (advanced indexing, gather/scatter, index_* and masked ops, take/put); sorting, selection,
unique, searching and histograms are in `sorting`.

Boolean masks in `index`/`index_put` make shapes data-dependent: those lowerings run eagerly (`jit=False`), turn
masks into integer indices, and call a jitted kernel. A lone mask written with `index_put` needs no host sync.

Index bounds are checked on the device (`runtime/checks.py`): an out-of-range index raises PyTorch's CPU error
(IndexError or RuntimeError, by op) at the next synchronisation, from a flag the op's own executable computes.
With the checks off (TORCH_TPU_CHECK_INDICES=0), each op's docstring says what an out-of-range index does. Ops
whose indices CPU checks even when their output is empty (index_select of a zero-width tensor, a scatter into an
empty one) are lowered with `checks_empty=True`; the others (an index or index_add on a zero-width tensor) are not.
"""

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.shape import wrap_dim
from torch_tpu.runtime import checks, deprecation, dtypes

_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.uint8))
_UINT8_INDEX = "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."
OUT_OF_BOUNDS = "index {{}} is out of bounds for dimension {dim} with size {size}"


def require_in_range(index, size, error, message, negative=False):
    """Device-side check that every entry of `index` lies in [0, size), or in [-size, size) when `negative`
    indices count from the end; `message` has one field, for the first entry that does not."""
    if not checks.index_checks() or index is None or index.size == 0:
        return
    flat = jnp.reshape(index, -1)
    bad = (flat >= size) | (flat < (-size if negative else 0))
    checks.require(~jnp.any(bad), error, message, flat[jnp.argmax(bad)])


def _check_dims(self, indices):
    """Advanced indexing: index k (masks already expanded) addresses dimension k of `self`, negative entries from
    its end; CPU's message numbers it among the given indices."""
    given = 0
    for dim, index in enumerate(indices):
        if index is not None:
            size = self.shape[dim]
            require_in_range(index, size, IndexError, OUT_OF_BOUNDS.format(dim=given, size=size), negative=True)
            given += 1


def _check_mask_shapes(self, indices):
    """A mask must match the dimensions it indexes, as on CPU (an IndexError naming both shapes)."""
    dim = 0
    for index in indices:
        if _is_mask(index):
            for j, size in enumerate(index.shape):
                if dim + j < self.ndim and size != self.shape[dim + j]:
                    raise IndexError(
                        f"The shape of the mask {list(index.shape)} at index {j} does not match the shape of the "
                        f"indexed tensor {list(self.shape)} at index {dim + j}"
                    )
        dim += 1 if index is None or not _is_mask(index) else index.ndim


def _is_mask(index):
    return index is not None and index.dtype in _MASK_DTYPES


def _warn_uint8(indices):
    """CPU's deprecation warning for a uint8 index, which it (and so the lowerings) still reads as a bool mask."""
    if any(index is not None and index.dtype == np.uint8 for index in indices):
        deprecation.warn(_UINT8_INDEX)


def _index_tuple(indices):
    """ATen's index list (None = the whole dimension) as a NumPy-style index."""
    return tuple(slice(None) if index is None else index for index in indices)


def _masks_to_positions(indices):
    """Replace each k-dimensional mask by the k integer index arrays of its True elements (a host sync)."""
    expanded = []
    for index in indices:
        expanded.extend(jnp.nonzero(index) if _is_mask(index) else [index])
    return tuple(expanded)


def _gather_checked(self, indices):
    _check_dims(self, indices)
    return self[_index_tuple(indices)]


def _put_checked(self, indices, values, accumulate):
    _check_dims(self, indices)
    return _updater(self.at[_index_tuple(indices)], "add" if accumulate else None, self.dtype)(values)


_gather = checks.jit(_gather_checked)
_gather_in_range = jax.jit(lambda self, indices: self[_index_tuple(indices)])  # positions of True elements
_put = checks.jit(_put_checked, static_argnums=3)


def _values_fit(values_shape, result_shape):
    """Whether `values_shape` broadcasts to `result_shape`, where None (the mask's count of True elements, known
    on the device only) matches any size."""
    extra = len(values_shape) - len(result_shape)
    if extra > 0 and any(size != 1 for size in values_shape[:extra]):
        return False
    aligned = values_shape[max(extra, 0) :]
    targets = result_shape[len(result_shape) - len(aligned) :]
    return all(v == 1 or r is None or v == r for v, r in zip(aligned, targets, strict=True))


def _mask_result(self, mask, leading):
    """The shape `self[:, ..., mask]` (`leading` whole dimensions first) has, None for the count of True elements."""
    return self.shape[:leading] + (None,) + self.shape[leading + mask.ndim :]


def _mask_mismatch(values_shape, result, count):
    shape = ", ".join(str(count if size is None else size) for size in result)
    return (
        f"shape mismatch: value tensor of shape {list(values_shape)} cannot be broadcast to indexing result of "
        f"shape [{shape}]"
    )


def _put_through_mask_checked(self, mask, values, leading, accumulate):
    """`self[:, ..., mask] = values` (`leading` whole dimensions first) without a host sync: the k-th True
    element takes the k-th row of `values`, or `values` broadcasts over every True element. Other row counts
    fail a device-side check with CPU's error (the caller checks the other dimensions, `_values_fit`)."""
    trailing = self.ndim - leading - mask.ndim
    given = values.shape
    result = _mask_result(self, mask, leading)
    values = values.reshape(given[max(len(given) - len(result), 0) :])
    values = values.reshape((1,) * (leading + 1 + trailing - values.ndim) + values.shape)
    before, rows, after = values.shape[:leading], values.shape[leading], values.shape[leading + 1 :]
    if rows != 1:
        count = jnp.sum(mask)
        checks.require(count == rows, RuntimeError, _mask_mismatch(given, result, "{}"), count)
    if values.size == 0:
        return self
    if rows > 1:
        order = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, rows - 1)
        values = jnp.take(values, order, axis=leading).reshape(before + mask.shape + after)
    else:
        values = values.reshape(before + (1,) * mask.ndim + after)
    where = mask.reshape((1,) * leading + mask.shape + (1,) * trailing)
    return jnp.where(where, self + values if accumulate else values, self)


_put_through_mask = checks.jit(_put_through_mask_checked, static_argnums=(3, 4))


@lower(aten.index.Tensor, jit=False)
def index(self, indices):
    """NOTE: with checks off, out-of-range indices are clamped."""
    _warn_uint8(indices)
    _check_mask_shapes(self, indices)
    return _gather(self, _masks_to_positions(indices))


@lower(aten._unsafe_index.Tensor)
def _unsafe_index(self, indices):
    return self[_index_tuple(indices)]


@lower(aten.index_put.default, aten._index_put_impl.default, jit=False)
def index_put(self, indices, values, accumulate=False, unsafe=False):
    """NOTE: with checks off, writes at out-of-range indices are dropped."""
    _check_values_dtype(self, values)
    _warn_uint8(indices)
    _check_mask_shapes(self, indices)
    given = [i for i, index in enumerate(indices) if index is not None]
    if len(given) == 1 and _is_mask(indices[given[0]]):
        mask, values = indices[given[0]].astype(bool), jnp.asarray(values)
        result = _mask_result(self, mask, given[0])
        if not _values_fit(values.shape, result):  # wrong whatever the mask holds: the count is read for the message
            raise RuntimeError(_mask_mismatch(values.shape, result, int(jnp.sum(mask))))
        return _put_through_mask(self, mask, values, given[0], accumulate)
    return _put(self, _masks_to_positions(indices), values, accumulate)


def _check_values_dtype(self, values):
    """CPU's index_put takes values of the tensor's own dtype only (a slice assignment, copy_, casts instead)."""
    given = jnp.result_type(values)
    if given != self.dtype:
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got {dtypes.aten_name(self.dtype)} for "
            f"the destination and {dtypes.aten_name(given)} for the source."
        )


@lower(aten._unsafe_index_put.default)
def _unsafe_index_put(self, indices, values, accumulate=False):
    values = values.astype(self.dtype)
    return _updater(self.at[_index_tuple(indices)], "add" if accumulate else None, self.dtype)(values)


@lower(aten.index_select.default, checks_empty=True)
def index_select(self, dim, index):
    """NOTE: with checks off, out-of-range indices read NaN (floats) or a fill value and negative ones wrap."""
    if self.ndim == 0:
        require_in_range(index, 1, IndexError, "index out of range in self")
    else:
        size = self.shape[wrap_dim(dim, self.ndim)]
        require_in_range(index, size, RuntimeError, f"INDICES element is out of DATA bounds, id={{}} axis_dim={size}")
    if self.ndim == 0:
        return self[None][index.reshape(-1)].reshape(())
    return jnp.take(self, index.reshape(-1), axis=wrap_dim(dim, self.ndim))


def _along(dim, index):
    """Coordinates that address `index.shape` positions, with `index` itself along `dim` (gather/scatter)."""
    grid = jnp.indices(index.shape, sparse=True)
    return tuple(index if d == dim else grid[d] for d in range(index.ndim))


def _fit_source(src, index):
    return src[tuple(slice(0, n) for n in index.shape)] if jnp.ndim(src) else src


def _check_along(self, dim, index, error=RuntimeError, negative=False, message=OUT_OF_BOUNDS):
    """Device-side check of an index along `dim` (gather, scatter, index_add, ...), with CPU's message."""
    dim, size = wrap_dim(dim, self.ndim), self.shape[wrap_dim(dim, self.ndim)] if self.ndim else 1
    require_in_range(index, size, error, message.format(dim=dim, size=size), negative)


@lower(aten.gather.default)
def gather(self, dim, index, *, sparse_grad=False):
    """NOTE: with checks off, out-of-range indices are clamped and negative ones wrap."""
    _check_along(self, dim, index)
    if index.size == 0:  # an empty index may have any number of dimensions
        return jnp.zeros(index.shape, self.dtype)
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    return self[_along(wrap_dim(dim, self.ndim), index)]


def _scatter_target(self, dim, index):
    if self.ndim == 0:
        return self.reshape(1).at[index.reshape(-1)]
    return self.at[_along(wrap_dim(dim, self.ndim), index)]


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
    _check_along(self, dim, index)
    if index.size == 0:  # an empty index may have any number of dimensions
        return self
    src = jnp.asarray(_fit_source(src, index)).astype(self.dtype)
    return _updater(_scatter_target(self, dim, index), reduce, self.dtype)(src).reshape(self.shape)


@lower(aten.scatter.src, aten.scatter.value, checks_empty=True)
def scatter(self, dim, index, src):
    """NOTE: with checks off, writes at out-of-range indices are dropped and negative ones wrap (every scatter)."""
    return _scatter(self, dim, index, src)


@lower(aten.scatter.reduce, aten.scatter.value_reduce, checks_empty=True)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    return _scatter(self, dim, index, src, reduce)


@lower(aten.scatter_add.default, checks_empty=True)
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


def _reduction_identity(reduce, dtype):
    if reduce in ("sum", "mean", "prod"):
        return int(reduce == "prod")
    if dtype == np.bool_:
        return reduce == "amin"
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@lower(aten.scatter_reduce.two, checks_empty=True)
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


@lower(aten.index_reduce.default, checks_empty=True)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """`self` with `source`'s slices combined (prod, mean, amax, amin) into those `index` picks along `dim`."""
    _check_along(self, dim, index, IndexError, message="index out of range in self")
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
    return (slice(None),) * wrap_dim(dim, self.ndim) + (index.reshape(-1),)


def _index_source(self, dim, source):
    """`source` with the indexed dimension present (ATen allows a 0-d source for 1-element indexing)."""
    source = jnp.asarray(source).astype(self.dtype)
    return source if source.ndim == self.ndim else jnp.expand_dims(source, wrap_dim(dim, self.ndim))


@lower(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    _check_along(self, dim, index)
    if self.ndim == 0:
        return self + source * alpha
    return self.at[_along_dim(self, dim, index)].add(_index_source(self, dim, source * alpha))


@lower(aten.index_copy.default)
def index_copy(self, dim, index, source):
    _check_along(self, dim, index, IndexError, message="index_copy_(): " + OUT_OF_BOUNDS)
    if self.ndim == 0:
        return jnp.asarray(source).astype(self.dtype)
    return self.at[_along_dim(self, dim, index)].set(_index_source(self, dim, source))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    _check_along(self, dim, index, IndexError, negative=True)
    if self.ndim == 0:
        return jnp.asarray(value).astype(self.dtype)
    return self.at[_along_dim(self, dim, index)].set(jnp.asarray(value).astype(self.dtype))


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)


@lower(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    if mask.dtype == np.uint8:  # CPU refuses it (the meta kernel does not); CPU's warning comes with its error
        raise RuntimeError("masked_scatter_ only supports boolean masks, but got mask with dtype Byte")
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
    if mask.dtype != np.bool_:  # CPU's check, which the meta kernel lacks
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = jnp.broadcast_shapes(self.shape, mask.shape) or (1,)
    return _gather_in_range(jnp.broadcast_to(self, shape), jnp.nonzero(jnp.broadcast_to(mask, shape)))


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


def _check_flat(self, index):
    """`take`/`put`: indices into the flattened tensor, negative ones from its end."""
    message = f"out of range: tried to access index {{}} on a tensor of {self.size} elements."
    require_in_range(index, self.size, IndexError, message, negative=True)


@lower(aten.take.default)
def take(self, index):
    _check_flat(self, index)
    return self.reshape(-1)[index]


@lower(aten.put.default, checks_empty=True)
def put(self, index, source, accumulate=False):
    if self.size == 0 and index.size != 0:  # (take's meta kernel raises CPU's error of this kind)
        raise IndexError("put_(): Tried to put elements into an empty tensor")
    _check_flat(self, index)
    target = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return (target.add(source) if accumulate else target.set(source)).reshape(self.shape)
