"""Lowerings: loss functions and their backward ops. `reduction` is ATen's enum: 0 none, 1 mean, 2 sum."""

import jax
import jax.numpy as jnp

from torch_tpu.ops.nn.common import MEAN, SUM, loss_scale, reduce_loss, upcast
from torch_tpu.ops.registry import aten, lower


def _nll_terms(self, target, weight, ignore_index):
    """The class dim (1, or 0 unbatched), the targets made safe to index with, and per-target weights (0 where
    the target is ignored)."""
    class_axis = 1 if self.ndim > 1 else 0
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    weights = jnp.ones((), jnp.float32) if weight is None else upcast(weight)[safe]
    return class_axis, safe, jnp.where(valid, weights, 0)


@lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    class_axis, safe, weights = _nll_terms(self, target, weight, ignore_index)
    picked = jnp.take_along_axis(upcast(self), jnp.expand_dims(safe, class_axis), axis=class_axis)
    losses = jnp.where(weights != 0, -jnp.squeeze(picked, class_axis) * weights, 0)
    total_weight = jnp.sum(weights)
    if reduction == MEAN:
        return jnp.sum(losses) / total_weight, total_weight
    if reduction == SUM:
        return jnp.sum(losses), total_weight
    return losses, jnp.zeros((), total_weight.dtype)


@lower(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    class_axis, safe, weights = _nll_terms(self, target, weight, ignore_index)
    grad = upcast(grad_output)
    if reduction == MEAN:
        grad = grad / total_weight
    per_target = jnp.where(weights != 0, -weights * grad, 0)
    one_hot = jax.nn.one_hot(safe, self.shape[class_axis], dtype=bool, axis=class_axis)
    return jnp.where(one_hot, jnp.expand_dims(per_target, class_axis), 0)


@lower(aten.mse_loss.default)
def mse_loss(self, target, reduction=MEAN):
    return reduce_loss(jnp.square(upcast(self) - upcast(target)), reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    return 2 * (upcast(self) - upcast(target)) * loss_scale(upcast(grad_output), self.size, reduction)


def _weighted(loss, weight):
    return loss if weight is None else loss * upcast(weight)


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    x, y = upcast(self), upcast(target)
    log_x = jnp.maximum(jnp.log(x), -100)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100)
    return reduce_loss(_weighted((y - 1) * log_1mx - y * log_x, weight), reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    x, y = upcast(self), upcast(target)
    grad = (x - y) / jnp.maximum((1 - x) * x, 1e-12)
    return _weighted(grad, weight) * loss_scale(upcast(grad_output), self.size, reduction)


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=MEAN):
    x, y = upcast(self), upcast(target)
    log_sigmoid = jax.nn.log_sigmoid(x)
    positive = y if pos_weight is None else y * upcast(pos_weight)
    loss = (1 - y) * x - (positive + 1 - y) * log_sigmoid
    return reduce_loss(_weighted(loss, weight), reduction)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=MEAN, beta=1.0):
    z = jnp.abs(upcast(self) - upcast(target))
    loss = z if beta == 0 else jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    return reduce_loss(loss, reduction)


@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    z = upcast(self) - upcast(target)
    grad = jnp.sign(z) if beta == 0 else jnp.clip(z / beta, -1, 1)
    return grad * loss_scale(upcast(grad_output), self.size, reduction)


@lower(aten.huber_loss.default)
def huber_loss(self, target, reduction=MEAN, delta=1.0):
    z = jnp.abs(upcast(self) - upcast(target))
    return reduce_loss(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction)


@lower(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    z = upcast(self) - upcast(target)
    return jnp.clip(z, -delta, delta) * loss_scale(upcast(grad_output), self.size, reduction)
