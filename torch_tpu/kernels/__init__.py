"""Kernels as PyTorch ops: prebuilt ones (`torch.tpu.ops`, `kernels.prebuilt`) and users' JAX/Pallas functions."""
