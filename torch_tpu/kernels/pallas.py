"""`torch.tpu.pallas`: JAX and Pallas functions as PyTorch ops (TorchTPU's names).

`jax_op("ns::name", fn)` makes the op (`kernels.jax_op`); `register_lowering(op, fn)` gives any custom op a JAX
implementation on tpu after import.
"""

from torch_tpu.kernels.jax_op import KernelError as KernelError
from torch_tpu.kernels.jax_op import jax_op as jax_op
from torch_tpu.kernels.jax_op import register_lowering as register_lowering

__all__ = ["KernelError", "jax_op", "register_lowering"]
