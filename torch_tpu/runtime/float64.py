"""float64 on the TPU: what XLA's TPU backend computes, and a clear error for the rest.

TPUs have no float64 hardware; XLA's TPU backend emulates float64 arithmetic. torch_tpu lets float64 tensors onto
a TPU and runs every op XLA computes there in float64, with the accuracy docs/numerics.md measures against CPU
(`bench/tpu_numerics.py --sections float64`). The ops the chip computes only to float32 accuracy (`pow`, `atan2`,
`prod`) are written out from float64-accurate ones for it (torch_tpu/ops/emulated.py). An op XLA cannot compile in
float64 on the TPU raises NotImplementedError naming the op (`refusal`), and complex128 is refused up front (`check`).
Other platforms (CPU, GPU) compute float64 natively: nothing applies.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from torch_tpu.runtime import platform

WIDE = frozenset({np.dtype(np.float64), np.dtype(np.complex128)})
COMPLEX128 = np.dtype(np.complex128)

# complex128 is refused whole (`check`), since XLA's TPU compiler aborts the process on a float64 -> complex128
# conversion ("Unsupported CVT X{64|128} expansion from f64 to c128": fft of a float64 tensor). Ops XLA cannot compile
# in float64 there (linalg_inv, linalg_solve, floor division, ...) raise when compiled (`refusal`), with an error
# among these phrases.
_XLA_REFUSALS = ("f64", "c128", "float64", "complex128", "64-bit", "unimplemented", "invalid_argument")


class Unsupported(NotImplementedError):
    """What the TPU cannot compute in 64 bits. Unlike torch_tpu's other NotImplementedErrors, the call may also be
    invalid (torch.complex of float32 and float64): the eager layer asks CPU first and raises CPU's error if any."""


def counted(inputs: Iterable[object], out_dtypes: object) -> list:
    """The dtypes the policy looks at for a call: its outputs' (`out_dtypes`: one, or a list or tuple) and its
    inputs' (arrays or tensors), but for 0-d inputs, which count only through the outputs: a Python scalar arrives
    as a 0-d float64 value (autograd's `exponent - 1` in pow's backward), and a float32 op with it computes in
    float32; but a complex scalar beside float64 makes the call complex128."""
    inputs = list(inputs)
    outputs = list(out_dtypes) if isinstance(out_dtypes, (list, tuple)) else [out_dtypes]
    found = [getattr(x, "dtype", None) for x in inputs if getattr(x, "ndim", 0) > 0] + outputs
    if any(_complex_scalar(x) for x in inputs) and any(d is not None and np.dtype(d) in WIDE for d in found):
        found.append(COMPLEX128)  # a complex scalar beside float64 (`x == 1j`) computes in complex128
    return found


def _complex_scalar(x: object) -> bool:
    """A Python complex, or a 0-d complex array or tensor (a torch dtype says `is_complex`, a NumPy one does not)."""
    if isinstance(x, complex):
        return True
    if getattr(x, "ndim", 1) != 0:
        return False
    is_complex = getattr(x.dtype, "is_complex", None)
    return is_complex if is_complex is not None else np.issubdtype(x.dtype, np.complexfloating)


def applies(array_dtypes: Iterable[object]) -> bool:
    """Whether the policy concerns a call with these JAX dtypes: a 64-bit float among them, on a TPU."""
    return any(np.dtype(d) in WIDE for d in array_dtypes if d is not None) and platform.platform() == "tpu"


def check(op: str, array_dtypes: Iterable[object]) -> None:
    """Raise for an op on complex128 on the TPU (named by its ATen name, e.g. `aten::fft_fft`), before it runs."""
    array_dtypes = list(array_dtypes)
    if applies(array_dtypes) and any(d is not None and np.dtype(d) == COMPLEX128 for d in array_dtypes):
        raise Unsupported(
            f"torch_tpu: '{op}' on complex128: the TPU has no complex128 (XLA's TPU compiler aborts on it); use "
            f"complex64, or compute on CPU (`.cpu()`)"
        )


def refusal(op: str, error: Exception, array_dtypes: Iterable[object]) -> Unsupported | None:
    """XLA's compile error for a float64 op on the TPU, as an error naming the op (None: another error)."""
    if applies(array_dtypes) and any(word in str(error).lower() for word in _XLA_REFUSALS):
        return Unsupported(
            f"torch_tpu: '{op}' is not supported in float64 on the TPU (XLA: {str(error).splitlines()[0][:160]}); "
            f"compute it in float32 (`.float()`), or on CPU (`.cpu()`)"
        )
    return None
