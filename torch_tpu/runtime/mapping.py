"""How a `tpu` tensor maps onto its storage's buffer: the one classifier that reads, writes and eager dispatch share.

A mapping is a tuple `(kind, dtype, shape, stride, offset)`, the tensor's jax dtype, shape, strides and storage
offset (in elements) being the parameters a strided read or write needs:
- `WHOLE` (the constant `WHOLE_BUFFER`, no parameters): the tensor is the buffer's array as it is — read it, replace
  it, or pass it to an executable, without any work;
- `RESHAPE`: all of the buffer, in order, at its dtype, in another shape (or the buffer is not written yet): a read
  is a reshape and a write replaces the array;
- `VIEW`: a strided view of the buffer at its dtype (a slice, `t()`, `select`, `expand`, ...): an executable can
  take the buffer's array and read the view itself (`strided.read_view`), at any offset;
- `GATHER`: a view at another dtype (storages are untyped bytes): its elements are gathered from the bytes.
A tensor's conjugate and negative bits are not part of its mapping: `storage.read` gives the stored elements and
`storage.value` applies the bits; eager dispatch reads a tensor with bits set through `storage.value`.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import torch

from torch_tpu.runtime import dtypes

WHOLE, RESHAPE, VIEW, GATHER = "whole", "reshape", "view", "gather"
WHOLE_BUFFER = (WHOLE, None, None, None, None)
_JAX_DTYPE = collections.defaultdict(lambda: None, dtypes.JAX_DTYPES)  # None for a dtype the device lacks


def classify(tensor: torch.Tensor, buffer: Any, size: torch.Size, dtype: torch.dtype) -> tuple:
    """The mapping of `tensor`, of shape `size` and dtype `dtype`, onto `buffer` (its storage's `DeviceBuffer`):
    `WHOLE_BUFFER` or a new tuple. (Callers pass the shape and dtype they read anyway: on the eager hot path each
    read of `tensor.shape` makes a new `torch.Size`.)

    The common case is tested first and costs three comparisons: a buffer's `shape` is its array's (None while
    unwritten), the array fills its storage and PyTorch keeps every view within the storage, so a contiguous tensor
    of the array's shape and dtype is the whole buffer (its offset 0, or no elements at all)."""
    if buffer.shape == size and buffer.dtype is _JAX_DTYPE[dtype] and tensor.is_contiguous():
        return WHOLE_BUFFER
    jdtype = _JAX_DTYPE[dtype]
    shape = tuple(size)
    stride = tuple(tensor.stride())
    offset = tensor.storage_offset()
    if jdtype is None or buffer.dtype != jdtype:  # (never `==` with None: numpy reads None as float64)
        return (GATHER, dtypes.to_jax(dtype), shape, stride, offset)
    if tensor.is_contiguous():
        if buffer.shape == shape:  # a dtype equal to the buffer's but not the same object
            return WHOLE_BUFFER
        if not offset and math.prod(shape) * jdtype.itemsize == buffer.nbytes:
            return (RESHAPE, jdtype, shape, stride, 0)
    return (VIEW, jdtype, shape, stride, offset)
