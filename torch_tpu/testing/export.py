"""Lowering a kernel for a platform this host does not have (`jax.export`), to check what a TPU or GPU would get.

On the CPU host a GPU lowering of a Pallas (Triton) kernel needs a GPU to read its compute capability from; jax
>= 0.11 asks for an abstract GPU device instead, which `exported` names (an H100: compute capability 9.0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import export
from jax.sharding import AbstractDevice, AbstractMesh

GPU_TARGET = AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")


def exported(fn: Callable, args: Sequence[Any], platform: str, disabled_checks: Sequence[Any] = ()) -> export.Exported:
    """`fn(*args)` exported for `platform` ("tpu", "cuda") with x64 off, as `jax_op` traces kernels."""
    target = (
        jax.sharding.use_abstract_mesh(AbstractMesh((), (), abstract_device=GPU_TARGET))
        if platform in ("cuda", "rocm", "gpu")
        else contextlib.nullcontext()
    )
    with jax.enable_x64(False), target:
        return export.export(jax.jit(fn), platforms=[platform], disabled_checks=list(disabled_checks))(*args)
