"""Bilinear and bicubic resampling of uint8 images (plain and antialiased), as PyTorch's CPU kernels compute it.

ATen resamples uint8 images in fixed point (UpSampleKernel.cpp, `_compute_index_ranges_int16_weights`): per dim,
the last first, each output mixes a run of input taps with weights computed in double, scaled to int16 at a
per-dim precision p; the sum of pixel * weight plus 2**(p-1) is shifted right by p and saturated to [0, 255],
and the next dim reads that uint8 image. Taps and weights depend only on shapes and scales: NumPy, at trace time.
"""

import math

import jax.numpy as jnp
import numpy as np


def _scale(size, out, align_corners, scale):
    """ATen's area_pixel_compute_scale in double."""
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else size / out


def _triangle(x):
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _cubic(a):
    def filter_fn(x):
        x = abs(x)
        if x < 1.0:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        if x < 2.0:
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return 0.0

    return filter_fn


def _antialias_row(i, size, scale, support, width, filter_fn):
    """`_compute_indices_min_size_weights_aa`: (first tap, weights over `width` taps)."""
    center = scale * (i + 0.5)
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    low = max(int(center - support + 0.5), 0)
    count = min(max(min(int(center + support + 0.5), size) - low, 0), width)
    weights = [filter_fn((j + low - center + 0.5) * invscale) for j in range(count)]
    total = sum(weights)
    if total != 0.0:
        weights = [w / total for w in weights]
    return low, weights + [0.0] * (width - count)


def _plain_row(i, size, scale, width, filter_fn, align_corners):
    """`_compute_indices_min_size_weights` (antialias off): taps past an edge fold their weight into the edge's."""
    source = scale * i if align_corners else scale * (i + 0.5) - 0.5
    if width == 2 and not align_corners and source < 0:
        source = 0.0
    index = min(math.floor(np.float32(source)), size - 1)
    lam = min(max(source - index, 0.0), 1.0)
    support = width // 2
    unbound = index - support + 1
    low = max(unbound, 0)
    count = min(max(min(index + support + 1, size) - low, 0), width)
    weights = [0.0] * width
    slot = 0
    for j in range(width):
        w = filter_fn((j + 1 - support) - lam)
        if unbound + j <= 0:
            slot = 0
        elif unbound + j >= size - 1:
            slot = count - 1
        weights[slot] += w
        slot += 1
    return low, weights


def _int16_taps(size, out, align_corners, scale, interp_size, antialias):
    """(tap positions (out, k), int16-valued weights (out, k), precision p) for one dim."""
    scale = _scale(size, out, align_corners, scale)
    if interp_size == 2:
        filter_fn = _triangle
    else:
        filter_fn = _cubic(-0.5 if antialias else -0.75)
    if antialias:
        support = interp_size * 0.5 * scale if scale >= 1.0 else interp_size * 0.5
        width = math.ceil(support) * 2 + 1
        rows = [_antialias_row(i, size, scale, support, width, filter_fn) for i in range(out)]
    else:
        width = interp_size
        rows = [_plain_row(i, size, scale, width, filter_fn, align_corners) for i in range(out)]
    lows = np.array([low for low, _ in rows], np.int64)
    weights = np.array([w for _, w in rows], np.float64).reshape(out, width)
    peak = weights.max(initial=0.0)
    precision = 0
    while precision < 22 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    taps = np.minimum(lows[:, None] + np.arange(width)[None, :], size - 1)
    return taps, fixed, precision


def _resample_axis(x, axis, taps, weights, precision):
    gathered = jnp.moveaxis(jnp.take(x.astype(jnp.int32), taps, axis=axis), (axis, axis + 1), (-2, -1))
    total = jnp.sum(gathered * weights, axis=-1) + (1 << precision >> 1)
    return jnp.moveaxis(jnp.clip(total >> precision, 0, 255).astype(jnp.uint8), -1, axis)


def resample(x, output_size, align_corners, scales, interp_size, antialias):
    """Resample the trailing `len(output_size)` dims of uint8 `x`, the last dim first, as ATen does."""
    n = len(output_size)
    dims = zip(range(x.ndim - n, x.ndim), x.shape[-n:], output_size, scales, strict=True)
    for axis, size, out, scale in reversed(list(dims)):
        taps, weights, precision = _int16_taps(size, out, align_corners, scale, interp_size, antialias)
        x = _resample_axis(x, axis, taps, weights, precision)
    return x
