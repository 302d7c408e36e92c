"""Lowerings: embedding lookup, its dense backward, and max-norm renormalization of the looked-up rows."""

import jax.numpy as jnp

from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, lower


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight[indices]


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    index = indices.reshape(-1)
    grad = upcast(grad_output).reshape(index.size, -1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[index].add(1)
        grad = grad / counts[index][:, None]
    grad = jnp.where((index != padding_idx)[:, None], grad, 0)
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[index].add(grad)


@lower(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    looked_up = jnp.zeros(self.shape[0], bool).at[indices.reshape(-1)].set(True)
    norms = jnp.linalg.norm(upcast(self), ord=norm_type, axis=1)
    scale = jnp.where(looked_up & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return self * scale[:, None].astype(self.dtype)
