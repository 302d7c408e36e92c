"""PyTorch's accelerator hooks for `tpu`: the PrivateUse1 hooks and guard objects, and the few
`torch.accelerator` entry points that the Python device guard cannot serve.

The Python guard implements only `type_`, so `torch.accelerator.synchronize()` and the memory queries would
fail or read zero. `install()` wraps exactly those functions: for the `tpu` accelerator they call `torch.tpu`;
for any other they call PyTorch's own, unchanged.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.accelerator
import torch.accelerator.memory

from torch_tpu.runtime import compat


class Hooks(compat.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class Guard(compat.DeviceGuard):
    def type_(self) -> object:
        return compat.PRIVATEUSE1_DEVICE_TYPE


def _is_tpu(device: object) -> bool:
    if device is None:
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == "tpu"
    if isinstance(device, int):
        return _is_tpu(None)
    return torch.device(device).type == "tpu"


def _route(original: Callable, replacement: Callable) -> Callable:
    @functools.wraps(original)
    def routed(device=None, /):
        return replacement(device) if _is_tpu(device) else original(device)

    routed.__wrapped_original__ = original
    return routed


def _memory_stats(device=None) -> OrderedDict:
    from torch_tpu.runtime.storage import memory

    return OrderedDict(
        [
            ("allocated_bytes.all.current", memory.allocated),
            ("allocated_bytes.all.peak", memory.peak),
            ("num_alloc_retries", 0),
            ("num_device_alloc", memory.num_alloc),
            ("num_device_free", memory.num_free),
        ]
    )


def _reset_peak(device=None) -> None:
    from torch_tpu.runtime.storage import memory

    memory.reset_peak()


def install(synchronize: Callable) -> None:
    """Route `torch.accelerator.synchronize` (to `synchronize`, i.e. `torch.tpu.synchronize`: it is passed in
    because it lives above this layer, in eager) and the memory statistics to the tpu device's."""
    if hasattr(torch.accelerator.synchronize, "__wrapped_original__"):
        return
    torch.accelerator.synchronize = _route(torch.accelerator.synchronize, synchronize)
    for module in (torch.accelerator, torch.accelerator.memory):
        module.memory_stats = _route(torch.accelerator.memory.memory_stats, _memory_stats)
        module.reset_peak_memory_stats = _route(torch.accelerator.memory.reset_peak_memory_stats, _reset_peak)
