"""Pinned host memory for `tpu`: a documented no-op that keeps PyTorch's pinning API working.

With `tpu` registered as the accelerator, PyTorch asks the PrivateUse1 hooks for a pinned-memory allocator
(`getPinnedMemoryAllocator`), which the Python hooks object cannot provide, so `Tensor.pin_memory()`,
`DataLoader(pin_memory=True)` and `torch.empty(..., pin_memory=True)` raised. JAX/PJRT stages host->device copies
itself (and this package copies every host tensor before the transfer), so page-locked memory buys nothing here.

Pinning therefore marks the tensor's *storage* as pinned and allocates nothing:
- `pin_memory` (both the CPU and the AutogradCPU kernels of the composite op) returns the tensor itself, never a
  copy — callers such as FSDP2's CPU offload keep writing into the tensor they got back;
- `is_pinned` reads the mark, which lives on the storage's Python object and dies with the storage, so every view
  of a pinned storage reports pinned, and a fresh tensor does not;
- `_pin_memory`, which promises a new tensor, returns a marked copy;
- factory functions called with `pin_memory=True` (`torch.empty`, `zeros`, `ones`, `full`, `empty_strided`,
  `*_like`, `rand*`, `arange`, ...: every `torch` function whose ATen schema has a `pin_memory` argument, and the
  `Tensor.new_*` methods) allocate normally and mark the result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_MARK = "_torch_tpu_pinned"
_libraries: list[torch.library.Library] = []


def mark(tensor: torch.Tensor) -> torch.Tensor:
    """Mark `tensor`'s storage as pinned and return `tensor`."""
    setattr(tensor.untyped_storage(), _MARK, True)
    return tensor


def is_marked(tensor: torch.Tensor) -> bool:
    return getattr(tensor.untyped_storage(), _MARK, False)


def _check(tensor: torch.Tensor, device: torch.device | None, op: str) -> None:
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        raise RuntimeError(f"{op}: cannot pin '{tensor.type()}' only dense CPU tensors can be pinned")
    if device is not None and torch.device(device).type not in ("tpu", "cpu"):
        raise RuntimeError(f"{op}: pinned memory for device '{torch.device(device)}' is not available with torch_tpu")


def _is_pinned(tensor: torch.Tensor, device: torch.device | None = None) -> bool:
    return is_marked(tensor)


def _pin_memory(tensor: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    _check(tensor, device, "pin_memory")
    return mark(tensor)


def _pin_memory_copy(tensor: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    _check(tensor, device, "_pin_memory")
    return mark(tensor.clone(memory_format=torch.preserve_format))


def _factory(original: Callable) -> Callable:
    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("pin_memory"):
            return original(*args, **kwargs)
        kwargs["pin_memory"] = False
        result = original(*args, **kwargs)
        _check(result, None, f"{original.__name__}(pin_memory=True)")
        return mark(result)

    factory.__wrapped_original__ = original
    return factory


# The public `torch` functions whose ATen schema takes `pin_memory` (tests/runtime/test_pinned.py checks the list is
# complete), and `torch.tensor`, whose Python binding takes it too.
FACTORIES = (
    "arange", "bartlett_window", "blackman_window", "empty", "empty_like", "empty_permuted", "empty_quantized",
    "empty_strided", "eye", "from_file", "full", "full_like", "hamming_window", "hann_window", "kaiser_window",
    "linspace", "logspace", "normal", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn",
    "randn_like", "randperm", "range", "scalar_tensor", "tensor", "tril_indices", "triu_indices", "zeros", "zeros_like",
)  # fmt: skip
TENSOR_FACTORIES = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_zeros")


def install() -> None:
    """Register the pinning kernels for CPU tensors and wrap the factories' `pin_memory=True` (idempotent)."""
    if _libraries:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("is_pinned", _is_pinned, "CPU")
    lib.impl("_pin_memory", _pin_memory_copy, "CPU")
    lib.impl("pin_memory", _pin_memory, "CPU")
    lib.impl("pin_memory", _pin_memory, "AutogradCPU")
    _libraries.append(lib)
    for name in FACTORIES:
        factory = _factory(getattr(torch, name))
        setattr(torch, name, factory)
        torch.jit._builtins._register_builtin(factory, f"aten::{name}")  # TorchScript still sees the builtin
    for name in TENSOR_FACTORIES:
        setattr(torch.Tensor, name, _factory(getattr(torch.Tensor, name)))
