"""Many tensors at once: a compiled graph's arguments read as arrays, and the values it computed for the tensors it
mutates written back.

An optimizer step's graph takes and updates hundreds of tensors a call (a 4-layer GPT's AdamW: 260 in, 208 written
back), so a few microseconds a tensor is most of the step's host time on the chip. Reading tests the common case
inline — a contiguous tensor that is its storage's whole array, read as it is — and the write-back replaces the
array of each buffer so read, with no second test; anything else (views, other dtypes, conjugate or negative
bits, host tensors) goes to `storage`, which does the same thing the general way.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import jax
import torch

from torch_tpu.runtime import storage
from torch_tpu.runtime.mapping import RESHAPE, WHOLE_BUFFER, classify

_ATTR = storage._ATTR
_Tensor = torch.Tensor
_STRIDED = torch.strided


def _whole(tensor: torch.Tensor, buffer: Any) -> bool:
    """Whether `tensor` is all of `buffer`'s array as it is, with no lazy conjugate or negative bit to apply."""
    return (
        classify(tensor, buffer, tensor.shape, tensor.dtype) is WHOLE_BUFFER
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


def read(
    args: Sequence[Any], kept: Sequence[int], as_stored: Collection[int] = ()
) -> tuple[list[Any], list[Any], list[int]]:
    """The values of `args[i]` for each i in `kept`, as an executable takes them (a `tpu` tensor's logical value,
    a host tensor copied to the device, anything else as it is); for each, the storage's `DeviceBuffer` where the
    value is the very array it holds (which a donation may then consume in place, and `write_back` replace), else
    None; and the positions of the values given as stored: an argument in `as_stored` that is all of its
    storage's array in another shape (a `view` of an op's result) is that array as it is, for the program to
    reshape, where reading it would copy it."""
    values: list[Any] = []
    buffers: list[Any] = []
    stored: list[int] = []
    for index in kept:
        value = args[index]
        whole = None
        if isinstance(value, _Tensor):
            buffer = getattr(value.untyped_storage(), _ATTR, None) if value.layout is _STRIDED else None
            if buffer is None:
                value = storage.value(value) if value.device.type == "tpu" else storage.to_device(value)
            elif (array := buffer._array) is not None and _whole(value, buffer):
                value, whole = array, buffer
            elif index in as_stored and _reshaped(value, buffer):
                stored.append(len(values))
                value = array
            else:
                value = storage.value(value)
        values.append(value)
        buffers.append(whole)
    return values, buffers, stored


def _reshaped(tensor: torch.Tensor, buffer: Any) -> bool:
    """Whether `tensor` is all of `buffer`'s computed array in order, in another shape (`RESHAPE`), with no lazy
    conjugate or negative bit to apply."""
    if not isinstance(buffer._array, jax.Array) or tensor.is_conj() or tensor.is_neg():
        return False
    return classify(tensor, buffer, tensor.shape, tensor.dtype)[0] == RESHAPE


def write_back(targets: Sequence[torch.Tensor], values: Sequence[jax.Array], buffers: Sequence[Any]) -> None:
    """Store each computed value into its target tensor, as `storage.write` would (a host target is copied to).

    `buffers[i]`: the buffer target i was read from as all of its array (`read`) where values[i] has that
    array's shape and dtype (the program's output traced with the input's layout), whose array it then replaces
    as it is; else None."""
    for target, value, buffer in zip(targets, values, buffers, strict=True):
        if buffer is not None:
            buffer._array = value
        elif target.device.type == "tpu":
            storage.write(target, value)
        else:
            target.copy_(storage.to_host(value, target.dtype))
