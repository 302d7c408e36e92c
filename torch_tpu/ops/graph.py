"""Lowerings used only inside compiled graphs: views as values, allocation and copies.

In eager these ops are direct kernels (a view must share its storage); in a functional ATen graph from
AOTAutograd they are ordinary values, so each is a small JAX function. Views assume their input is a
contiguous value, which is what every graph value is.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.ops.registry import aten, lower_in_graphs
from torch_tpu.runtime import dtypes, trace_context
from torch_tpu.runtime.strided import bitcast_flat, flat_indices


def _dtype(dtype, default=None):
    if dtype is None:
        dtype = default if default is not None else trace_context.default_dtype()
    return dtypes.to_jax(dtype) if isinstance(dtype, torch.dtype) else dtype


@lower_in_graphs(aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default)
def view(self, size, stride=None):
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = self.size // known if known else 0
    return jnp.reshape(self, size)


@lower_in_graphs(aten.permute.default)
def permute(self, dims):
    return jnp.transpose(self, [d % max(self.ndim, 1) for d in dims])


@lower_in_graphs(aten.expand.default)
def expand(self, size, *, implicit=False):
    offset = len(size) - self.ndim
    shape = [self.shape[i - offset] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(self, shape)


@lower_in_graphs(aten.unsqueeze.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, dim % (self.ndim + 1))


@lower_in_graphs(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(self, dim=None):
    dims = range(self.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    axes = tuple(d % self.ndim for d in dims if self.ndim and self.shape[d % self.ndim] == 1)
    return jnp.squeeze(self, axes) if axes else self


@lower_in_graphs(aten.select.int)
def select(self, dim, index):
    return jnp.take(self, index % self.shape[dim], axis=dim)


@lower_in_graphs(aten.slice.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    size = self.shape[dim]
    start, end, _ = slice(start, end).indices(size)
    return jax.lax.slice_in_dim(self, start, max(start, end), step, axis=dim)


@lower_in_graphs(aten.diagonal.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, dim1, dim2)


@lower_in_graphs(aten.unfold.default)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return jnp.reshape(self, (1,))
    count = (self.shape[dimension] - size) // step + 1
    windows = jnp.stack(
        [jax.lax.slice_in_dim(self, i * step, i * step + size, axis=dimension) for i in range(count)], axis=dimension
    )
    return jnp.moveaxis(windows, dimension + 1, -1)


@lower_in_graphs(aten.as_strided.default)
def as_strided(self, size, stride, storage_offset=None):
    flat = self.reshape(-1)
    return flat[flat_indices(tuple(size), tuple(stride), storage_offset or 0)]


@lower_in_graphs(aten.split_with_sizes.default)
def split_with_sizes(self, split_sizes, dim=0):
    bounds = np.cumsum(split_sizes)[:-1].tolist()
    return tuple(jnp.split(self, bounds, axis=dim))


@lower_in_graphs(aten.alias.default, aten.detach.default)
def alias(self):
    return self


@lower_in_graphs(aten.view_as_real.default)
def view_as_real(self):
    return jnp.stack([self.real, self.imag], axis=-1)


@lower_in_graphs(aten.view_as_complex.default)
def view_as_complex(self):
    return jax.lax.complex(self[..., 0], self[..., 1])


@lower_in_graphs(aten.view.dtype)
def view_dtype(self, dtype):
    target = dtypes.to_jax(dtype)
    shape = self.shape[:-1] + ((self.shape[-1] * self.dtype.itemsize // target.itemsize),) if self.ndim else ()
    return bitcast_flat(self.reshape(-1), target).reshape(shape)


@lower_in_graphs(aten._to_copy.default)
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return self if dtype is None else self.astype(dtypes.to_jax(dtype))


@lower_in_graphs(aten.copy.default)
def copy(self, src, non_blocking=False):
    return jnp.broadcast_to(src, self.shape).astype(self.dtype)


@lower_in_graphs(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(size, _dtype(dtype))


@lower_in_graphs(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, _dtype(dtype))


@lower_in_graphs(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, _dtype(dtype, self.dtype))


@lower_in_graphs(aten.new_empty.default)
def new_empty(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, _dtype(dtype, self.dtype))


@lower_in_graphs(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(size, fill_value, _dtype(dtype))


@lower_in_graphs(aten.full_like.default)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(self.shape, fill_value, _dtype(dtype, self.dtype))


@lower_in_graphs(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, _dtype(dtype))


@lower_in_graphs(aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(
        start,
        end,
        step,
        dtype=_dtype(dtype, torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else None),
    )


@lower_in_graphs(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, _dtype(dtype))
