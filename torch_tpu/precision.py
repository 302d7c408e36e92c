"""fp32 matmul/convolution precision, in eager and compiled code alike.

`torch.tpu.Precision` names StableHLO's dot precision: DEFAULT (TPU: one bf16 pass with fp32 accumulation;
GPU: TF32 where the chip has it), HIGH (TPU: three bf16 passes, ~fp32), HIGHEST (full fp32 everywhere). On the
XLA CPU platform every level computes in full fp32. The level in force is the innermost
`torch.tpu.precision(...)` block, else PyTorch's `torch.set_float32_matmul_precision` mapped
medium/high/highest -> DEFAULT/HIGH/HIGHEST (PyTorch's own default, "highest", gives full fp32).
`torch.tpu.allow_excess_precision` (default True) lets XLA keep bf16/fp16 intermediates in fp32 inside a fused
computation instead of rounding after every op.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator

import jax
import torch


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


class _State:
    """Process-wide, like `torch.set_float32_matmul_precision`: PyTorch's autograd engine runs a `tpu` backward
    on its own device thread, and a `precision(...)` block around `.backward()` must reach those ops too."""

    stack: list[Precision] = []


_state = _State()
_excess = {"allowed": True}


def current() -> Precision:
    """The precision in force for float32 matmuls and convolutions."""
    if _state.stack:
        return _state.stack[-1]
    return _FROM_TORCH.get(torch.get_float32_matmul_precision(), Precision.HIGHEST)


def for_dot() -> jax.lax.Precision:
    """The `precision=` argument a lowering passes to jnp/lax dot and convolution ops."""
    return _TO_LAX[current()]


_TOKENS = {"medium": "default", "high": "high", "highest": "highest"}
_get_torch_precision = torch._C._get_float32_matmul_precision


def cache_token() -> tuple[str, bool]:
    """What of the precision state a cached executable depends on (part of every cache key; plain strings,
    which hash in C, since this runs for every eager op)."""
    level = _state.stack[-1].value if _state.stack else _TOKENS.get(_get_torch_precision(), "highest")
    return level, _excess["allowed"]


@contextlib.contextmanager
def precision(level: Precision) -> Iterator[None]:
    """Run the block's float32 matmuls and convolutions at `level`."""
    if not isinstance(level, Precision):
        raise TypeError(f"torch_tpu: precision must be a torch.tpu.Precision, got {level!r}")
    _state.stack.append(level)
    try:
        yield
    finally:
        _state.stack.pop()


def allow_excess_precision() -> bool:
    return _excess["allowed"]


def set_allow_excess_precision(allowed: bool) -> None:
    _excess["allowed"] = bool(allowed)


def compiler_options() -> dict[str, bool]:
    """XLA options every executable is compiled with."""
    return {"xla_allow_excess_precision": _excess["allowed"]}
