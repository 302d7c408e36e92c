"""`torch.distributed` on tpu tensors: the `tpu_dist` backend (alias `tpu`), its collectives run as XLA programs.

`dist.init_process_group("tpu_dist")` (or `"tpu"`, or no backend on a tpu job) starts JAX's multi-controller
runtime from torch's rendezvous; each process owns its one local device. Importing this package only registers
the backend with torch.distributed: no JAX state is touched until a group is created.
"""

from torch_tpu.distributed.process_group import register as register

__all__ = ["register"]
