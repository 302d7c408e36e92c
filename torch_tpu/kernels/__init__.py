"""Kernels as PyTorch ops: prebuilt ones (`torch.tpu.ops`, `kernels.prebuilt`) and users' JAX and Pallas
functions (`torch.tpu.pallas`). A layer above `compile`: its ops are lowerings in the one registry, so eager and
compiled graphs run them like ATen ops."""
