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

# Ops (ATen packet names) measured on a TPU v5e (bench/tpu_numerics.py --sections float64) to fail to compile in
# float64 or to come back at float32 accuracy: refused up front, with the advice to compute them in float32 or on CPU.
UNSUPPORTED_ON_TPU: frozenset[str] = frozenset()

# Phrases of XLA's errors for a 64-bit type its TPU backend cannot compile (an op not in the table above).
_XLA_REFUSALS = ("f64", "c128", "float64", "complex128", "64-bit")


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
    if applies(array_dtypes) and _packet(op) in UNSUPPORTED_ON_TPU:
        raise _unsupported(op, "measured: XLA's TPU backend does not compute it to float64 accuracy")


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
