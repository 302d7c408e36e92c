"""Helpers shared by the neural-network lowerings: sliding windows, accumulation dtypes, reductions."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_tpu.runtime import dtypes

MEAN, SUM = 1, 2  # ATen's Reduction enum (0 is `none`)


def expand(values, n):
    """An `int[n]` argument as a tuple of n ints (ATen accepts one value for all spatial dims)."""
    values = tuple(values)
    return values * n if len(values) == 1 else values


upcast = dtypes.upcast  # the compute dtype of half types is float32, as on CPU (runtime/dtypes.py)


def reduce_loss(loss, reduction):
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss


def loss_scale(grad_output, numel, reduction):
    """The gradient factor of each element of an elementwise loss: grad_output, divided by numel for `mean`."""
    return grad_output / numel if reduction == MEAN else grad_output


def masked(output_mask, *grads):
    """`grads`, undefined (None) where `output_mask` does not ask for them; jit drops the unused computation."""
    return tuple(grad if wanted else None for grad, wanted in zip(grads, output_mask, strict=True))


def linear_adjoint(forward, cotangent, input_shape):
    """The transpose of the linear map `forward` (over inputs shaped `input_shape`) applied to `cotangent`,
    accumulated in float32 for half types: the input gradient of pooling, resampling and im2col."""
    cotangent = upcast(cotangent)
    _, pullback = jax.vjp(forward, jnp.zeros(tuple(input_shape), cotangent.dtype))
    return pullback(cotangent)[0]


def pool_output_size(size, kernel, stride, padding, dilation, ceil_mode):
    """ATen's pooling output length for one spatial dim (a window must start inside the left-padded input)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def padded_windows(x, kernel, stride, padding, dilation, out, value):
    """All pooling windows of the trailing spatial dims: shape `x.shape[:-n] + out + (prod(kernel),)`.

    `x` is padded with `value` (`padding` on the left, as much as the last window needs on the right).
    """
    n = len(kernel)
    pads = [(0, 0, 0)] * (x.ndim - n)
    for size, k, s, p, d, o in zip(x.shape[-n:], kernel, stride, padding, dilation, out, strict=True):
        pads.append((p, max((o - 1) * s + d * (k - 1) + 1 - size - p, 0), 0))
    x = lax.pad(x, jnp.asarray(value, x.dtype), pads)
    windows = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        start = [0] * (x.ndim - n) + [i * d for i, d in zip(offsets, dilation, strict=True)]
        limit = list(x.shape[:-n]) + [b + (o - 1) * s + 1 for b, o, s in zip(start[-n:], out, stride, strict=True)]
        windows.append(lax.slice(x, start, limit, [1] * (x.ndim - n) + list(stride)))
    return jnp.stack(windows, axis=-1)


def window_positions(size, kernel, stride, padding, dilation, out):
    """Input position of each window element along one dim, shape (out, kernel), and whether it is real."""
    positions = np.arange(out)[:, None] * stride - padding + np.arange(kernel)[None, :] * dilation
    return positions, (positions >= 0) & (positions < size)


def window_grid(positions, valids, sizes):
    """Per-dim window positions (out_i, k_i) -> the flat in-plane index of every window element and whether it
    is real, both shaped `out + (prod(k),)` in the element order of `padded_windows`."""
    n = len(positions)
    flat, valid = np.zeros((), np.int64), np.ones((), bool)
    for axis, (pos, ok) in enumerate(zip(positions, valids, strict=True)):
        shape = [1] * (2 * n)
        shape[axis], shape[n + axis] = pos.shape
        flat = flat + pos.reshape(shape) * int(np.prod(sizes[axis + 1 :], dtype=np.int64))
        valid = valid & ok.reshape(shape)
    out = tuple(p.shape[0] for p in positions)
    return flat.reshape(out + (-1,)), valid.reshape(out + (-1,))


def max_with_indices(windows, flat, valid):
    """Max over the last axis of `windows` and the flat input index of the element PyTorch's scan keeps: the first
    real one holding the max, or the last NaN."""
    values = jnp.max(windows, axis=-1)
    hit = valid & ((windows == values[..., None]) | jnp.isnan(windows))
    first, last = jnp.argmax(hit, axis=-1), hit.shape[-1] - 1 - jnp.argmax(hit[..., ::-1], axis=-1)
    arg = jnp.where(jnp.isnan(values), last, first)
    indices = jnp.take_along_axis(jnp.broadcast_to(flat, windows.shape), arg[..., None], axis=-1)[..., 0]
    return values, indices
