"""Minimal tier: the kernels tensors need to exist (allocation, views, copies, scalars, resizing).

Views are PyTorch's own metadata kernels (the CPU ones, redispatched): they share the storage, so the device
buffer is shared and writes through any view reach the base, exactly as on CPU.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import deferred, platform, storage, strided

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

_METADATA_VIEWS = (
    aten.view.default,
    aten.as_strided.default,
    aten._reshape_alias.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    aten.unfold.default,
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Storage,
    aten.set_.source_Tensor,
)


def _metadata_kernel(op: torch._ops.OpOverload):
    """CPU's kernel of `op`, called without a Python frame of ours (views are the commonest ops of a step) where
    the release has the operator handle `OpOverload.redispatch` calls."""
    handle = getattr(op, "_handle", None)
    if handle is not None and hasattr(handle, "redispatch_boxed"):
        return functools.partial(handle.redispatch_boxed, _CPU_KEYS)
    return functools.partial(op.redispatch, _CPU_KEYS)


for _op in _METADATA_VIEWS:
    kernel(_op)(_metadata_kernel(_op))


def _strides_for(size: tuple[int, ...], memory_format: torch.memory_format | None) -> tuple[int, ...]:
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return storage.contiguous_strides(size)
    return torch.empty(size, device="meta", memory_format=memory_format).stride()


@kernel(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None) -> torch.Tensor:
    platform.check_device(device)
    size = tuple(size)
    return storage.empty(size, dtype or torch.get_default_dtype(), _strides_for(size, memory_format))


@kernel(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    platform.check_device(device)
    return storage.empty(tuple(size), dtype or torch.get_default_dtype(), tuple(stride))


@kernel(aten.set_.default)
def set_empty(self: torch.Tensor) -> torch.Tensor:
    fresh = storage.empty((0,), self.dtype)
    return aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYS, self, fresh.untyped_storage(), 0, (0,), (1,))


def _value_of(tensor: torch.Tensor):
    """The tensor's logical value, on the device."""
    return storage.value(tensor) if tensor.device.type == "tpu" else storage.to_device(tensor.resolve_conj())


@kernel(aten._copy_from.default)
def copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if dst.device.type == "tpu":
        storage.write(dst, _value_of(self))
    else:
        value = _value_of(self)
        dst.copy_(storage.to_host(value, self.dtype))
    return dst


@kernel(aten.copy_.default)
def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """`self.copy_(src)` with either on the host; writes honour `self`'s conjugate and negative bits."""
    return copy_from(src, self, non_blocking)


@kernel(aten._to_copy.default)
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """A copy on `device` (default: tpu) in `dtype`; host copies need no pinned memory."""
    dtype = dtype or self.dtype
    if device is not None and torch.device(device).type != "tpu":
        host = storage.to_host(_value_of(self), self.dtype)
        return host.to(device=device, dtype=dtype)
    platform.check_device(device)
    return storage.wrap(_value_of(self), dtype)


@kernel(aten._copy_from_and_resize.default)
def copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    dst.resize_(self.shape)
    return copy_from(self, dst)


@kernel(aten._local_scalar_dense.default)
def local_scalar_dense(self: torch.Tensor) -> bool | int | float | complex:
    return storage.to_host(_value_of(self), self.dtype).item()


@kernel(aten.resize_.default)
def resize_(self: torch.Tensor, size, *, memory_format=None) -> torch.Tensor:
    size = tuple(size)
    if memory_format is None and size == tuple(self.shape):  # as on CPU, a view (an `out=`) keeps its strides
        return self
    stride = _strides_for(size, memory_format)
    offset = self.storage_offset()
    needed = storage.storage_nbytes(size, stride, self.element_size()) + offset * self.element_size()
    target = self.untyped_storage()
    buffer = storage.buffer_of(self)
    if needed > buffer.nbytes:
        old = strided.bitcast_flat(deferred.concrete(buffer.array).reshape(-1), np.dtype(np.uint8))
        grown = jnp.concatenate([old, jnp.zeros((needed - buffer.nbytes,), np.uint8)])
        target = storage.wrap(grown).untyped_storage()
    return aten.set_.source_Storage_storage_offset.redispatch(_CPU_KEYS, self, target, offset, size, stride)


@kernel(aten.equal.default)
def equal(self: torch.Tensor, other: torch.Tensor) -> bool:
    if self.shape != other.shape:
        return False
    return bool(torch.eq(self, other).all().item())


@kernel(aten.record_stream.default)
def record_stream(self: torch.Tensor, stream: torch.Stream) -> None:
    """Streams are ordered by JAX's dispatch; nothing to record."""


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lower(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)


@lower(aten.clone.default)
def clone(self, *, memory_format=None):
    return self


@lower(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return self
