"""A fill of a storage never written (`torch.zeros`, `ones_like`, `full`: `empty`, then `fill_`/`zero_`) without an
op: its array made at once, as `jnp.full` would.

Two things make this worth a path of its own. The optimizer state torch.optim creates in its first step
(`zeros_like` of each parameter) becomes ordinary inputs of the step's program, so that the first step's program
is the steady steps' one (one compile less on a cold start, in Strict and Fused eager); a recorded zero fill would
make it a second, larger program. And a 0-d fill (`loss.backward()`'s `ones_like(loss)`) reuses a cached array:
no program runs at all. Anything else (a written storage, a view, a value the dtype does not hold exactly: CPU
rounds or refuses it) takes the op's lowering as before.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.runtime import helpers, memory, storage
from torch_tpu.runtime.mapping import RESHAPE, WHOLE_BUFFER, classify

_SCALARS: dict[tuple[np.dtype, str | int], jax.Array] = {}
memory.on_empty_cache(_SCALARS.clear)


def fill_fresh(tensor: torch.Tensor, value: object) -> bool:
    """Fill `tensor` with the Python number `value` if its storage was never written, it is all of that storage,
    and its dtype holds `value` exactly; whether it did."""
    if type(value) not in (bool, int, float) or tensor.is_conj() or tensor.is_neg():
        return False
    buffer = storage.buffer_of(tensor)
    if buffer._array is not None:
        return False
    found = classify(tensor, buffer, tensor.shape, tensor.dtype)
    if found is not WHOLE_BUFFER and found[0] != RESHAPE:  # (an unwritten buffer has no shape: RESHAPE)
        return False
    dtype = buffer.dtype
    if dtype.kind == "c" or not _exact(dtype, value):
        return False
    shape = tuple(tensor.shape)
    buffer.array = _scalar(dtype, value) if not shape else _full(shape, dtype, value)
    return True


def check_overflow(tensor: torch.Tensor, value: object) -> None:
    """CPU's refusal of a fill value its dtype cannot hold (c10's `overflows`): a finite float beyond the float
    dtype's range, an integer beyond the integer dtype's (an unsigned one takes negatives down to -max, wrapping)."""
    dtype = tensor.dtype
    if type(value) not in (int, float) or dtype == torch.bool or dtype.is_complex:
        return
    if dtype.is_floating_point:
        limit = torch.finfo(dtype)
        bad = math.isfinite(value) and not -limit.max <= value <= limit.max
    else:
        limit = torch.iinfo(dtype)
        bad = value != value or math.isinf(value) or value > limit.max or value < -limit.max - (limit.min < 0)
    if bad:
        raise RuntimeError(f"torch_tpu: fill_: value {value!r} cannot be converted to type {dtype} without overflow")


def _exact(dtype: np.dtype, value: bool | int | float) -> bool:
    """Whether `dtype` holds `value` as it is (NaN never compares equal: it takes the op's path)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(np.asarray(value).astype(dtype) == value)
    except (OverflowError, ValueError, TypeError):
        return False


def _scalar(dtype: np.dtype, value: bool | int | float) -> jax.Array:
    """A 0-d array of `value`, shared: arrays are immutable, and a write replaces a buffer's array."""
    key = (dtype, value.hex() if type(value) is float else int(value))  # -0.0 apart; ints beyond float's 53 bits
    found = _SCALARS.get(key)
    if found is None:
        if len(_SCALARS) >= 64:
            _SCALARS.clear()
        found = _SCALARS[key] = _full((), dtype, value)
    return found


def _full(shape: tuple[int, ...], dtype: np.dtype, value: bool | int | float) -> jax.Array:
    """A new array (never shared: a program's inputs stay distinct, as the steady steps' state arrays are)."""
    return _full_jit(shape, dtype, np.asarray(value).astype(dtype))


def _make_full(shape: tuple[int, ...], dtype: np.dtype, value: jax.Array) -> jax.Array:
    return jnp.full(shape, value, dtype)


_full_jit = helpers.Helper(_make_full, static_argnums=(0, 1), cold=helpers.host_fill)
