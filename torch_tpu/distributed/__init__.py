"""`torch.distributed` on tpu tensors: the `tpu_dist` backend (alias `tpu`), its collectives run as XLA programs.

`dist.init_process_group("tpu_dist")` (or `"tpu"`, or no backend on a tpu job) starts JAX's multi-controller
runtime from torch's rendezvous; each process owns its one local device. Importing this package only registers
the backend with torch.distributed (and adapts torch's DDP/DeviceMesh code, `torch_patches`): no JAX state is
touched until a group is created. `torch.tpu.distributed` is this package.
"""

from torch_tpu.distributed import process_group as _process_group
from torch_tpu.distributed import torch_patches as _torch_patches
from torch_tpu.distributed.launch_env import set_tpu_launch_env as set_tpu_launch_env

__all__ = ["register", "set_tpu_launch_env"]


def register() -> None:
    """Register `tpu_dist` and its alias `tpu` with torch.distributed, and adapt torch's DDP and DeviceMesh."""
    _process_group.register()
    _torch_patches.install()
