"""The trace context: every global setting a traced program depends on, kept as one token in every cache key.

What a lowering reads of the process's state while it is traced — PyTorch's default dtype (the dtype Python
floats and integer-to-float ops take), the fp32 matmul precision (`torch_tpu.precision`), excess precision,
whether device-side checks are made (`runtime.checks`) — lives here, and the token that every cache key contains
(eager per-op executables, Fused clusters, compiled graphs, the persistent tier) is made of it, so that a change
of any of them traces anew instead of replaying a program made under the old setting. The token is recomputed
only when a setter runs (PyTorch's setters are hooked by `install`, ours call `refresh`), so the eager hot path
reads one attribute; lowerings read the context's values (`default_dtype()`, `precision.for_dot()`), never
PyTorch's.
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable
from typing import Any

import torch


class Precision(enum.Enum):
    """Dot/convolution precision for float32 operands (names as in TorchTPU; `torch_tpu.precision` has the rest)."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"


_FROM_TORCH = {"medium": Precision.DEFAULT, "high": Precision.HIGH, "highest": Precision.HIGHEST}


class _Context:
    """The trace context. Process-wide, like PyTorch's own settings: a `tpu` backward may run on the autograd
    engine's device thread (`runtime/backward_thread.py`), and a `precision(...)` block around `.backward()` must
    reach those ops."""

    __slots__ = ("stack", "excess", "index_checks", "default_dtype", "level", "token")

    def __init__(self) -> None:
        self.stack: list[Precision] = []
        self.excess = True
        self.index_checks = os.environ.get("TORCH_TPU_CHECK_INDICES", "1") != "0"
        self.default_dtype = torch.float32
        self.level = Precision.HIGHEST
        self.token: tuple = ()

    def refresh(self) -> None:
        """Recompute the context from the settings (after any of them changed)."""
        self.default_dtype = torch.get_default_dtype()
        if self.stack:
            self.level = self.stack[-1]
        else:
            self.level = _FROM_TORCH.get(torch._C._get_float32_matmul_precision(), Precision.HIGHEST)
        # plain values that hash in C, since the token is part of every eager op's key
        self.token = (self.default_dtype, self.level.value, self.excess, self.index_checks)


context = _Context()
context.refresh()


def cache_token() -> tuple:
    """The trace context as a key (part of every cache key)."""
    return context.token


def default_dtype() -> torch.dtype:
    """PyTorch's default dtype as the trace context holds it: what lowerings read instead of
    `torch.get_default_dtype()`, so that a program never depends on state its key lacks."""
    return context.default_dtype


def _refreshing(setter: Callable) -> Callable:
    @functools.wraps(setter)
    def set_and_refresh(*args: Any, **kwargs: Any) -> Any:
        try:
            return setter(*args, **kwargs)
        finally:
            context.refresh()

    set_and_refresh.refreshes_trace_context = True
    return set_and_refresh


# PyTorch's setters of the default dtype and the fp32 matmul precision (`torch.set_default_dtype`,
# `set_default_tensor_type`, `set_float32_matmul_precision`, `torch.backends.cuda.matmul.allow_tf32`, the
# `fp32_precision` properties) all call these bindings through `torch._C` at call time.
TORCH_SETTERS = (
    "_set_default_dtype",
    "_set_default_tensor_type",
    "_set_float32_matmul_precision",
    "_set_cublas_allow_tf32",
    "_set_fp32_precision_setter",
)


def install() -> None:
    """Make PyTorch's setters (`TORCH_SETTERS`, in `torch._C`) refresh the context (once)."""
    for name in TORCH_SETTERS:
        setter = getattr(torch._C, name, None)
        if setter is not None and not getattr(setter, "refreshes_trace_context", False):
            setattr(torch._C, name, _refreshing(setter))
    context.refresh()
