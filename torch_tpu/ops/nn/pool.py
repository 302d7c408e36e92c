"""Lowerings: max, average and adaptive pooling (and their backward ops) over the trailing 2 or 3 dims.

Indices are PyTorch's: the flat position of the chosen element within its input plane (`h * W + w`).
"""

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_tpu.ops.nn.common import (
    expand,
    linear_adjoint,
    max_with_indices,
    padded_windows,
    pool_output_size,
    upcast,
    window_grid,
    window_positions,
)
from torch_tpu.ops.registry import aten, lower


def _into_planes(values, indices, plane_shape, accumulate):
    """A zero tensor of planes shaped `plane_shape` (batch dims from `values`) with `values` written (or added)
    at their flat in-plane `indices`."""
    batch = values.shape[: values.ndim - len(plane_shape)]
    rows, columns = int(np.prod(batch, dtype=np.int64)), int(np.prod(values.shape[len(batch) :], dtype=np.int64))
    flat_values, flat_indices = values.reshape(rows, columns), indices.reshape(rows, columns)  # rows may be 0
    planes = jnp.zeros((rows, int(np.prod(plane_shape, dtype=np.int64))), values.dtype)
    target = planes.at[jnp.arange(rows)[:, None], flat_indices]
    planes = target.add(flat_values) if accumulate else target.set(flat_values)
    return planes.reshape(batch + tuple(plane_shape))


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _geometry(self, n, kernel_size, stride, padding, dilation, ceil_mode):
    """Per spatial dim: (size, kernel, stride, padding, dilation, output size), by ATen's pooling rules."""
    kernel = expand(kernel_size, n)
    stride = expand(stride, n) if stride else kernel
    dims = zip(self.shape[-n:], kernel, stride, expand(padding, n), expand(dilation, n), strict=True)
    return [(*dim, pool_output_size(*dim, ceil_mode)) for dim in dims]


def _max_pool_windows(self, n, kernel_size, stride, padding, dilation, ceil_mode):
    """`windows(x, fill)`, the pooling windows of x padded with `fill`, and every window element's flat
    in-plane index and realness."""
    size, kernel, stride, padding, dilation, out = zip(
        *_geometry(self, n, kernel_size, stride, padding, dilation, ceil_mode), strict=True
    )
    positions, valids = zip(*map(window_positions, size, kernel, stride, padding, dilation, out), strict=True)

    def windows(x, fill):
        return padded_windows(x, kernel, stride, padding, dilation, out, fill)

    return windows, *window_grid(positions, valids, size)


def _prefer(a, b):
    """The (value, index) pair of a max pooling window that wins, by PyTorch's scan: the larger value, the first
    index on ties, and a NaN over any number (the last NaN among NaNs). Commutative and associative."""
    (a_value, a_index), (b_value, b_index) = a, b
    a_nan, b_nan = jnp.isnan(a_value), jnp.isnan(b_value)
    numbers = (b_value > a_value) | ((b_value == a_value) & (b_index < a_index))
    take_b = jnp.where(a_nan | b_nan, b_nan & (~a_nan | (b_index > a_index)), numbers)
    return jnp.where(take_b, b_value, a_value), jnp.where(take_b, b_index, a_index)


def max_pool(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False, *, n):
    """(values, indices) of ATen's `max_pool{n}d_with_indices` over the trailing `n` dims (the prebuilt
    `torch.tpu.ops` max pools use it too). One variadic `reduce_window` over (value, flat in-plane index) pairs: a
    small program that compiles fast (stacking every window element, then an argmax, took seconds for 3-d
    kernels). Padding carries the lowest value and an index past every real one, so it never wins."""
    geometry = _geometry(self, n, kernel_size, stride, padding, dilation, ceil_mode)
    batch = (1,) * (self.ndim - n)
    pads = [(0, 0)] * (self.ndim - n) + [
        (p, max((o - 1) * st + d * (k - 1) + 1 - s - p, 0)) for s, k, st, p, d, o in geometry
    ]
    plane = self.shape[-n:]
    index = jnp.broadcast_to(lax.iota(jnp.int32, int(np.prod(plane, dtype=np.int64))).reshape(plane), self.shape)
    init = (jnp.asarray(_lowest(self.dtype), self.dtype), jnp.asarray(jnp.iinfo(jnp.int32).max, jnp.int32))
    values, indices = lax.reduce_window(
        (self, index), init, _prefer, batch + tuple(g[1] for g in geometry), batch + tuple(g[2] for g in geometry),
        pads, window_dilation=batch + tuple(g[4] for g in geometry),
    )  # fmt: skip
    return values, indices.astype(jnp.int64)


def max_pool_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices, *, n):
    """Each output's gradient goes to the window element whose flat index it chose; the windows are a linear
    map of the input, so their transpose (strided pads and adds, no scatter) sums the overlaps."""
    windows, flat, valid = _max_pool_windows(self, n, kernel_size, stride, padding, dilation, ceil_mode)
    chosen = valid & (flat == indices[..., None])
    grad_windows = jnp.where(chosen, upcast(grad_output)[..., None], 0)
    return linear_adjoint(lambda x: windows(x, 0), grad_windows, self.shape)


def _divisor(size, kernel, stride, padding, out, count_include_pad):
    """How many elements each output of one dim averages over (ATen's rule), shape (out,)."""
    start = np.arange(out) * stride - padding
    end = np.minimum(start + kernel, size + padding)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(
    self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None, *, n
):
    geometry = _geometry(self, n, kernel_size, stride, padding, (1,), ceil_mode)
    x = upcast(self)
    batch = (1,) * (self.ndim - n)
    pads = [(0, 0)] * (self.ndim - n) + [(p, max((o - 1) * st + k - s - p, 0)) for s, k, st, p, _, o in geometry]
    kernel, stride = tuple(g[1] for g in geometry), tuple(g[2] for g in geometry)
    total = lax.reduce_window(x, np.zeros((), x.dtype), lax.add, batch + kernel, batch + stride, pads)
    total = total[(...,) + tuple(slice(0, g[-1]) for g in geometry)]
    if divisor_override:
        return total / divisor_override
    divisor = np.ones((), np.int64)
    for s, k, st, p, _, o in geometry:
        divisor = np.multiply.outer(divisor, _divisor(s, k, st, p, o, count_include_pad))
    return total / divisor.astype(x.dtype)


def _avg_pool_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, *, n
):
    return linear_adjoint(
        lambda x: _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n=n),
        grad_output,
        self.shape,
    )


def _adaptive_windows(x, output_size, fill):
    """Adaptive pooling windows (start = floor(i*in/out), end = ceil((i+1)*in/out)) of the trailing dims.

    Returns the windows, shape `x.shape[:-n] + out + (prod(longest window),)`, padded with `fill`, the number of
    real elements of each window, and (as `window_grid`) each element's flat in-plane index and realness.
    """
    n = len(output_size)
    sizes = x.shape[-n:]
    positions, valids, counts = [], [], np.ones((), np.int64)
    for size, out in zip(sizes, output_size, strict=True):
        start = np.arange(out) * size // out
        end = -(-(np.arange(out) + 1) * size // out)
        pos = start[:, None] + np.arange(int((end - start).max()))[None, :]
        positions.append(np.minimum(pos, size - 1))
        valids.append(pos < end[:, None])
        counts = np.multiply.outer(counts, end - start)
    flat, valid = window_grid(positions, valids, sizes)
    windows = jnp.take(x.reshape(x.shape[:-n] + (-1,)), flat, axis=-1)
    return jnp.where(valid, windows, jnp.asarray(fill, x.dtype)), counts, flat, valid


@lower(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(self, output_size):
    windows, counts, _, _ = _adaptive_windows(upcast(self), tuple(output_size), 0)
    return jnp.sum(windows, axis=-1) / counts.astype(windows.dtype)


@lower(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max_pool(self, output_size):
    windows, _, flat, valid = _adaptive_windows(self, tuple(output_size), _lowest(self.dtype))
    return max_with_indices(windows, flat, valid)


def _adaptive_avg_pool_backward(grad_output, self, *, n):
    return linear_adjoint(lambda x: _adaptive_avg_pool(x, grad_output.shape[-n:]), grad_output, self.shape)


def _adaptive_max_pool_backward(grad_output, self, indices, *, n):
    return _into_planes(upcast(grad_output), indices, self.shape[-n:], accumulate=True)


# The 2-d and 3-d ops of each kind are one computation over the trailing `n` dims, which the input's shape alone
# does not tell (an unbatched 3-d input has as many dims as a batched 2-d one).
for _fn, _by_dims in (
    (max_pool, (aten.max_pool2d_with_indices, aten.max_pool3d_with_indices)),
    (max_pool_backward, (aten.max_pool2d_with_indices_backward, aten.max_pool3d_with_indices_backward)),
    (_avg_pool, (aten.avg_pool2d, aten.avg_pool3d)),
    (_avg_pool_backward, (aten.avg_pool2d_backward, aten.avg_pool3d_backward)),
    (_adaptive_avg_pool_backward, (aten._adaptive_avg_pool2d_backward, aten._adaptive_avg_pool3d_backward)),
    (_adaptive_max_pool_backward, (aten.adaptive_max_pool2d_backward, aten.adaptive_max_pool3d_backward)),
):
    for _n, _op in zip((2, 3), _by_dims, strict=True):
        lower(_op.default)(functools.partial(_fn, n=_n))


@lower(aten.max_unpool2d.default)
def max_unpool2d(self, indices, output_size):
    return _into_planes(self, indices, tuple(output_size), accumulate=False)


@lower(aten.max_unpool3d.default)
def max_unpool3d(self, indices, output_size, stride, padding):
    return _into_planes(self, indices, tuple(output_size), accumulate=False)


def _fractional_starts(sample, size, out, kernel):
    """ATen's pseudo-random window starts along one dim: `int((i + u) * a) - int(u * a)` with
    `a = (size - kernel) / (out - 1)`, computed in the samples' dtype, and the last window flush with the end."""
    alpha = jnp.asarray(size - kernel, sample.dtype) / jnp.asarray(max(out - 1, 1), sample.dtype)
    steps = jnp.arange(out, dtype=sample.dtype)
    starts = ((steps + sample[..., None]) * alpha).astype(jnp.int32) - (sample * alpha).astype(jnp.int32)[..., None]
    return jnp.where(jnp.arange(out) == out - 1, size - kernel, starts)


def _fractional_max_pool(self, kernel_size, output_size, random_samples, sample_axes):
    """Max over one pseudo-random window per output element; `sample_axes[d]` is which of a plane's random
    samples places the windows of spatial dim d. The windows are gathered by flat in-plane index."""
    n = len(kernel_size)
    x = self if self.ndim == n + 2 else self[None]
    sizes = x.shape[2:]
    flat = jnp.zeros(x.shape[:2] + (1,) * (2 * n), jnp.int32)
    for d, (size, out, k, axis) in enumerate(zip(sizes, output_size, kernel_size, sample_axes, strict=True)):
        starts = _fractional_starts(random_samples[..., axis], size, out, k)  # (N, C, out)
        positions = starts[..., None] + jnp.arange(k)  # (N, C, out, k)
        shape = [x.shape[0], x.shape[1]] + [1] * (2 * n)
        shape[2 + d], shape[2 + n + d] = out, k
        flat = flat + positions.reshape(shape) * int(np.prod(sizes[d + 1 :], dtype=np.int64))
    flat = flat.reshape(x.shape[:2] + tuple(output_size) + (-1,))
    planes = x.reshape(x.shape[:2] + (-1,))
    windows = jnp.take_along_axis(planes, flat.reshape(x.shape[:2] + (-1,)), axis=2).reshape(flat.shape)
    values, indices = max_with_indices(windows, flat, True)
    values, indices = (values, indices) if self.ndim == n + 2 else (values[0], indices[0])
    return values, indices.astype(jnp.int64)


@lower(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, (1, 0))


@lower(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, (0, 1, 2))


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _into_planes(upcast(grad_output), indices, self.shape[-2:], accumulate=True)


@lower(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    """Cast to the input's dtype here: the op has no meta kernel to set it."""
    return _into_planes(upcast(grad_output), indices, self.shape[-3:], accumulate=True).astype(self.dtype)
