"""Lowerings: pointwise unary and binary ops. Output dtypes follow PyTorch's meta kernels (see eager.dispatch)."""

import jax.numpy as jnp

from torch_tpu.ops.registry import aten, lower


@lower(aten.add.Tensor, aten.add.Scalar)
def add(self, other, *, alpha=1):
    return self + other * alpha


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    return self * other


@lower(aten.relu.default)
def relu(self):
    return jnp.maximum(self, 0)
