"""Lowerings: shape ops that copy (concatenate, flip, roll, repeat, pad) and the scatters autograd uses to
send a view's gradient back into its base (`slice_backward`, `select_scatter`, `unfold_backward`, ...)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.registry import aten, lower


def wrap_dim(dim, ndim):
    """`dim` counted from 0 (a negative one from the end); 0 for a 0-d tensor, as ATen wraps it."""
    return dim % ndim if ndim else 0


def _is_legacy_empty(tensor):
    """PyTorch's `cat` skips 1-D empty tensors whatever the other inputs' shapes."""
    return jnp.ndim(tensor) == 1 and jnp.shape(tensor)[0] == 0


@lower(aten.cat.default)
def cat(tensors, dim=0):
    kept = [t for t in tensors if not _is_legacy_empty(t)]
    if not kept:
        return jnp.concatenate(tensors)
    return jnp.concatenate([jnp.asarray(t) for t in kept], axis=dim)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=dim)


@lower(aten.flip.default)
def flip(self, dims):
    return jnp.flip(self, tuple(dims)) if dims and self.ndim else self  # a 0-dim tensor flips to itself, as on CPU


@lower(aten.roll.default)
def roll(self, shifts, dims=()):
    return jnp.roll(self, tuple(shifts), tuple(dims) if dims else None)


@lower(aten.repeat.default)
def repeat(self, repeats):
    return jnp.tile(self, tuple(repeats))


def _pad_widths(ndim, pad):
    """PyTorch's flat pad list (last dimension first, (before, after) pairs) as one pair per dimension."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    config = [(lo, hi, 0) for lo, hi in _pad_widths(self.ndim, pad)]
    return jax.lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


def _pad(self, padding, mode):
    """Reflection or replication padding; a negative width crops, after the other side is padded (as in ATen,
    whose padded positions are placed relative to the uncropped input)."""
    widths = _pad_widths(self.ndim, padding)
    padded = jnp.pad(self, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)
    return padded[tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(widths, padded.shape, strict=True))]


def _pad_backward(grad_output, self, padding, mode):
    _, pullback = jax.vjp(functools.partial(_pad, padding=padding, mode=mode), jnp.zeros_like(self))
    return pullback(grad_output)[0]


for _mode, _ops, _backward_ops in (
    (
        "reflect",
        (aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default),
        (
            aten.reflection_pad1d_backward.default,
            aten.reflection_pad2d_backward.default,
            aten.reflection_pad3d_backward.default,
        ),
    ),
    (
        "edge",
        (aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default),
        (
            aten.replication_pad1d_backward.default,
            aten.replication_pad2d_backward.default,
            aten.replication_pad3d_backward.default,
        ),
    ),
):
    lower(*_ops)(functools.partial(_pad, mode=_mode))
    lower(*_backward_ops)(functools.partial(_pad_backward, mode=_mode))


@lower(aten.narrow_copy.default)
def narrow_copy(self, dim, start, length):
    dim = wrap_dim(dim, self.ndim)
    start = start % self.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(self, start, start + length, axis=dim)


def _diagonal_positions(length, offset):
    rows = np.arange(length) + max(-offset, 0)
    return rows, rows + offset


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = wrap_dim(dim1, self.ndim), wrap_dim(dim2, self.ndim)
    moved = jnp.moveaxis(self, (dim1, dim2), (-2, -1))
    rows, cols = _diagonal_positions(src.shape[-1], offset)
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@lower(aten.diagonal_backward.default)
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(jnp.zeros(input_sizes, grad_output.dtype), grad_output, offset, dim1, dim2)


@lower(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    dim = wrap_dim(dim, self.ndim)
    index = index % self.shape[dim] if index < 0 else index
    return self.at[(slice(None),) * dim + (index,)].set(src.astype(self.dtype))


@lower(aten.select_backward.default)
def select_backward(grad_output, input_sizes, dim, index):
    return select_scatter(jnp.zeros(input_sizes, grad_output.dtype), grad_output, dim, index)


@lower(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = wrap_dim(dim, self.ndim)
    return self.at[(slice(None),) * dim + (slice(start, end, step),)].set(src.astype(self.dtype))


@lower(aten.slice_backward.default)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    return slice_scatter(jnp.zeros(input_sizes, grad_output.dtype), grad_output, dim, start, end, step)


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    index = np.full(tuple(size), storage_offset or 0, np.int64)
    for axis, (n, step) in enumerate(zip(size, stride, strict=True)):
        index = index + (np.arange(n) * step).reshape([n if a == axis else 1 for a in range(len(size))])
    flat = self.reshape(-1).at[index.reshape(-1)].set(src.reshape(-1).astype(self.dtype))
    return flat.reshape(self.shape)


@lower(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    if not input_sizes:  # a 0-d input unfolds into its one element
        return jnp.sum(grad_in).reshape(())
    dim = wrap_dim(dim, len(input_sizes))
    index = np.arange(grad_in.shape[dim])[:, None] * step + np.arange(size)[None, :]
    grad = jnp.moveaxis(grad_in, -1, dim + 1)
    return jnp.zeros(input_sizes, grad_in.dtype).at[(slice(None),) * dim + (index,)].add(grad)


@functools.partial(jax.jit, static_argnums=1)
def _repeat_indices(repeats, total):
    return jnp.repeat(jnp.arange(repeats.shape[0]), repeats, total_repeat_length=total)


@lower(aten.repeat_interleave.Tensor, jit=False)
def repeat_interleave(repeats, *, output_size=None):
    total = int(jnp.sum(repeats)) if output_size is None else output_size
    return _repeat_indices(repeats, total).astype(repeats.dtype)
