"""`torch.tpu.ops`: prebuilt kernels as PyTorch ops (TorchTPU's names), each a `torch_tpu::*` operator lowered in the
one registry (eager in every mode, and inlined into `torch.compile(backend="tpu")` programs), with autograd where its
PyTorch counterpart has it, and a CPU kernel. `all_gather_dim` and `reduce_scatter_dim` are distributed's (a sibling
layer): `torch_tpu.distributed` sets them here when it registers. Installing also routes
`F.scaled_dot_product_attention` on tpu tensors (`kernels.prebuilt.sdpa`), and batched `torch.matmul` and
`F.linear` in Strict eager (`kernels.prebuilt.matmul`, `linear`)."""

import sys

import torch

__all__ = [
    "all_gather_dim",  # torch_tpu.distributed, a sibling layer, sets it
    "max_pool1d",  # install() sets it, and the others: torch.ops.torch_tpu.*, which Dynamo traces
    "max_pool2d",
    "max_pool3d",
    "optimization_barrier",
    "ragged_dot",
    "reduce_scatter_dim",  # torch_tpu.distributed, a sibling layer, sets it
    "splash_sdpa",
]
_OURS = ("max_pool1d", "max_pool2d", "max_pool3d", "optimization_barrier", "ragged_dot", "splash_sdpa")


def install() -> None:
    """Define the ops, route SDPA, and make this module `torch.tpu.ops` (once)."""
    from torch_tpu import tpu
    from torch_tpu.kernels.prebuilt import (
        cudnn,
        grouped,
        linear,
        matmul,
        pallas_gpu,
        pool,
        sdpa,
        splash,
        tokamax_attention,
    )

    if hasattr(tpu, "ops"):
        return
    splash.install()
    cudnn.install()
    pallas_gpu.install()
    tokamax_attention.install()
    grouped.install()
    pool.install()
    sdpa.install()
    matmul.install()
    linear.install()
    module = sys.modules[__name__]
    for name in _OURS:
        setattr(module, name, getattr(torch.ops.torch_tpu, name))
    tpu.ops = sys.modules["torch.tpu.ops"] = module
