"""Storages moving to `tpu`: `torch.load`, `UntypedStorage.to(device="tpu")` and `.tpu()`.

PyTorch's generic paths build the target with `torch.UntypedStorage(n, device="tpu")`, which needs a C++
allocator that a Python backend cannot register. These hooks build it from a `tpu` tensor instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.serialization
import torch.storage


def storage_to_tpu(storage: torch.UntypedStorage, device: Any = None, non_blocking: bool = False) -> Any:
    """A `tpu` copy of a storage (untyped bytes)."""
    if storage.device.type == "tpu":
        return storage
    host = torch.empty(0, dtype=torch.uint8).set_(storage.untyped() if hasattr(storage, "untyped") else storage)
    return host.to("tpu").untyped_storage()


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
    torch.serialization.register_package(15, _tag, _deserialize)
