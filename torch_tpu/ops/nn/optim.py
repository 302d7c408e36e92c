"""Lowerings: the fused optimizer steps (`torch.optim.{SGD,Adam,AdamW,Adagrad}(..., fused=True)`) and the ops of
`torch.amp.GradScaler` (unscale-and-check of the gradients, scale update).

PyTorch lists every PrivateUse1 backend among the devices with fused optimizers, so `fused=True` calls
`_fused_{sgd,adam,adamw,adagrad}_` on `tpu`. Each updates several tensor lists in place: their functional forms
are lowered with `writes=` (one program per parameter group's signature, in every eager mode and in compiled
graphs), returning the lists' new values, None for a tensor the step leaves as it is (the gradients unless
`grad_scale` unscales them), which eager then does not write. The math is in float32 for half types, as in
PyTorch's fused kernels, and each value goes back in its tensor's dtype; `grad_scale` unscales the gradients
(written back) and a nonzero `found_inf` leaves every tensor as it was. The step counts in `state_steps` were
already incremented by the optimizer. `lr` is a run-time scalar (`scalars=`): a schedule recompiles nothing.
"""

import math

import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import compat


def _learning_rate(lr):
    """`lr` as the weakly typed float64 scalar that a Python float traces as, whichever way it came (a float, a CPU
    tensor's value, a device tensor): `lr * weight_decay` is then computed in float64, as CPU's double `lr` is."""
    return compat.convert_element_type(jnp.asarray(lr), np.dtype(np.float64), weak_type=True)


def _upcast(tensors):
    return [upcast(t) for t in tensors]


def _unscale(grads, grad_scale, maximize):
    """The unscaled gradients (what is written back) and the ones the step uses (negated to maximize)."""
    if grad_scale is not None:
        grads = [g / grad_scale.astype(jnp.float32) for g in grads]
    return grads, [-g for g in grads] if maximize else grads


def _written(found_inf, *updates):
    """The values of the written lists, each update a triple (new values or None, old values, the list's inputs):
    the new values in the inputs' dtypes, or the old ones if the grad scaler found an Inf/NaN gradient; None per
    tensor of a list left as it is."""
    skip = None if found_inf is None else found_inf.reshape(()) != 0
    lists = []
    for new, old, inputs in updates:
        if new is None:
            lists.append([None] * len(inputs))
            continue
        if skip is not None:
            new = [jnp.where(skip, o, n) for n, o in zip(new, old, strict=True)]
        lists.append([n.astype(t.dtype) for n, t in zip(new, inputs, strict=True)])
    return tuple(lists)


def _one_minus_power(beta, step):
    """1 - beta ** step in float32 without cancellation (via expm1 of step * log(beta), the log in float64)."""
    return -jnp.expm1(step * jnp.float32(math.log(beta)))


def _adam(
    inputs, state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, *, decoupled
):
    """Adam's (AdamW's when `decoupled`) step over `inputs`: params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs."""
    lr = _learning_rate(lr)
    params, original, exp_avgs, exp_avg_sqs, max_exp_avg_sqs = (_upcast(values) for values in inputs)
    unscaled, grads = _unscale(original, grad_scale, maximize)
    new = [[], [], [], []]
    for i, (param, grad, exp_avg, exp_avg_sq) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)):
        count = state_steps[i].astype(jnp.float32)
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
    return _written(
        found_inf,
        (new[0], params, inputs[0]),
        (unscaled if grad_scale is not None else None, original, inputs[1]),
        (new[1], exp_avgs, inputs[2]),
        (new[2], exp_avg_sqs, inputs[3]),
        (new[3] if amsgrad else None, max_exp_avg_sqs, inputs[4]),
    )


_ADAM_WRITES = ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")


def _adam_lowering(decoupled: bool):
    """One body for `_fused_adam` and `_fused_adamw`: they differ only in how weight decay applies."""

    def lowering(
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
        inputs = (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
        options = (lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)
        return _adam(inputs, state_steps, *options, decoupled=decoupled)

    return lowering


lower(aten._fused_adam.default, aten._fused_adam.tensor_lr, writes=_ADAM_WRITES, scalars=("lr",))(
    _adam_lowering(decoupled=False)
)
lower(aten._fused_adamw.default, aten._fused_adamw.tensor_lr, writes=_ADAM_WRITES, scalars=("lr",))(
    _adam_lowering(decoupled=True)
)


@lower(
    aten._fused_sgd.default,
    aten._fused_sgd.tensor_lr,
    writes=("self", "grads", "momentum_buffer_list"),
    scalars=("lr",),
)
def _fused_sgd(
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
    lr = _learning_rate(lr)
    params, original, buffers = _upcast(self), _upcast(grads), _upcast(momentum_buffer_list)
    unscaled, grads_used = _unscale(original, grad_scale, maximize)
    new = [[], []]
    for i, (param, grad) in enumerate(zip(params, grads_used, strict=True)):
        if weight_decay != 0:
            grad = grad + weight_decay * param
        if momentum != 0:
            buffer = grad if is_first_step else momentum * buffers[i] + (1 - dampening) * grad
            new[1].append(buffer)
            grad = grad + momentum * buffer if nesterov else buffer
        new[0].append(param - lr * grad)
    return _written(
        found_inf,
        (new[0], params, self),
        (unscaled if grad_scale is not None else None, original, grads),
        (new[1] if momentum != 0 else None, buffers, momentum_buffer_list),
    )


def _adagrad(self, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale, found_inf):
    lr = _learning_rate(lr)
    params, original, sums = _upcast(self), _upcast(grads), _upcast(state_sums)
    unscaled, grads_used = _unscale(original, grad_scale, maximize)
    new = [[], []]
    for param, grad, state_sum, count in zip(params, grads_used, sums, state_steps, strict=True):
        if weight_decay != 0:
            grad = grad + weight_decay * param
        state_sum = state_sum + grad * grad
        clr = lr / (1 + (count.astype(jnp.float32) - 1) * lr_decay)
        new[0].append(param - clr * grad / (jnp.sqrt(state_sum) + eps))
        new[1].append(state_sum)
    return _written(
        found_inf,
        (new[0], params, self),
        (unscaled if grad_scale is not None else None, original, grads),
        (new[1], sums, state_sums),
    )


@lower(aten._fused_adagrad.default, writes=("self", "grads", "state_sums", "state_steps"), scalars=("lr",))
def _fused_adagrad(
    self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None, found_inf=None
):
    """(This overload's schema lets it write `state_steps` too: the step counts stay as the optimizer left them.)"""
    options = (lr, lr_decay, weight_decay, eps, maximize, grad_scale, found_inf)
    return *_adagrad(self, grads, state_sums, state_steps, *options), [None] * len(state_steps)


@lower(aten._fused_adagrad.tensor_lr, writes=("self", "grads", "state_sums"), scalars=("lr",))
def _fused_adagrad_tensor_lr(
    self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None, found_inf=None
):
    options = (lr, lr_decay, weight_decay, eps, maximize, grad_scale, found_inf)
    return _adagrad(self, grads, state_sums, state_steps, *options)


@lower(aten._amp_foreach_non_finite_check_and_unscale.default, writes=("self", "found_inf"))
def _amp_foreach_non_finite_check_and_unscale(self, found_inf, inv_scale):
    nonfinite = [~jnp.all(jnp.isfinite(g)) for g in self]
    found = jnp.any(jnp.stack(nonfinite)) if self else False
    grads = [(upcast(g) * inv_scale).astype(g.dtype) for g in self]
    return grads, jnp.where(found, jnp.ones_like(found_inf), found_inf)


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
