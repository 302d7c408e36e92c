"""`torch.distributed` on tpu tensors: the `tpu_dist` backend (alias `tpu`), its collectives run as XLA programs.

`dist.init_process_group("tpu_dist")` (or `"tpu"`, or no backend on a tpu job) starts JAX's multi-controller
runtime from torch's rendezvous; each process owns its one local device. torch_tpu's registration
(`torch_tpu.wiring`) registers the backend with torch.distributed and adapts torch's DDP/DeviceMesh code
(`torch_patches`): no JAX state is touched until a group is created. This package is also
`torch.tpu.distributed`, whose public names are `__all__`.
"""

from torch_tpu.distributed.functional_eager import spmd_safe as spmd_safe
from torch_tpu.distributed.launch_env import set_tpu_launch_env as set_tpu_launch_env
from torch_tpu.distributed.topology import topology_aware_mesh as topology_aware_mesh

__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh"]
