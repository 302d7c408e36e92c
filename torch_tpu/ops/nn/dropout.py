"""Lowerings: random regularizers, dropout and randomized leaky ReLU, with their backward ops. Their threefry
streams are their own, so values differ from CPU PyTorch's.

`rrelu_with_noise` writes the slopes it draws into its `noise` argument, which the derived variants (writing only
`self` / `out`) cannot express: it is a direct kernel over the functional `rrelu_with_noise_functional` lowering.
"""

import jax
import jax.numpy as jnp

from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.random import threefry_key
from torch_tpu.ops.registry import aten, kernel, lower


@lower(aten.native_dropout.default, rng=True)
def native_dropout(input, p, train, *, key):
    if train is False:
        return input, jnp.ones(input.shape, bool)
    keep = jax.random.bernoulli(threefry_key(key), 1 - p, input.shape)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return input * keep.astype(input.dtype) * scale, keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask.astype(grad_output.dtype) * scale


@lower(aten.rrelu_with_noise_functional.default, rng=True)
def rrelu_with_noise_functional(self, noise, lower=0.125, upper=1 / 3, training=False, *, generator=None, key):
    """Training: each non-positive element is scaled by a slope drawn from U(lower, upper) (float32 for half
    types), recorded in the new noise (1 elsewhere). Otherwise leaky ReLU with the mean slope, noise unchanged."""
    x = upcast(self)
    if not training:
        return jnp.where(x > 0, x, x * ((lower + upper) / 2)), noise
    slopes = jax.random.uniform(threefry_key(key), self.shape, x.dtype, lower, upper)
    new_noise = jnp.where(x > 0, 1, slopes)
    return x * new_noise, new_noise


@kernel(aten.rrelu_with_noise.default)
def rrelu_with_noise(self, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    out, new_noise = aten.rrelu_with_noise_functional(self, noise, lower, upper, training, generator=generator)
    if training:
        noise.copy_(new_noise)
    return out


@lower(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    """The drawn slopes in training (unless the range is empty: then, like CPU, the mean slope)."""
    grad = upcast(grad_output)
    leaky = jnp.where(upcast(self) > 0, grad, grad * ((lower + upper) / 2))
    if not training:
        return leaky
    return jnp.where(upper - lower > 1e-6, grad * upcast(noise), leaky)
