"""torch <-> JAX dtype tables and PyTorch's type promotion: the one home of dtype knowledge.

Promotion is data here, as JAX keeps its dtype rules in one module: four category sets (bool, integer, floating,
complex) ordered by `Category`, and `result_type`, which follows c10's rules: dimensioned tensors outrank zero-dim
tensors, which outrank Python numbers, unless a lower group is of a higher category. Lowerings cast their operands
with `common` or `floating`, computing in float32 for bfloat16/float16 as PyTorch's CPU kernels do; the dispatcher
then casts to the output dtype PyTorch's meta kernel reports.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from torch_tpu.runtime import trace_context

_TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
}
_JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in _TORCH_TO_JAX.items()}
JAX_DTYPES: Mapping[torch.dtype, np.dtype] = types.MappingProxyType(_TORCH_TO_JAX)
"""The JAX dtype of each torch dtype the device holds (read-only): for hot paths that look up, not raise."""

# numpy cannot hold these through torch.from_numpy / Tensor.numpy(); they travel as same-width integers.
_HOST_CARRIER: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.int8,
    torch.float8_e5m2: torch.int8,
}

SIXTY_FOUR_BIT = frozenset({torch.float64, torch.complex128})

# The promotion categories of the device's dtypes, as sets; every dtype of the table is in exactly one.
BOOL = frozenset({np.dtype(np.bool_)})
INTEGER = frozenset(
    np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)
FLOATING = frozenset(
    np.dtype(t)
    for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
)
COMPLEX = frozenset({np.dtype(np.complex64), np.dtype(np.complex128)})


class Category(enum.IntEnum):
    """c10's dtype categories, in promotion order: a higher category absorbs a lower one."""

    BOOL = 0
    INTEGER = 1
    FLOATING = 2
    COMPLEX = 3


_CATEGORY: dict[np.dtype, Category] = {
    dtype: category
    for category, members in zip(Category, (BOOL, INTEGER, FLOATING, COMPLEX), strict=True)
    for dtype in members
}


def to_jax(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype of a torch dtype; raises TypeError naming the dtype if there is none."""
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"torch_tpu: dtype {dtype} is not supported on the tpu device") from None


def to_torch(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a JAX/numpy dtype."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"torch_tpu: JAX dtype {dtype} has no torch counterpart") from None


def aten_name(dtype: np.dtype) -> str:
    """c10's name of a JAX/numpy dtype ("Float", "Long", "BFloat16"), as CPU PyTorch's error messages spell it."""
    return torch.empty(0, dtype=to_torch(dtype)).type().removeprefix("torch.").removesuffix("Tensor")


def host_carrier(dtype: torch.dtype) -> torch.dtype | None:
    """The integer dtype that carries `dtype` through numpy, or None if numpy holds it directly."""
    return _HOST_CARRIER.get(dtype)


def is_complex(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in COMPLEX


def is_floating(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in FLOATING


def is_integral(dtype: np.dtype) -> bool:
    """Integers and bool: the dtypes that promote to a float (the default float dtype) in floating ops."""
    dtype = np.dtype(dtype)
    return dtype in BOOL or dtype in INTEGER


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype PyTorch's CPU kernels compute values of `dtype` in (their opmath type): float32 for floats
    narrower than 32 bits (bfloat16, float16, float8), `dtype` itself otherwise."""
    dtype = np.dtype(dtype)
    if is_floating(dtype) and dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype sums, products and matrix products of `dtype` accumulate in: `compute_dtype` for floats and
    complex numbers, int64 for integers and bool."""
    return np.dtype(np.int64) if is_integral(dtype) else compute_dtype(dtype)


def upcast(x: jax.Array) -> jax.Array:
    """`x` in its compute dtype (`compute_dtype`)."""
    return x.astype(compute_dtype(x.dtype))


def category(dtype: Any) -> Category:
    """The promotion category of a JAX/numpy dtype; raises TypeError for one outside the device's table."""
    try:
        return _CATEGORY[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"torch_tpu: dtype {dtype} has no type promotion category on the tpu device") from None


def is_number(x: Any) -> bool:
    """A Python number: a wrapped scalar or a `Scalar` argument (traced as a weakly typed value)."""
    return isinstance(x, (bool, int, float, complex)) or getattr(x, "weak_type", False)


def default_float() -> np.dtype:
    """PyTorch's default float dtype as the trace context holds it, which every cache key includes."""
    return to_jax(trace_context.default_dtype())


def _number_dtype(x: Any) -> np.dtype:
    """A Python number's dtype in promotion: a float is the default float dtype, a complex its complex dtype."""
    dtype = jnp.result_type(x)
    kind = category(dtype)
    if kind == Category.FLOATING:
        return default_float()
    return jnp.promote_types(default_float(), jnp.complex64) if kind == Category.COMPLEX else dtype


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    """c10's combine_categories: a lower-priority group decides only where its category is higher."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    high, low = category(higher), category(lower)
    if high == Category.COMPLEX:
        return higher
    if low == Category.COMPLEX:
        return jnp.promote_types(higher, jnp.complex64) if high == Category.FLOATING else lower
    if high == Category.FLOATING:
        return higher
    return jnp.promote_types(higher, lower) if high == Category.BOOL or low == Category.FLOATING else higher


def result_type(*operands: Any) -> np.dtype | None:
    """torch.result_type of jax arrays (tensors) and Python numbers; None operands are skipped (None if all are).

    Operands form three groups, dimensioned tensors over zero-dim tensors over Python numbers: a group promotes
    within itself, and a lower group changes the result only where its category is higher (`_combine`), so
    `int8_tensor + 1000` stays int8 while `int8_tensor + 1.5` is the default float dtype.
    """
    groups: list[np.dtype | None] = [None, None, None]
    for x in operands:
        if x is None:
            continue
        if is_number(x):
            group, dtype = 2, _number_dtype(x)
        else:
            group, dtype = (1 if jnp.ndim(x) == 0 else 0), jnp.result_type(x)
        groups[group] = dtype if groups[group] is None else jnp.promote_types(groups[group], dtype)
    return _combine(groups[0], _combine(groups[1], groups[2]))


def cast(dtype: np.dtype, *operands: Any, exact_numbers: bool = False) -> tuple[jax.Array | None, ...]:
    """Operands in `dtype`, widened to float32 for bfloat16/float16 (PyTorch CPU's compute type).

    With `exact_numbers`, Python numbers go straight to the compute type, not through `dtype` (as PyTorch's
    mul/div/addcmul kernels use the scalar's full value).
    """
    compute = compute_dtype(dtype)

    def one(x: Any) -> jax.Array | None:
        if x is None:
            return None
        if exact_numbers and is_number(x):
            return jnp.asarray(x, compute)
        return jnp.asarray(x, dtype).astype(compute)

    return tuple(one(x) for x in operands)


def common(*operands: Any, exact_numbers: bool = False) -> tuple[jax.Array | None, ...]:
    """Operands in their common dtype (`result_type`), computed as `cast` says."""
    return cast(result_type(*operands), *operands, exact_numbers=exact_numbers)


def floating(*operands: Any, exact_numbers: bool = False) -> tuple[jax.Array | None, ...]:
    """Operands in their common floating dtype (integers and bool promote to the default float dtype), computed
    as `cast` says: the promotion of PyTorch's floating ops (sqrt, div, sigmoid)."""
    dtype = result_type(*operands)
    if category(dtype) < Category.FLOATING:
        dtype = default_float()
    return cast(dtype, *operands, exact_numbers=exact_numbers)


def floating_for_reduction(x: jax.Array) -> jax.Array:
    """One array as a floating (or complex) array for a floating reduction (var, std, logsumexp).

    Unlike `floating`, it promotes nothing and integers and bool become the default float dtype as is, not
    widened to its compute dtype (a bfloat16 default stays bfloat16); floats widen as `upcast` says.
    """
    if is_integral(x.dtype):
        return x.astype(default_float())
    return upcast(x)
