"""Lowerings: dropout (a threefry stream of its own, so values differ from CPU PyTorch's) and its backward."""

import jax
import jax.numpy as jnp

from torch_tpu.ops.registry import aten, lower


@lower(aten.native_dropout.default, rng=True)
def native_dropout(input, p, train, *, key):
    if train is False:
        return input, jnp.ones(input.shape, bool)
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key, impl="threefry2x32"), 1 - p, input.shape)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return input * keep.astype(input.dtype) * scale, keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask.astype(grad_output.dtype) * scale
