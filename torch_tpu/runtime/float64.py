"""float64 on the TPU: what XLA's TPU backend computes, and a clear error for the rest.

TPUs have no float64 hardware; XLA's TPU backend emulates float64 arithmetic. torch_tpu lets float64 tensors onto
a TPU and runs every op XLA computes there in float64, with the accuracy docs/numerics.md measures against CPU
(`bench/tpu_numerics.py --sections float64`). An op XLA cannot compile in float64 on the TPU, or one whose result
the chip gives only to float32 accuracy (a silent float32 result would be a wrong number), raises
NotImplementedError naming the op instead. Other platforms (CPU, GPU) compute float64 natively: nothing applies.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from torch_tpu.runtime import platform

WIDE = frozenset({np.dtype(np.float64), np.dtype(np.complex128)})
COMPLEX128 = np.dtype(np.complex128)

# Ops (ATen packet names) measured on a TPU v5e (bench/tpu_numerics.py --sections float64, docs/numerics.md) to come
# back in float64 at float32 accuracy (relative error ~1e-7, not ~1e-15): refused up front, as a silent float32 result
# would be a wrong number. Ops XLA cannot compile in float64 there (linalg_inv, linalg_solve, floor division, ...)
# raise when compiled (`refusal`); complex128 is refused whole, since XLA's TPU compiler aborts the process on a
# float64 -> complex128 conversion ("Unsupported CVT X{64|128} expansion from f64 to c128": fft of a float64 tensor).
UNSUPPORTED_ON_TPU: frozenset[str] = frozenset({"atan2", "pow", "prod"})

# Phrases of XLA's errors for a 64-bit type its TPU backend cannot compile (an op not in the table above).
_XLA_REFUSALS = ("f64", "c128", "float64", "complex128", "64-bit", "unimplemented", "invalid_argument")


def applies(array_dtypes: Iterable[object]) -> bool:
    """Whether the policy concerns a call with these JAX dtypes: a 64-bit float among them, on a TPU."""
    return any(np.dtype(d) in WIDE for d in array_dtypes if d is not None) and platform.platform() == "tpu"


def _unsupported(op: str, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"torch_tpu: '{op}' is not supported in float64 on the TPU ({why}); compute it in float32 "
        f"(`.float()`), or on CPU (`.cpu()`)"
    )


def check(op: str, array_dtypes: Iterable[object]) -> None:
    """Raise for an op the TPU cannot compute in float64 (named by its ATen name, e.g. `aten::linalg_inv`)."""
    array_dtypes = list(array_dtypes)
    if not applies(array_dtypes):
        return
    if any(d is not None and np.dtype(d) == COMPLEX128 for d in array_dtypes):
        raise NotImplementedError(
            f"torch_tpu: '{op}' on complex128: the TPU has no complex128 (XLA's TPU compiler aborts on it); use "
            f"complex64, or compute on CPU (`.cpu()`)"
        )
    if _packet(op) in UNSUPPORTED_ON_TPU:
        raise _unsupported(op, "measured: XLA's TPU backend computes it only to float32 accuracy")


def refusal(op: str, error: Exception, array_dtypes: Iterable[object]) -> NotImplementedError | None:
    """XLA's compile error for a float64 op on the TPU, as an error naming the op (None: another error)."""
    if applies(array_dtypes) and any(word in str(error).lower() for word in _XLA_REFUSALS):
        return _unsupported(op, f"XLA: {str(error).splitlines()[0][:160]}")
    return None


def _packet(op: str) -> str:
    """`aten::linalg_inv` or `aten.linalg_inv.default` -> `linalg_inv`."""
    name = op.split("::")[-1]
    parts = name.split(".")
    return parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[0]
