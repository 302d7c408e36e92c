"""Kernels as PyTorch ops: prebuilt ones (`torch.tpu.ops`, `kernels.prebuilt`) and users' JAX and Pallas
functions (`torch.tpu.pallas`). A layer above `compile`: its ops are lowerings in the one registry, so eager and
compiled graphs run them like ATen ops."""

import sys


def _register() -> None:
    """`torch.tpu.pallas` becomes `torch_tpu.kernels.pallas` (jax.experimental.pallas is imported only when a
    kernel traces)."""
    from torch_tpu import tpu
    from torch_tpu.kernels import pallas

    tpu.pallas = pallas
    sys.modules["torch.tpu.pallas"] = pallas
