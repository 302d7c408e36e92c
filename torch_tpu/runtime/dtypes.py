"""torch <-> JAX dtype tables: the one home of dtype knowledge."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

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

# numpy cannot hold these through torch.from_numpy / Tensor.numpy(); they travel as same-width integers.
_HOST_CARRIER: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.int8,
    torch.float8_e5m2: torch.int8,
}

SIXTY_FOUR_BIT = frozenset({torch.float64, torch.complex128})


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
    return jnp.issubdtype(dtype, jnp.complexfloating)


def is_floating(dtype: np.dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def is_integral(dtype: np.dtype) -> bool:
    """Integers and bool: the dtypes that promote to a float (the default float dtype) in floating ops."""
    return jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_


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
