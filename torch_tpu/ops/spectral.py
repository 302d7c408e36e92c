"""Lowerings: discrete Fourier transforms. `torch.fft.*`, `stft` and `istft` all reach the three ATen kernels here.

Each transform is unnormalized; `normalization` then scales by 1/sqrt(n) (1) or 1/n (2), n the number of
elements of one signal (the input's for r2c and c2c, the output's for c2r), as PyTorch's `fft_norm_mode`.
"""

import math

import jax.numpy as jnp

from torch_tpu.ops.registry import aten, lower


def _normalized(x, signal_size, normalization):
    if normalization == 0:
        return x
    return x * (1 / math.sqrt(signal_size) if normalization == 1 else 1 / signal_size)


def _signal_size(shape, dim):
    return math.prod(shape[d] for d in dim)


@lower(aten._fft_r2c.default)
def _fft_r2c(self, dim, normalization, onesided):
    dim = tuple(dim)
    out = jnp.fft.rfftn(self, axes=dim) if onesided else jnp.fft.fftn(self, axes=dim)
    return _normalized(out, _signal_size(self.shape, dim), normalization)


@lower(aten._fft_c2c.default)
def _fft_c2c(self, dim, normalization, forward):
    dim = tuple(dim)
    if not dim:
        return self
    out = jnp.fft.fftn(self, axes=dim) if forward else jnp.fft.ifftn(self, axes=dim, norm="forward")
    return _normalized(out, _signal_size(self.shape, dim), normalization)


@lower(aten._fft_c2r.default)
def _fft_c2r(self, dim, normalization, last_dim_size):
    dim = tuple(dim)
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=dim, norm="forward")
    return _normalized(out, math.prod(sizes), normalization)
