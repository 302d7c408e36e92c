"""Lowerings: activation functions and the backward ops autograd calls for them."""

import math

import jax
import jax.numpy as jnp
from jax.scipy import special

from torch_tpu.ops.elementwise import clamp
from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import dtypes

# Python floats: weakly typed, so they take the input's precision (a numpy float64 would promote to float64).
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
_SQRT_2PI = math.sqrt(2 * math.pi)


@lower(aten.relu.default)
def relu(self):
    return jnp.maximum(self, 0)


@lower(aten._prelu_kernel.default)
def _prelu_kernel(self, weight):
    x, w = dtypes.common(self, weight)
    return jnp.where(x > 0, x, w * x)


@lower(aten._prelu_kernel_backward.default)
def _prelu_kernel_backward(grad_output, self, weight):
    grad, x, w = dtypes.common(grad_output, self, weight)
    positive = x > 0
    return jnp.where(positive, grad, w * grad), jnp.where(positive, 0, x * grad)


@lower(aten.threshold.default)
def threshold(self, threshold, value):
    (x,) = dtypes.common(self)
    return jnp.where(x <= threshold, value, x)


@lower(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    grad, x = dtypes.common(grad_output, self)
    return jnp.where(x <= threshold, 0, grad)


@lower(aten.gelu.default)
def gelu(self, *, approximate="none"):
    (x,) = dtypes.floating(self)
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return x * 0.5 * (1 + special.erf(x * _SQRT_HALF))


@lower(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    grad, x = dtypes.floating(grad_output, self)
    if approximate == "tanh":
        inner = jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
        slope = 0.5 * x * (1 - inner * inner) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return grad * (0.5 * (1 + inner) + slope)
    cdf = 0.5 * (1 + special.erf(x * _SQRT_HALF))
    return grad * (cdf + x * jnp.exp(-0.5 * x * x) / _SQRT_2PI)


@lower(aten.silu.default)
def silu(self):
    (x,) = dtypes.floating(self)
    return x * jax.nn.sigmoid(x)


@lower(aten.mish.default)
def mish(self):
    (x,) = dtypes.floating(self)
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    grad, y = dtypes.floating(grad_output, output)
    return grad * (1 - y) * y


@lower(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    grad, y = dtypes.floating(grad_output, output)
    return grad * (1 - y * y)


@lower(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    (x,) = dtypes.floating(self)
    return jnp.where(x <= 0, jnp.expm1(x * input_scale) * alpha * scale, x * scale)


@lower(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    grad, y = dtypes.floating(grad_output, self_or_result)
    if is_result:
        return jnp.where(y <= 0, grad * input_scale * (y + alpha * scale), grad * scale)
    return jnp.where(y <= 0, grad * input_scale * alpha * scale * jnp.exp(y * input_scale), grad * scale)


@lower(aten.celu.default)
def celu(self, alpha=1.0):
    return elu(self, alpha, 1, 1 / alpha)


@lower(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    (x,) = dtypes.floating(self)
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.leaky_relu_backward.default, static=("negative_slope",))
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    """`negative_slope` is compiled in, so that an in-place forward's negative slope (whose output cannot tell the
    input's sign) is refused as on CPU."""
    if self_is_result and negative_slope < 0:
        raise RuntimeError(
            "In-place leakyReLu backward calculation is triggered with a negative slope which is not supported. "
            "This is caused by calling in-place forward function with a negative slope, please call out-of-place "
            "version instead. File an issue at https://github.com/pytorch/pytorch if you do require supporting "
            "in-place leakRelu backward calculation with negative slope"
        )
    grad, x = dtypes.floating(grad_output, self)
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    return clamp(self, min_val, max_val)


@lower(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, self, min_val, max_val):
    grad, x = dtypes.floating(grad_output, self)
    return jnp.where((x <= min_val) | (x >= max_val), 0, grad)


@lower(aten.hardsigmoid.default)
def hardsigmoid(self):
    (x,) = dtypes.floating(self)
    return jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    grad, x = dtypes.floating(grad_output, self)
    return jnp.where((x > -3) & (x < 3), grad / 6, 0)


@lower(aten.hardswish.default)
def hardswish(self):
    (x,) = dtypes.floating(self)
    return x * jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    grad, x = dtypes.floating(grad_output, self)
    return jnp.where(x < -3, 0, jnp.where(x <= 3, grad * (x / 3 + 0.5), grad))


@lower(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    (x,) = dtypes.floating(self)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@lower(aten.softplus_backward.default)
def softplus_backward(grad_output, self, beta, threshold):
    grad, x = dtypes.floating(grad_output, self)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@lower(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    (x,) = dtypes.floating(self)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0))


@lower(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    (x,) = dtypes.floating(self)
    return jnp.where((x >= -lambd) & (x <= lambd), 0, x)


@lower(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    grad, x = dtypes.floating(grad_output, self)
    return jnp.where((x >= -lambd) & (x <= lambd), 0, grad)


@lower(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    return softshrink_backward(grad_out, self, lambd)


@lower(aten.logit.default)
def logit(self, eps=None):
    (x,) = dtypes.floating(self)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lower(aten.logit_backward.default)
def logit_backward(grad_output, self, eps=None):
    grad, x = dtypes.floating(grad_output, self)
    low, high = (0, 1) if eps is None else (eps, 1 - eps)
    outside = jnp.nan if eps is None else 0
    return jnp.where((x < low) | (x > high), outside, grad / (x * (1 - x)))


@lower(aten.glu.default)
def glu(self, dim=-1):
    a, b = jnp.split(dtypes.floating(self)[0], 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    grad, x = dtypes.floating(grad_output, self)
    a, b = jnp.split(x, 2, axis=dim)
    gate = jax.nn.sigmoid(b)
    return jnp.concatenate([gate * grad, (1 - gate) * gate * grad * a], axis=dim)


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    (x,) = dtypes.floating(self)
    buffer = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(buffer), buffer


@lower(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    grad, x = dtypes.floating(grad_output, self)
    z = jnp.exp(-jnp.abs(x))
    share = z / (1 + z)
    return jnp.where(x < 0, 1 - share, share) * grad
