"""The `torch.compile` backend "tpu" (loaded by Dynamo through the `torch_dynamo_backends` entry point)."""

import torch._dynamo.trace_rules

from torch_tpu.compile.backend import backend as backend

# Our eager kernels run as Python under the dispatcher, calling into JAX; when a compiled function runs eager
# code after a graph break, Dynamo must never try to compile those frames.
for _module in ("torch_tpu", "jax", "jaxlib", "ml_dtypes", "opt_einsum"):
    torch._dynamo.trace_rules.add(_module)

__all__ = ["backend"]
