"""Lowerings: upsampling (nearest, nearest-exact, linear, bilinear, trilinear, bicubic, antialiased bilinear and
bicubic) with their backward ops, and pixel (un)shuffle.

Every mode is separable: each spatial dim is resampled in turn by gathering a few input taps per output position
and mixing them with weights. Tap positions and weights depend only on shapes and scales, so they are computed
with NumPy at trace time, in the precision PyTorch uses (float32 for nearest indices, the op's accumulation type
for interpolation weights). The backward ops are the exact adjoints (`jax.vjp`) of the forwards.
"""

import functools

import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.nn import image_uint8
from torch_tpu.ops.nn.common import linear_adjoint, upcast
from torch_tpu.ops.registry import aten, lower

_CUBIC_A = -0.75


def _nearest_taps(size, out, scale, exact):
    if not exact and out == size:
        return np.arange(out)[:, None]
    if not exact and out == 2 * size:
        return (np.arange(out) // 2)[:, None]
    ratio = np.float32(1 / scale) if scale is not None and scale > 0 else np.float32(size) / np.float32(out)
    offset = np.float32(0.5 if exact else 0.0)
    source = np.floor((np.arange(out, dtype=np.float32) + offset) * ratio).astype(np.int64)
    return np.minimum(source, size - 1)[:, None]


def _ratio(size, out, align_corners, scale, dtype):
    """ATen's area_pixel_compute_scale: input positions per output position, in `dtype`."""
    if align_corners:
        return dtype((size - 1) / (out - 1)) if out > 1 else dtype(0)
    return dtype(1 / scale) if scale is not None and scale > 0 else dtype(size) / dtype(out)


def _source_positions(size, out, align_corners, scale, dtype, cubic):
    """ATen's area_pixel_compute_source_index for every output position, computed in `dtype`."""
    index = np.arange(out).astype(dtype)
    ratio = _ratio(size, out, align_corners, scale, dtype)
    if align_corners:
        return ratio * index
    source = ratio * (index + dtype(0.5)) - dtype(0.5)
    return source if cubic else np.maximum(source, dtype(0))


def _linear_taps(size, out, align_corners, scale, dtype):
    source = _source_positions(size, out, align_corners, scale, dtype, cubic=False)
    low = np.minimum(np.floor(source).astype(np.int64), size - 1)
    high = low + (low < size - 1)
    frac = np.clip(source - low.astype(dtype), 0, 1).astype(dtype)
    return np.stack([low, high], axis=1), np.stack([1 - frac, frac], axis=1)


def _cubic_weights(t, a=_CUBIC_A):
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def _cubic_taps(size, out, align_corners, scale, dtype):
    source = _source_positions(size, out, align_corners, scale, dtype, cubic=True)
    low = np.floor(source).astype(np.int64)
    taps = np.clip(low[:, None] + np.arange(-1, 3)[None, :], 0, size - 1)
    return taps, _cubic_weights((source - low.astype(dtype)).astype(dtype)).astype(dtype)


def _resample_axis(x, axis, taps, weights):
    """Resample one dim of `x` by `taps` (out, k) mixed with `weights` (out, k), or by one tap without weights."""
    gathered = jnp.take(x, taps, axis=axis)  # the dim becomes (out, k)
    gathered = jnp.moveaxis(gathered, (axis, axis + 1), (-2, -1))
    mixed = gathered[..., 0] if weights is None else jnp.sum(gathered * weights.astype(x.dtype), axis=-1)
    return jnp.moveaxis(mixed, -1, axis)


def _resample(x, taps_per_dim):
    """Resample the trailing dims of `x`: for each, `(taps (out, k), weights (out, k) or None)`."""
    n = len(taps_per_dim)
    for axis, (taps, weights) in zip(range(x.ndim - n, x.ndim), taps_per_dim, strict=True):
        x = _resample_axis(x, axis, taps, weights)
    return x


def _triangle(x):
    """The antialiasing filter of bilinear resampling."""
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(x.dtype)


def _keys(x, a=-0.5):
    """The antialiasing filter of bicubic resampling (Keys' cubic with a = -0.5, as ATen's)."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(x.dtype)


def _antialias_taps(size, out, align_corners, scale, dtype, interp_size, kernel):
    """ATen's antialiased taps along one dim (`_compute_indices_min_size_weights_aa`): output i averages the inputs
    within `support` of its center under `kernel`, stretched by the downscale factor, weights normalized to sum 1.
    The mixed float/double arithmetic is ATen's (`+ 0.5` is a double there)."""
    ratio = _ratio(size, out, align_corners, scale, dtype)
    support = dtype(interp_size / 2) * ratio if ratio >= 1 else dtype(interp_size / 2)
    invscale = dtype(1) / ratio if ratio >= 1 else dtype(1)
    width = int(np.ceil(support)) * 2 + 1
    center = ratio * (np.arange(out).astype(dtype) + dtype(0.5))
    low = np.maximum(((center - support).astype(np.float64) + 0.5).astype(np.int64), 0)
    high = np.minimum(((center + support).astype(np.float64) + 0.5).astype(np.int64), size)
    count = np.clip(high - low, 0, width)
    offsets = np.arange(width)
    distance = ((low[:, None] + offsets).astype(dtype) - center[:, None]).astype(np.float64) + 0.5
    weights = np.where(offsets < count[:, None], kernel((distance * np.float64(invscale)).astype(dtype)), dtype(0))
    total = weights.sum(axis=1, dtype=dtype, keepdims=True)
    weights = (weights / np.where(total != 0, total, dtype(1))).astype(dtype)  # all-zero rows stay zero
    return np.minimum(low[:, None] + offsets, size - 1), weights


def _antialiased(self, output_size, align_corners, scales, interp_size, kernel):
    """Separable antialiased resampling of the trailing 2 dims, width first as ATen does."""
    if self.dtype == np.uint8:
        return image_uint8.resample(self, output_size, align_corners, scales, interp_size, antialias=True)
    x = upcast(self)
    dtype = np.dtype(x.dtype).type
    sizes = self.shape[-2:]
    for axis, size, out, scale in reversed(list(zip((-2, -1), sizes, output_size, scales, strict=True))):
        taps, weights = _antialias_taps(size, out, align_corners, scale, dtype, interp_size, kernel)
        x = _resample_axis(x, x.ndim + axis, taps, weights)
    return x


def _nearest(self, output_size, scales, exact):
    sizes = self.shape[-len(output_size) :]
    taps = [(_nearest_taps(s, o, sc, exact), None) for s, o, sc in zip(sizes, output_size, scales, strict=True)]
    return _resample(self, taps)


def _interpolate(self, output_size, align_corners, scales, make_taps):
    x = upcast(self)
    sizes = self.shape[-len(output_size) :]
    dtype = np.dtype(x.dtype).type
    taps = [make_taps(s, o, align_corners, sc, dtype) for s, o, sc in zip(sizes, output_size, scales, strict=True)]
    return _resample(x, taps)


def _linear(self, output_size, align_corners, scales):
    if self.dtype == np.uint8 and len(output_size) == 2:
        return image_uint8.resample(self, output_size, align_corners, scales, 2, antialias=False)
    return _interpolate(self, output_size, align_corners, scales, _linear_taps)


def _cubic(self, output_size, align_corners, scales):
    if self.dtype == np.uint8:
        return image_uint8.resample(self, output_size, align_corners, scales, 4, antialias=False)
    return _interpolate(self, output_size, align_corners, scales, _cubic_taps)


def _resampling(resample, aligns, output_size, rest):
    """`x -> resample(x, output_size, [align_corners,] scales)` from an upsampling op's trailing arguments `rest`
    (`[align_corners,] scales...`; scales left at their defaults may be absent)."""
    align, scales = (rest[:1], rest[1:]) if aligns else ((), rest)
    scales = tuple(scales) + (None,) * (len(output_size) - len(scales))
    return lambda x: resample(x, output_size, *align, scales)


def _upsample(resample, aligns, self, output_size, *rest):
    return _resampling(resample, aligns, output_size, rest)(self)


def _upsample_backward(resample, aligns, grad_output, output_size, input_size, *rest):
    return linear_adjoint(_resampling(resample, aligns, output_size, rest), grad_output, input_size)


# Each upsampling op (arguments `self, output_size, [align_corners,] scales...`) and its backward op (`grad_output,
# output_size, input_size, [align_corners,] scales...`, the exact adjoint) by how it resamples and whether it takes
# align_corners.
for _names, _how, _aligns in (
    (
        ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d"),
        functools.partial(_nearest, exact=False),
        False,
    ),
    (
        ("_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d"),
        functools.partial(_nearest, exact=True),
        False,
    ),
    (("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d"), _linear, True),
    (("upsample_bicubic2d",), _cubic, True),
    (("_upsample_bilinear2d_aa",), functools.partial(_antialiased, interp_size=2, kernel=_triangle), True),
    (("_upsample_bicubic2d_aa",), functools.partial(_antialiased, interp_size=4, kernel=_keys), True),
):
    lower(*(getattr(aten, name).default for name in _names))(functools.partial(_upsample, _how, _aligns))
    lower(*(getattr(aten, f"{name}_backward").default for name in _names))(
        functools.partial(_upsample_backward, _how, _aligns)
    )


@lower(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *batch, c, h, w = self.shape
    x = self.reshape(*batch, c // (r * r), r, r, h, w)
    x = jnp.moveaxis(x, (-4, -3), (-3, -1))  # (..., c, h, r, w, r)
    return x.reshape(*batch, c // (r * r), h * r, w * r)


@lower(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *batch, c, h, w = self.shape
    x = self.reshape(*batch, c, h // r, r, w // r, r)
    x = jnp.moveaxis(x, (-3, -1), (-4, -3))  # (..., c, r, r, h, w)
    return x.reshape(*batch, c * r * r, h // r, w // r)
