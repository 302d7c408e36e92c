"""PyTorch's accelerator hooks for `tpu`: the PrivateUse1 hooks and guard objects, and the few
`torch.accelerator` entry points that the Python device guard cannot serve.

The Python guard implements only `type_`, so `torch.accelerator.synchronize()` and the memory functions would
fail or read zero. `install()` wraps exactly those functions: for the `tpu` accelerator they call `torch.tpu`'s
(`runtime.memory`); for any other they call PyTorch's own, unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.accelerator
import torch.accelerator.memory

from torch_tpu.runtime import compat, memory, platform


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
        return replacement(_index(device)) if _is_tpu(device) else original(device)

    routed.__wrapped_original__ = original
    return routed


def _route_current(original: Callable, replacement: Callable) -> Callable:
    """`_route` for a function of the current accelerator only (no device argument)."""

    @functools.wraps(original)
    def routed():
        return replacement(0) if _is_tpu(None) else original()

    routed.__wrapped_original__ = original
    return routed


def _index(device: object) -> int:
    """The process's device index of a tpu `device` (None, an index, a string or a torch.device)."""
    if device is None:
        return 0
    return platform.own_index(device if isinstance(device, int) else torch.device(device).index)


# The `torch.accelerator` memory functions that reach PyTorch's C++ DeviceAllocator, which a Python backend cannot
# register (for tpu they hit "Allocator for tpu is not a DeviceAllocator"): memory_allocated, max_memory_allocated,
# memory_reserved and max_memory_reserved read memory_stats, so routing it serves them too.
_ROUTED = {
    "memory_stats": memory.stats,
    "reset_peak_memory_stats": lambda index: memory.memory.reset_peak(),
    "reset_accumulated_memory_stats": lambda index: memory.memory.reset_accumulated(),
    "get_memory_info": memory.mem_get_info,
}


def register() -> None:
    """Register the PrivateUse1 hooks and device guard with torch (`Hooks`, `Guard`)."""
    compat.register_hooks(Hooks())
    compat.register_device_guard(Guard())


def install(synchronize: Callable) -> None:
    """Route `torch.accelerator.synchronize` (to `synchronize`, i.e. `torch.tpu.synchronize`: it is passed in
    because it lives above this layer, in eager) and the memory functions to the tpu device's."""
    if hasattr(torch.accelerator.synchronize, "__wrapped_original__"):
        return
    torch.accelerator.synchronize = _route(torch.accelerator.synchronize, lambda index: synchronize())
    empty_cache = _route_current(torch.accelerator.memory.empty_cache, lambda index: memory.empty_cache())
    for module in (torch.accelerator, torch.accelerator.memory):
        for name, replacement in _ROUTED.items():
            setattr(module, name, _route(getattr(torch.accelerator.memory, name), replacement))
        module.empty_cache = empty_cache


def alias_in_fake_tensors() -> None:
    """Compiled code sees the alias too: a FakeTensor made on `tpu:LOCAL_RANK` (a factory in a compiled region
    under a launcher) is on `tpu:0`, as the real tensor would be; another index raises while tracing. (Not on
    torch 2.11, which has no hook for it: there such a factory fails to trace with a device mismatch.)"""

    def aliasing(normalize: Callable[[torch.device], torch.device]) -> Callable[[torch.device], torch.device]:
        def aliased(device: torch.device) -> torch.device:
            device = normalize(device)
            if device.type == "tpu" and device.index:
                return torch.device("tpu", platform.own_index(device.index))
            return device

        return aliased

    compat.wrap_fake_device_normalizer(aliasing)
