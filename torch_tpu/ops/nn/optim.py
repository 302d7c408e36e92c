"""Kernels: the fused optimizer steps (`torch.optim.{SGD,Adam,AdamW,Adagrad}(..., fused=True)`) and the ops of
`torch.amp.GradScaler` (unscale-and-check of the gradients, scale update).

PyTorch lists every PrivateUse1 backend among the devices with fused optimizers, so `fused=True` calls
`_fused_{sgd,adam,adamw,adagrad}_` on `tpu`. Each updates several tensor lists in place, which the derived
in-place variants (which write only `self`) cannot express: these are direct kernels that run one jitted step
over all the tensors of a parameter group and write the new values back. The math is in float32 for half types,
as in PyTorch's fused kernels; `grad_scale` unscales the gradients (written back) and a nonzero `found_inf`
leaves every tensor as it was. The step counts in `state_steps` were already incremented by the optimizer.
"""

import functools
import math

import jax
import jax.numpy as jnp
import torch

from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import deferred, storage


def _value(tensor):
    """The tensor's computed value (in Fused eager mode, running the pending cluster first)."""
    return deferred.concrete(storage.value(tensor))


def _values(tensors):
    return [upcast(_value(t)) for t in tensors]


def _write(tensors, values):
    for tensor, value in zip(tensors, values, strict=True):
        storage.write(tensor, value)


def _scalar(value):
    """A run-time scalar for the jitted step (a learning-rate tensor may live on the CPU)."""
    if isinstance(value, torch.Tensor):
        return _value(value) if value.device.type == "tpu" else value.item()
    return value


def _optional(tensor):
    return None if tensor is None else _value(tensor)


def _unscale(grads, grad_scale, maximize):
    """The unscaled gradients (what is written back) and the ones the step uses (negated to maximize)."""
    if grad_scale is not None:
        grads = [g / grad_scale.astype(jnp.float32) for g in grads]
    return grads, [-g for g in grads] if maximize else grads


def _unless_inf(found_inf, new, old):
    """`new`, or `old` if the grad scaler found an Inf/NaN gradient (both are lists of lists of arrays)."""
    if found_inf is None:
        return new
    skip = found_inf.reshape(()) != 0
    return [[jnp.where(skip, o, n) for n, o in zip(*pair, strict=True)] for pair in zip(new, old, strict=True)]


def _one_minus_power(beta, step):
    """1 - beta ** step in float32 without cancellation (via expm1 of step * log(beta), the log in float64)."""
    return -jnp.expm1(step * jnp.float32(math.log(beta)))


@functools.cache
def _adam_step(beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled):
    @jax.jit
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, grad_scale, found_inf):
        original = grads
        unscaled, grads = _unscale(grads, grad_scale, maximize)
        new = [[], [], [], []]
        for i, (param, grad, exp_avg, exp_avg_sq) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)):
            count = steps[i].astype(jnp.float32)
            if weight_decay != 0:
                if decoupled:
                    param = param - lr * weight_decay * param
                else:
                    grad = grad + weight_decay * param
            exp_avg = exp_avg + (1 - beta1) * (grad - exp_avg)
            exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
            second = exp_avg_sq
            if amsgrad:
                second = jnp.maximum(max_exp_avg_sqs[i], exp_avg_sq)
                new[3].append(second)
            denom = jnp.sqrt(second) / jnp.sqrt(_one_minus_power(beta2, count)) + eps
            new[0].append(param - lr / _one_minus_power(beta1, count) * exp_avg / denom)
            new[1].append(exp_avg)
            new[2].append(exp_avg_sq)
        old = [params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], original]
        return _unless_inf(found_inf, [*new, unscaled], old)

    return step


def _adam(
    self,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale,
    found_inf,
    decoupled,
):
    step = _adam_step(beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled)
    params, averages, squares, maxima, unscaled = step(
        _values(self), _values(grads), _values(exp_avgs), _values(exp_avg_sqs), _values(max_exp_avg_sqs),
        _values(state_steps), _scalar(lr), _optional(grad_scale), _optional(found_inf),
    )  # fmt: skip
    _write(self, params)
    _write(exp_avgs, averages)
    _write(exp_avg_sqs, squares)
    if amsgrad:
        _write(max_exp_avg_sqs, maxima)
    if grad_scale is not None:
        _write(grads, unscaled)


@kernel(aten._fused_adam_.default, aten._fused_adam_.tensor_lr)
def _fused_adam_(
    self,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    *,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale=None,
    found_inf=None,
):
    _adam(
        self,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale,
        found_inf,
        decoupled=False,
    )


@kernel(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)
def _fused_adamw_(
    self,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    *,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale=None,
    found_inf=None,
):
    _adam(
        self,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale,
        found_inf,
        decoupled=True,
    )


@functools.cache
def _sgd_step(weight_decay, momentum, dampening, nesterov, maximize, is_first_step):
    @jax.jit
    def step(params, grads, momentum_buffers, lr, grad_scale, found_inf):
        original = grads
        unscaled, grads = _unscale(grads, grad_scale, maximize)
        new = [[], []]
        for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
            if weight_decay != 0:
                grad = grad + weight_decay * param
            if momentum != 0:
                buffer = grad if is_first_step else momentum * momentum_buffers[i] + (1 - dampening) * grad
                new[1].append(buffer)
                grad = grad + momentum * buffer if nesterov else buffer
            new[0].append(param - lr * grad)
        old = [params, momentum_buffers if momentum != 0 else [], original]
        return _unless_inf(found_inf, [*new, unscaled], old)

    return step


@kernel(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def _fused_sgd_(
    self,
    grads,
    momentum_buffer_list,
    *,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    step = _sgd_step(weight_decay, momentum, dampening, nesterov, maximize, is_first_step)
    params, buffers, unscaled = step(
        _values(self), _values(grads), _values(momentum_buffer_list), _scalar(lr), _optional(grad_scale),
        _optional(found_inf),
    )  # fmt: skip
    _write(self, params)
    if momentum != 0:
        _write(momentum_buffer_list, buffers)
    if grad_scale is not None:
        _write(grads, unscaled)


@functools.cache
def _adagrad_step(lr_decay, weight_decay, eps, maximize):
    @jax.jit
    def step(params, grads, state_sums, steps, lr, grad_scale, found_inf):
        original = grads
        unscaled, grads = _unscale(grads, grad_scale, maximize)
        new = [[], []]
        for param, grad, state_sum, count in zip(params, grads, state_sums, steps, strict=True):
            if weight_decay != 0:
                grad = grad + weight_decay * param
            state_sum = state_sum + grad * grad
            clr = lr / (1 + (count.astype(jnp.float32) - 1) * lr_decay)
            new[0].append(param - clr * grad / (jnp.sqrt(state_sum) + eps))
            new[1].append(state_sum)
        return _unless_inf(found_inf, [*new, unscaled], [params, state_sums, original])

    return step


@kernel(aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr)
def _fused_adagrad_(
    self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None, found_inf=None
):
    step = _adagrad_step(lr_decay, weight_decay, eps, maximize)
    params, sums, unscaled = step(
        _values(self), _values(grads), _values(state_sums), _values(state_steps), _scalar(lr),
        _optional(grad_scale), _optional(found_inf),
    )  # fmt: skip
    _write(self, params)
    _write(state_sums, sums)
    if grad_scale is not None:
        _write(grads, unscaled)


@jax.jit
def _unscale_and_check(grads, found_inf, inv_scale):
    nonfinite = [~jnp.all(jnp.isfinite(g)) for g in grads]
    found = jnp.any(jnp.stack(nonfinite)) if grads else False
    return [upcast(g) * inv_scale for g in grads], jnp.where(found, jnp.ones_like(found_inf), found_inf)


@kernel(aten._amp_foreach_non_finite_check_and_unscale_.default)
def _amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    grads, found = _unscale_and_check([_value(t) for t in self], _value(found_inf), _value(inv_scale))
    _write(self, grads)
    storage.write(found_inf, found)


@lower(aten._amp_update_scale.default)
def _amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    found = found_inf.reshape(self.shape) != 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = self * scale_growth_factor
    grown = jnp.where(grow & jnp.isfinite(grown), grown, self)
    scale = jnp.where(found, self * scale_backoff_factor, grown)
    return scale, jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)


@kernel(aten._amp_update_scale_.default)
def _amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    scale, tracker = aten._amp_update_scale(
        self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval
    )
    self.copy_(scale)
    growth_tracker.copy_(tracker)
    return self
