"""Lowerings: sorting and selection (sort, topk, kthvalue, median, mode), unique, searching and histograms.

`unique` and `bincount` have data-dependent output shapes: they run eagerly (`jit=False`) and read the device.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.creation import linspace
from torch_tpu.ops.reductions import check_reducible
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.shape import wrap_dim


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
    position = jnp.broadcast_to(position, values.shape[:dim] + values.shape[dim + 1 :])
    position = jnp.expand_dims(position, dim)
    value = jnp.take_along_axis(values, position, axis=dim)
    index = jnp.take_along_axis(order, position, axis=dim)
    return (value, index) if keepdim else (jnp.squeeze(value, dim), jnp.squeeze(index, dim))


@lower(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    dim = wrap_dim(dim, self.ndim)
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
        if self.size == 0:  # the median of nothing, as on CPU
            return jnp.full((), jnp.nan, self.dtype), None
        self, dim = self.reshape(-1), 0
    elif self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    dim = wrap_dim(dim, self.ndim)
    values, order = _sort(self, dim)
    return _pick(values, order, _median_position(self, dim, skip_nan), dim, keepdim)


def _median_all(self, skip_nan):
    return _median(self, None, False, skip_nan)[0]


def _median_dim(self, dim, keepdim=False, *, skip_nan):
    check_reducible(self, dim, "median")
    return _median(self, dim, keepdim, skip_nan)


for _skip_nan, _whole, _along in (
    (False, aten.median.default, aten.median.dim),
    (True, aten.nanmedian.default, aten.nanmedian.dim),
):
    lower(_whole)(functools.partial(_median_all, skip_nan=_skip_nan))
    lower(_along)(functools.partial(_median_dim, skip_nan=_skip_nan))


@lower(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    """The most frequent value along `dim` (the smallest on ties) and the index of its last occurrence."""
    check_reducible(self, dim, "mode")
    if self.ndim == 0:
        return self, jnp.zeros((), np.int64)
    dim = wrap_dim(dim, self.ndim)
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


@lower(aten._unique.default, jit=False)
def _unique(self, sorted=True, return_inverse=False):
    values, inverse, _ = _unique2(self, sorted, return_inverse)
    return values, inverse


@lower(aten.unique_dim.default, jit=False)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(self, return_inverse=True, return_counts=True, axis=dim)
    return values, inverse.reshape(-1), counts


@lower(aten.unique_consecutive.default, jit=False)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    data = self.reshape(-1) if dim is None else jnp.moveaxis(self, dim, 0)
    if data.shape[0] == 0:
        return self, _empty_index(), _empty_index()
    differs = (data[1:] != data[:-1]).reshape(data.shape[0] - 1, math.prod(data.shape[1:])).any(axis=1)
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
    if values.size == 0 or sorted_sequence.shape[-1] == 0:
        return jnp.zeros(values.shape, np.int64)
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


def _bin_positions(points, edges):
    """The bin of each point (edges ascending; the last edge closes the last bin), or -1 outside the edges."""
    count = edges.shape[0] - 1
    position = jnp.searchsorted(edges, points, side="right") - 1
    position = jnp.where(points == edges[-1], count - 1, position)
    return jnp.where((points >= edges[0]) & (points <= edges[-1]), position, -1)


def _outer_edges(points, low_high):
    """(leftmost, rightmost) edges: the given range, else the data's (0 and 1 without data), widened by 1/2 each
    way when equal."""
    if low_high is not None:
        low, high = (jnp.asarray(v, points.dtype) for v in low_high)
    elif points.size:
        low, high = jnp.min(points), jnp.max(points)
    else:
        low, high = jnp.zeros((), points.dtype), jnp.ones((), points.dtype)
    same = low == high
    return jnp.where(same, low - 0.5, low), jnp.where(same, high + 0.5, high)


def _histogram(points, edges, weight, density):
    """The N-d histogram of `points` (n, d) over per-dimension `edges`, as PyTorch's histogramdd."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    positions = [_bin_positions(points[:, d], e) for d, e in enumerate(edges)]
    inside = functools.reduce(jnp.logical_and, [p >= 0 for p in positions], jnp.ones(points.shape[0], bool))
    flat = jnp.zeros((points.shape[0],), np.int64)
    for p, n in zip(positions, shape, strict=True):
        flat = flat * n + jnp.maximum(p, 0)
    values = jnp.ones(points.shape[0], points.dtype) if weight is None else weight.reshape(-1).astype(points.dtype)
    hist = jnp.zeros((math.prod(shape),), points.dtype).at[flat].add(jnp.where(inside, values, 0))
    hist = hist.reshape(shape)
    if density:
        volume = functools.reduce(jnp.multiply, jnp.meshgrid(*[jnp.diff(e) for e in edges], indexing="ij"))
        hist = hist / (jnp.sum(hist) * volume)
    return hist


def _edges_from_counts(points, bins, bounds):
    """Per-dimension edges: `bins[d] + 1` evenly spaced over each dimension's range (`bounds`: flat pairs)."""
    edges = []
    for d, count in enumerate(bins):
        pair = None if bounds is None else bounds[2 * d : 2 * d + 2]
        low, high = _outer_edges(points[:, d], pair)
        edges.append(linspace(low, high, count + 1, dtype=points.dtype))
    return edges


def _points(self):
    return self.reshape(-1, self.shape[-1] if self.ndim > 1 else 1)


@lower(aten.histogram.bin_ct)
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    points = self.reshape(-1, 1)
    (edges,) = _edges_from_counts(points, [bins], range)
    return _histogram(points, [edges], weight, density), edges


@lower(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    return _histogram(self.reshape(-1, 1), [bins], weight, density), bins


@lower(aten._histogramdd_bin_edges.default)
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _edges_from_counts(_points(self), bins, range)


@lower(aten._histogramdd_from_bin_cts.default)
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    points = _points(self)
    return _histogram(points, _edges_from_counts(points, bins, range), weight, density)


@lower(aten._histogramdd_from_bin_tensors.default)
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _histogram(_points(self), list(bins), weight, density)
