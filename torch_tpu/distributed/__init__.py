"""`torch.distributed` on tpu tensors: the `tpu_dist` backend (alias `tpu`), its collectives run as XLA programs.

`dist.init_process_group("tpu_dist")` (or `"tpu"`, or no backend on a tpu job) starts JAX's multi-controller
runtime from torch's rendezvous; each process owns its one local device. Importing this package only registers
the backend with torch.distributed: no JAX state is touched until a group is created. This package is also
`torch.tpu.distributed`, whose public names are `__all__`.
"""

from torch_tpu.distributed import process_group as _process_group
from torch_tpu.distributed import spmd as _spmd

__all__: list[str] = []


def register() -> None:
    """Register the backend with torch.distributed, and make compiled graphs with collectives run SPMD."""
    _process_group.register()
    _spmd.install()
