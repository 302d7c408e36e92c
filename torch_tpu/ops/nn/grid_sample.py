"""Lowerings: grid sampling (`F.grid_sample`) over 2-d and 3-d inputs and its backward ops.

Follows ATen's GridSampler: grid coordinates in [-1, 1] (x, y[, z] = width, height[, depth]) are unnormalized to
pixel positions, then the padding mode (zeros, border, reflection) maps them into the input before bilinear or
nearest sampling; bicubic (2-d only) applies the padding mode to each of its 4x4 integer taps instead. Taps outside
the input read 0. Clipping and reflection are written with `where`, so their gradients are CPU's (0 at and past a
clipped edge, the sign of the reflection elsewhere). The backward ops are `jax.vjp` of the forward.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.nn.common import masked, upcast
from torch_tpu.ops.registry import aten, lower

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
_CUBIC_A = -0.75


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(coord, size):
    """Clamp into [0, size - 1]; the gradient is 0 at and beyond either end, as in ATen's `clip_coordinates`."""
    return jnp.where(coord <= 0, 0, jnp.where(coord >= size - 1, size - 1, coord))


def _reflect(coord, twice_low, twice_high):
    """ATen's `reflect_coordinates`: fold `coord` into [low, high] by repeated reflection at the ends."""
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = coord - low
    coord = jnp.where(coord < 0, -coord, coord)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad(coord, size, padding_mode, align_corners):
    """ATen's `compute_coordinates`: the position a padding mode reads for `coord`."""
    if padding_mode == BORDER:
        return _clip(coord, size)
    if padding_mode == REFLECTION:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return _clip(_reflect(coord, *twice), size)
    return coord


def _read(x, taps, weights):
    """The sum over K taps per output of `x[n, :, tap...]` times the tap's weight, reading 0 outside the input:
    `taps` holds one integer array shaped (K, N, *out) per spatial dim, `weights` is (K, N, *out); returns
    (N, C, *out). One gather for all taps keeps the program, and its transpose (a scatter), small."""
    sizes = x.shape[2:]
    inside, flat = True, 0
    for tap, size, stride in zip(taps, sizes, np.cumprod((1,) + sizes[:0:-1])[::-1], strict=True):
        inside = inside & (tap >= 0) & (tap < size)
        flat = flat + jnp.clip(tap, 0, size - 1) * int(stride)
    count, batch, *out = flat.shape
    index = jnp.moveaxis(flat, 1, 0).reshape(batch, 1, -1)  # (N, 1, K * out)
    index = jnp.broadcast_to(index, (batch, x.shape[1], index.shape[2]))
    values = jnp.take_along_axis(x.reshape(x.shape[:2] + (-1,)), index, axis=2)
    values = values.reshape((batch, x.shape[1], count, *out))
    weights = jnp.moveaxis(jnp.where(inside, weights, 0), 1, 0)[:, None]  # (N, 1, K, *out)
    return jnp.sum(values * weights, axis=2)


def _linear(x, coords):
    """Multilinear interpolation at the padded positions `coords` (per spatial dim, (N, *out))."""
    lows = [jnp.floor(c) for c in coords]
    corners = list(itertools.product((0, 1), repeat=len(coords)))
    weights = []
    for corner in corners:
        weight = 1
        for c, low, high in reversed(list(zip(coords, lows, corner, strict=True))):  # x, y[, z], as ATen
            weight = weight * (c - low if high else low + 1 - c)
        weights.append(weight)
    taps = [jnp.stack([low + corner[d] for corner in corners]).astype(jnp.int32) for d, low in enumerate(lows)]
    return _read(x, taps, jnp.stack(weights))


def _nearest(x, coords):
    return _read(x, [jnp.round(c).astype(jnp.int32)[None] for c in coords], jnp.ones((1,) + coords[0].shape, x.dtype))


def _cubic_coefficients(t):
    a = _CUBIC_A

    def near(s):  # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):  # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _bicubic(x, coords, padding_mode, align_corners):
    """Bicubic interpolation at unpadded positions `coords` = (y, x) over 4x4 taps, each read through the padding
    mode."""
    (y, x_), (height, width) = coords, x.shape[2:]
    y0, x0 = jnp.floor(y), jnp.floor(x_)
    wy, wx = _cubic_coefficients(y - y0), _cubic_coefficients(x_ - x0)

    def taps(low, size):  # the 4 positions around `low`, read through the padding mode
        return [_pad(low - 1 + i, size, padding_mode, align_corners).astype(jnp.int32) for i in range(4)]

    rows, columns = taps(y0, height), taps(x0, width)
    weights = jnp.stack([row * column for row in wy for column in wx])
    return _read(x, [jnp.stack([r for r in rows for _ in range(4)]), jnp.stack(columns * 4)], weights)


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    x, grid = upcast(input), upcast(grid)
    sizes = x.shape[2:]
    # grid's last axis is (x, y[, z]): spatial dim d (depth, height, width order) reads component n - 1 - d
    coords = [_unnormalize(grid[..., len(sizes) - 1 - d], size, align_corners) for d, size in enumerate(sizes)]
    if interpolation_mode == BICUBIC:
        return _bicubic(x, coords, padding_mode, align_corners)
    coords = [_pad(c, size, padding_mode, align_corners) for c, size in zip(coords, sizes, strict=True)]
    return _nearest(x, coords) if interpolation_mode == NEAREST else _linear(x, coords)


@lower(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    def forward(x, g):
        return _grid_sample(x, g, interpolation_mode, padding_mode, align_corners)

    _, pullback = jax.vjp(forward, upcast(input), upcast(grid))
    return masked(output_mask, *pullback(upcast(grad_output)))
