"""fp32 matmul/convolution precision, and excess precision.

`torch.tpu.Precision` names StableHLO's dot precision: DEFAULT (TPU: one bf16 pass with fp32 accumulation;
GPU: TF32 where the chip has it), HIGH (TPU: three bf16 passes, ~fp32), HIGHEST (full fp32 everywhere). On the
XLA CPU platform every level computes in full fp32. The level in force is the innermost
`torch.tpu.precision(...)` block, else PyTorch's `torch.set_float32_matmul_precision` mapped
medium/high/highest -> DEFAULT/HIGH/HIGHEST (PyTorch's own default, "highest", gives full fp32).
`torch.tpu.allow_excess_precision` (default True) lets XLA keep bf16/fp16 intermediates in fp32 inside a fused
computation instead of rounding after every op.

The level in force is part of the trace context (`runtime.trace_context`), with the other global settings a
traced program depends on, so every cache key tells programs of different levels apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

from torch_tpu.runtime.trace_context import Precision as Precision  # torch.tpu.Precision
from torch_tpu.runtime.trace_context import context

_TO_LAX = {
    Precision.DEFAULT: jax.lax.Precision.DEFAULT,
    Precision.HIGH: jax.lax.Precision.HIGH,
    Precision.HIGHEST: jax.lax.Precision.HIGHEST,
}


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
