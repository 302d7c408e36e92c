"""Modules moving to and from `tpu` keep their parameters' identity, so tied weights stay tied.

`Module._apply` changes a parameter in place (`param.data = moved`) only when PyTorch deems the two tensor types
compatible, and its C++ check lists the built-in dense backends, not PrivateUse1: for `tpu` it makes a new
Parameter per module, which unties shared weights (an embedding tied to its LM head) and leaves an optimizer
built beforehand holding the old ones. On CUDA both stay. Here a move across `tpu` runs `_apply` with PyTorch's
own alternative, `torch.utils.swap_tensors` (the `swap_module_params_on_conversion` future flag), which keeps
every Parameter object; where a swap is refused (a parameter with weak references), the move is redone the
default way, with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

_lock = threading.RLock()


@contextlib.contextmanager
def _swapping() -> Iterator[None]:
    with _lock:
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            yield
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)


def _crosses_tpu(module: nn.Module, device: torch.device | None) -> bool:
    """Whether moving `module` to `device` moves a parameter or gradient onto or off `tpu`."""
    if device is None:
        return False
    to_tpu = device.type == "tpu"
    for param in module.parameters():
        for tensor in (param, param.grad):
            if tensor is not None and (tensor.device.type == "tpu") != to_tpu:
                return True
    return False


def _keeping_identity(method: Callable, target: Callable[..., torch.device | None]) -> Callable:
    """`method` (a Module move), with swaps when it crosses `tpu`; `target` parses the device from its args."""

    @functools.wraps(method)
    def move(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch.__future__.get_swap_module_params_on_conversion() or not _crosses_tpu(self, target(*args, **kwargs)):
            return method(self, *args, **kwargs)
        try:
            with _swapping():
                return method(self, *args, **kwargs)
        except RuntimeError as error:
            if "Couldn't swap" not in str(error):
                raise
            warnings.warn(
                f"torch_tpu: {type(self).__name__} could not keep its parameters' identity while moving ({error}); "
                "moved with new Parameter objects instead, so tied weights may be untied (re-tie them, e.g. "
                "model.tie_weights(), and build optimizers after moving)",
                stacklevel=2,
            )
            return method(self, *args, **kwargs)

    move.__wrapped_original__ = method
    return move


def _to_target(*args: Any, **kwargs: Any) -> torch.device | None:
    return torch._C._nn._parse_to(*args, **kwargs)[0]


def _to_empty_target(*, device: Any, recurse: bool = True) -> torch.device | None:
    return None if device is None else torch.device(device)


def install() -> None:
    """Wrap `Module.to`, `.cpu`, `.tpu` and `.to_empty` (idempotent)."""
    if hasattr(nn.Module.to, "__wrapped_original__"):
        return
    nn.Module.to = _keeping_identity(nn.Module.to, _to_target)
    nn.Module.cpu = _keeping_identity(nn.Module.cpu, lambda: torch.device("cpu"))
    nn.Module.tpu = _keeping_identity(nn.Module.tpu, lambda device=None: torch.device("tpu"))
    nn.Module.to_empty = _keeping_identity(nn.Module.to_empty, _to_empty_target)
