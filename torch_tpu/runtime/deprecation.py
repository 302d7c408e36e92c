"""CPU PyTorch's deprecation warnings for inputs it still accepts (a uint8 mask or condition), given by the lowerings
that accept them alike, so that code moved to the device is told what it is told on CPU."""

from __future__ import annotations

import os
import sys
import warnings

import jax

_INTERNAL = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(jax.__file__))


def warn(message: str) -> None:
    """A UserWarning (CPU's TORCH_WARN), attributed as CPU's is to the innermost caller outside torch_tpu and JAX:
    the warnings filters then see the user's line, not ours."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, UserWarning, stacklevel=level)
