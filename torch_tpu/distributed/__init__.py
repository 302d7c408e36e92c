"""`torch.distributed` on tpu tensors: the `tpu_dist` backend (alias `tpu`), its collectives run as XLA programs.

`dist.init_process_group("tpu_dist")` (or `"tpu"`, or no backend on a tpu job) starts JAX's multi-controller
runtime from torch's rendezvous; each process owns its one local device. Importing this package only registers
the backend with torch.distributed (and adapts torch's DDP/DeviceMesh code, `torch_patches`): no JAX state is
touched until a group is created. This package is also `torch.tpu.distributed`, whose public names are `__all__`.
"""

import sys

from torch_tpu.distributed import dim_collectives as _dim_collectives
from torch_tpu.distributed import functional_eager as _functional_eager
from torch_tpu.distributed import point_to_point as _point_to_point
from torch_tpu.distributed import process_group as _process_group
from torch_tpu.distributed import spmd as _spmd
from torch_tpu.distributed import torch_patches as _torch_patches
from torch_tpu.distributed.functional_eager import spmd_safe as spmd_safe
from torch_tpu.distributed.launch_env import set_tpu_launch_env as set_tpu_launch_env
from torch_tpu.distributed.topology import topology_aware_mesh as topology_aware_mesh

__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh"]


def _register() -> None:
    """Register the backend with torch.distributed, adapt torch's DDP and DeviceMesh, install the functional
    collectives' eager kernels, the order of batched send/recv, and the hook that makes compiled graphs with
    collectives run SPMD; this package becomes `torch.tpu.distributed`."""
    from torch_tpu import tpu

    _process_group.register()
    _torch_patches.install()
    _functional_eager.install()
    _point_to_point.install()
    _spmd.install()
    _dim_collectives.install()  # torch.tpu.ops.all_gather_dim / reduce_scatter_dim
    tpu.distributed = sys.modules[__name__]
    sys.modules["torch.tpu.distributed"] = sys.modules[__name__]
