"""Lowerings: batch, layer and group normalization and their backward ops (statistics in float32 for half types).

`_native_batch_norm_legit` and `_batch_norm_with_update` update `running_mean` / `running_var` in place: their
functional forms are lowered with `writes=("running_mean", "running_var")`, returning the new statistics, which
eager writes into the buffers (`native_batch_norm` routes to one or the other).

Saved statistics (mean, rstd) take CPU PyTorch's dtype: the input's, or float32 where a half-type input meets
float32 parameters. PyTorch's meta kernels, which set the dtypes of eager outputs, follow CUDA instead (always
float32 for half types), so an eager op's executable casts them to CPU's (`eager_dtypes=_cpu_stats`); compiled
graphs keep the meta dtypes, as their FakeTensors do.
"""

import jax.numpy as jnp
import torch

from torch_tpu.ops.nn.common import masked, upcast
from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import dtypes


def _stats_dtype(input: torch.Tensor, *parameters: torch.Tensor | None) -> torch.dtype:
    """CPU's dtype of saved statistics: float32 when a half-type input has parameters of another dtype."""
    half = input.dtype in (torch.bfloat16, torch.float16)
    mixed = half and any(p is not None and p.dtype != input.dtype for p in parameters)
    return torch.float32 if mixed else input.dtype


def _cpu_stats(out_dtypes: tuple, input: torch.Tensor, *args: object, **kwargs: object) -> tuple:
    """An eager kernel's output dtypes with the saved statistics (outputs 1 and 2) in CPU's dtype; the parameters
    are the tensor arguments after the input."""
    stats = dtypes.to_jax(_stats_dtype(input, *[a for a in args if isinstance(a, torch.Tensor)]))
    return (out_dtypes[0], stats, stats, *out_dtypes[3:])


def _channel_shape(x):
    """Broadcast shape of a per-channel (dim 1) vector against `x`."""
    return (1, -1) + (1,) * (x.ndim - 2)


def _affine(normalized, weight, bias, shape):
    if weight is not None:
        normalized = normalized * upcast(weight).reshape(shape)
    if bias is not None:
        normalized = normalized + upcast(bias).reshape(shape)
    return normalized


def _moments(x, axes):
    """Mean and biased variance over `axes`, kept as size-1 dims."""
    mean = jnp.mean(x, axis=axes, keepdims=True)
    return mean, jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)


def _normalized_grad(grad_normalized, normalized, rstd, axes):
    """Gradient through `(x - mean(x)) * rstd` with the statistics taken over `axes` of x."""
    mean_grad = jnp.mean(grad_normalized, axis=axes, keepdims=True)
    mean_projection = jnp.mean(grad_normalized * normalized, axis=axes, keepdims=True)
    return rstd * (grad_normalized - mean_grad - normalized * mean_projection)


def _batch_axes(x):
    return (0, *range(2, x.ndim))


def _batch_norm_train(input, weight, bias, eps):
    x = upcast(input)
    axes = _batch_axes(x)
    mean, var = _moments(x, axes)
    rstd = 1 / jnp.sqrt(var + eps)
    out = _affine((x - mean) * rstd, weight, bias, _channel_shape(x))
    return out, mean.reshape(-1), rstd.reshape(-1), var.reshape(-1)


def _batch_norm_eval(input, weight, bias, running_mean, running_var, eps):
    x = upcast(input)
    shape = _channel_shape(x)
    rstd = 1 / jnp.sqrt(upcast(running_var).reshape(shape) + eps)
    out = _affine((x - upcast(running_mean).reshape(shape)) * rstd, weight, bias, shape)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty


@lower(
    aten._native_batch_norm_legit_functional.default, writes=("running_mean", "running_var"), eager_dtypes=_cpu_stats
)
def _native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out, save_mean, save_invstd = _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)
        return out, save_mean, save_invstd, running_mean, running_var
    out, mean, rstd, var = _batch_norm_train(input, weight, bias, eps)
    count = input.size // input.shape[1]
    unbiased = var * (count / max(count - 1, 1))
    new_mean = (1 - momentum) * upcast(running_mean) + momentum * mean
    new_var = (1 - momentum) * upcast(running_var) + momentum * unbiased
    return out, mean, rstd, new_mean, new_var


@lower(aten._native_batch_norm_legit.no_stats, eager_dtypes=_cpu_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm_train(input, weight, bias, eps)[:3]


@lower(aten._native_batch_norm_legit_no_training.default, eager_dtypes=_cpu_stats)
def _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)


@kernel(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None or running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    return aten._native_batch_norm_legit.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )


@lower(aten._batch_norm_with_update_functional.default, writes=("running_mean", "running_var"), eager_dtypes=_cpu_stats)
def _batch_norm_with_update_functional(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, rstd, new_mean, new_var = _native_batch_norm_legit_functional(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return out, mean, rstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    x, grad = upcast(input), upcast(grad_out)
    shape, axes = _channel_shape(x), _batch_axes(x)
    if train:
        mean, rstd = upcast(save_mean).reshape(shape), upcast(save_invstd).reshape(shape)
    else:
        mean = upcast(running_mean).reshape(shape)
        rstd = 1 / jnp.sqrt(upcast(running_var).reshape(shape) + eps)
    normalized = (x - mean) * rstd
    grad_normalized = _affine(grad, weight, None, shape)
    if train:
        grad_input = _normalized_grad(grad_normalized, normalized, rstd, axes)
    else:
        grad_input = grad_normalized * rstd
    grad_weight = jnp.sum(grad * normalized, axis=axes)
    return masked(output_mask, grad_input, grad_weight, jnp.sum(grad, axis=axes))


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve
):
    """The backward of `_batch_norm_with_update` (`update`) and `_batch_norm_no_update`; `save_var` is the saved
    inverse standard deviation."""
    return native_batch_norm_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask
    )


def _trailing_axes(x, count):
    return tuple(range(x.ndim - count, x.ndim))


@lower(aten.native_layer_norm.default, eager_dtypes=_cpu_stats)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = upcast(input)
    axes = _trailing_axes(x, len(normalized_shape))
    mean, var = _moments(x, axes)
    rstd = 1 / jnp.sqrt(var + eps)
    return _affine((x - mean) * rstd, weight, bias, tuple(normalized_shape)), mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    x, grad = upcast(input), upcast(grad_out)
    axes = _trailing_axes(x, len(normalized_shape))
    leading = tuple(range(x.ndim - len(normalized_shape)))
    normalized = (x - upcast(mean)) * upcast(rstd)
    grad_input = _normalized_grad(_affine(grad, weight, None, tuple(normalized_shape)), normalized, upcast(rstd), axes)
    grad_weight = jnp.sum(grad * normalized, axis=leading)
    return masked(output_mask, grad_input, grad_weight, jnp.sum(grad, axis=leading))


@lower(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = upcast(input).reshape(N, group, C // group * HxW)
    mean, var = _moments(x, (2,))
    rstd = 1 / jnp.sqrt(var + eps)
    normalized = ((x - mean) * rstd).reshape(input.shape)
    out = _affine(normalized, weight, bias, _channel_shape(input))
    return out, mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    grouped, per_channel = (N, group, C // group * HxW), (N, C, HxW)  # explicit sizes: N may be 0
    x = upcast(input).reshape(grouped)
    grad = upcast(grad_out)
    mean, rstd = upcast(mean)[..., None], upcast(rstd)[..., None]
    normalized = (x - mean) * rstd
    grad_normalized = _affine(grad, weight, None, _channel_shape(grad)).reshape(grouped)
    grad_input = _normalized_grad(grad_normalized, normalized, rstd, (2,)).reshape(input.shape)
    grad_weight = jnp.sum(grad.reshape(per_channel) * normalized.reshape(per_channel), axis=(0, 2))
    return masked(output_mask, grad_input, grad_weight, jnp.sum(grad.reshape(per_channel), axis=(0, 2)))
