"""fp32 matmul/convolution precision, and the trace context: every global setting a traced program depends on.

`torch.tpu.Precision` names StableHLO's dot precision: DEFAULT (TPU: one bf16 pass with fp32 accumulation;
GPU: TF32 where the chip has it), HIGH (TPU: three bf16 passes, ~fp32), HIGHEST (full fp32 everywhere). On the
XLA CPU platform every level computes in full fp32. The level in force is the innermost
`torch.tpu.precision(...)` block, else PyTorch's `torch.set_float32_matmul_precision` mapped
medium/high/highest -> DEFAULT/HIGH/HIGHEST (PyTorch's own default, "highest", gives full fp32).
`torch.tpu.allow_excess_precision` (default True) lets XLA keep bf16/fp16 intermediates in fp32 inside a fused
computation instead of rounding after every op.

The trace context (`context`) is what of the process's state a lowering reads while it is traced — PyTorch's
default dtype (the dtype Python floats and integer-to-float ops take), the matmul precision, excess precision,
whether device-side checks are made (runtime/checks.py) —
kept as one token that every cache key contains (eager per-op executables, Fused clusters, compiled graphs), so
that a change of any of them traces anew instead of replaying a program made under the old setting. The token is
recomputed only when a setter runs (PyTorch's setters are hooked here, ours refresh it), so the eager hot path
reads one attribute; lowerings read the context's values (`default_dtype()`, `for_dot()`), never PyTorch's.
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import torch

from torch_tpu.runtime import checks as device_checks


class Precision(enum.Enum):
    """Dot/convolution precision for float32 operands (names as in TorchTPU)."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"


_FROM_TORCH = {"medium": Precision.DEFAULT, "high": Precision.HIGH, "highest": Precision.HIGHEST}
_TO_LAX = {
    Precision.DEFAULT: jax.lax.Precision.DEFAULT,
    Precision.HIGH: jax.lax.Precision.HIGH,
    Precision.HIGHEST: jax.lax.Precision.HIGHEST,
}


class _Context:
    """The trace context. Process-wide, like PyTorch's own settings: PyTorch's autograd engine runs a `tpu`
    backward on its own device thread, and a `precision(...)` block around `.backward()` must reach those ops."""

    __slots__ = ("stack", "excess", "default_dtype", "level", "token")

    def __init__(self) -> None:
        self.stack: list[Precision] = []
        self.excess = True
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
        self.token = (self.default_dtype, self.level.value, self.excess, device_checks.state.enabled)


context = _Context()
context.refresh()


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
_TORCH_SETTERS = (
    "_set_default_dtype",
    "_set_default_tensor_type",
    "_set_float32_matmul_precision",
    "_set_cublas_allow_tf32",
    "_set_fp32_precision_setter",
)
for _name in _TORCH_SETTERS:
    _setter = getattr(torch._C, _name, None)
    if _setter is not None and not getattr(_setter, "refreshes_trace_context", False):
        setattr(torch._C, _name, _refreshing(_setter))


def cache_token() -> tuple:
    """The trace context as a key (part of every cache key)."""
    return context.token


def default_dtype() -> torch.dtype:
    """PyTorch's default dtype as the trace context holds it: what lowerings read instead of
    `torch.get_default_dtype()`, so that a program never depends on state its key lacks."""
    return context.default_dtype


def current() -> Precision:
    """The precision in force for float32 matmuls and convolutions."""
    return context.level


def for_dot() -> jax.lax.Precision:
    """The `precision=` argument a lowering passes to jnp/lax dot and convolution ops."""
    return _TO_LAX[context.level]


def tracing() -> contextlib.AbstractContextManager:
    """JAX's default dot precision set to the precision in force, around a lowering's trace: every float32 product
    inside it -- `@` in a lowering, the blocked products of a linear-algebra routine, a user's `jax_op` -- takes the
    level that `for_dot()` gives explicit dots (on a TPU an unset precision is one bf16 pass)."""
    return jax.default_matmul_precision(context.level.value)


@contextlib.contextmanager
def precision(level: Precision) -> Iterator[None]:
    """Run the block's float32 matmuls and convolutions at `level`."""
    if not isinstance(level, Precision):
        raise TypeError(f"torch_tpu: precision must be a torch.tpu.Precision, got {level!r}")
    context.stack.append(level)
    context.refresh()
    try:
        yield
    finally:
        context.stack.pop()
        context.refresh()


def allow_excess_precision() -> bool:
    return context.excess


def set_allow_excess_precision(allowed: bool) -> None:
    context.excess = bool(allowed)
    context.refresh()


def compiler_options() -> dict[str, bool]:
    """XLA options every executable is compiled with."""
    return {"xla_allow_excess_precision": context.excess}
