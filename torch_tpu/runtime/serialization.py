"""Storages made on or moved to `tpu`: `torch.UntypedStorage(..., device="tpu")`, `torch.load`,
`UntypedStorage.to(device="tpu")`, `.tpu()` and `.clone()`.

PyTorch's C++ storage constructor needs an allocator that a Python backend cannot register (it would crash on
a null one), and PyTorch's generic paths call it with `device="tpu"`. These hooks build the storage on the host
and move it through a `tpu` tensor instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.serialization
import torch.storage

from torch_tpu.runtime import compat


def storage_to_tpu(storage: torch.UntypedStorage, device: Any = None, non_blocking: bool = False) -> Any:
    """A `tpu` copy of a storage (untyped bytes)."""
    if storage.device.type == "tpu":
        return storage
    host = torch.empty(0, dtype=torch.uint8).set_(storage.untyped() if hasattr(storage, "untyped") else storage)
    return host.to("tpu").untyped_storage()


def _construct(cls: type, *args: Any, device: Any = None, **kwargs: Any) -> Any:
    """`UntypedStorage.__new__`: a `tpu` storage is made on the host with the same arguments, then moved."""
    if device is not None:
        if torch.device(device).type == "tpu":
            return storage_to_tpu(_new_storage(cls, *args, **kwargs))
        kwargs["device"] = device
    return _new_storage(cls, *args, **kwargs)


_new_storage = compat.new_storage
_new_like = compat.new_storage_like


def _new(self: Any) -> Any:
    """`UntypedStorage.new()`: an empty storage on the same device."""
    return _construct(type(self), device=self.device) if self.device.type == "tpu" else _new_like(self)


def _from_host(host: Any) -> Any:
    return host.to(device="tpu")


def _reducing_through_host(reduce: Callable) -> Callable:
    """A storage's `__reduce__` (pickle, `copy`): PyTorch's writes the bytes from C++, which cannot see a `tpu`
    buffer, so a `tpu` storage pickles as its host copy and is moved back when loaded."""

    def reduce_storage(self: Any) -> Any:
        return (_from_host, (self.cpu(),)) if self.device.type == "tpu" else reduce(self)

    return reduce_storage


def _deserialize(obj: Any, location: str) -> Any:
    if location.startswith("tpu"):
        torch.serialization._validate_device(location, "tpu")
        return storage_to_tpu(obj)
    return None


def _tag(obj: Any) -> str | None:
    return None


def install() -> None:
    """Register the `tpu` storage paths (once)."""
    if getattr(torch.storage._to, "__tpu__", False):
        return
    original = torch.storage._to

    def to(self: Any, device: torch.device, non_blocking: bool = False) -> Any:
        if device.type == "tpu":
            return storage_to_tpu(self, device, non_blocking)
        return original(self, device, non_blocking)

    to.__tpu__ = True
    torch.storage._to = to
    torch.storage._StorageBase.tpu = storage_to_tpu
    torch.UntypedStorage.__new__ = _construct
    torch.UntypedStorage.new = _new
    for cls in (torch.storage._StorageBase, torch.storage.TypedStorage):
        cls.__reduce__ = _reducing_through_host(cls.__reduce__)
    torch.serialization.register_package(15, _tag, _deserialize)
