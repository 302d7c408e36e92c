"""Lowerings: loss functions and their backward ops. `reduction` is ATen's enum: 0 none, 1 mean, 2 sum."""

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.nn.common import MEAN, SUM, loss_scale, reduce_loss, upcast
from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import dtypes

_TARGET_DTYPES = (np.dtype(np.int64), np.dtype(np.uint8))


def _nll_terms(self, target, weight, ignore_index):
    """The class dim (1, or 0 unbatched), the targets made safe to index with, and per-target weights (0 where
    the target is ignored). Targets are int64 or uint8 (as CPU's kernels take; the 2-d ops' meta kernels refuse
    uint8 as CPU does)."""
    if target.dtype not in _TARGET_DTYPES:
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {dtypes.aten_name(target.dtype)}")
    target = target.astype(np.int64)
    class_axis = 1 if self.ndim > 1 else 0
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    weights = jnp.ones((), jnp.float32) if weight is None else upcast(weight)[safe]
    return class_axis, safe, jnp.where(valid, weights, 0)


@lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    class_axis, safe, weights = _nll_terms(self, target, weight, ignore_index)
    # The target's log-probability picked first, then upcast: upcasting the whole input first made the chip
    # convert all of a GPT's (8192, 32768) bfloat16 logits (2.6 ms a step) to read one element a row.
    picked = upcast(jnp.take_along_axis(self, jnp.expand_dims(safe, class_axis), axis=class_axis))
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


def _multi_margin(self, target, p, margin, weight, reduction):
    """Per sample, the hinge `max(0, margin - x[y] + x[j])^p` summed over the classes j != y (weighted by w[y])
    and divided by the class count. `z > 0` (not `maximum`) keeps CPU's zero gradient at the hinge."""
    x = jnp.atleast_2d(upcast(self))
    y = jnp.atleast_1d(target)[:, None]
    z = margin - jnp.take_along_axis(x, y, axis=1) + x
    z = jnp.where(z > 0, z, 0)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * upcast(weight)[y]
    z = jnp.where(jnp.arange(x.shape[1]) != y, z, 0)
    if reduction == MEAN:
        return jnp.mean(z)
    if reduction == SUM:
        return jnp.sum(z) / x.shape[1]
    return jnp.mean(z, axis=1).reshape(target.shape)


@lower(aten.multi_margin_loss.default, static=("p",))
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=MEAN):
    return _multi_margin(self, target, p, margin, weight, reduction)


@lower(aten.multi_margin_loss_backward.default, static=("p",))
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=MEAN):
    """Cast to the input's dtype here: the op has no meta kernel to set it."""
    _, pullback = jax.vjp(lambda x: _multi_margin(x, target, p, margin, weight, reduction), upcast(self))
    return pullback(upcast(grad_output))[0].astype(self.dtype)


def _multilabel_targets(target, classes):
    """Each row's target labels (those before its first -1) as a (rows, classes) mask over label positions, and
    the labels made safe to index with."""
    position = jnp.arange(classes)
    end = jnp.min(jnp.where(target == -1, position, classes), axis=-1, keepdims=True)
    listed = position < end
    return listed, jnp.where(listed, target, 0)


def _multilabel_margin(self, target, is_target, reduction):
    """Per sample, `max(0, 1 - (x[t] - x[j]))` summed over its target labels t and non-target classes j, over the
    class count."""
    x = jnp.atleast_2d(upcast(self))
    classes = x.shape[1]
    listed, labels = _multilabel_targets(jnp.atleast_2d(target), classes)
    picked = jnp.take_along_axis(x, labels, axis=1)
    z = 1 - picked[:, :, None] + x[:, None, :]  # (rows, label position, class)
    keep = listed[:, :, None] & (jnp.atleast_2d(is_target)[:, None, :] == 0)
    loss = jnp.sum(jnp.where(keep & (z > 0), z, 0), axis=(1, 2)) / classes
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss.reshape(self.shape[:-1])


def _is_target(self, target):
    x = jnp.atleast_2d(self)
    listed, labels = _multilabel_targets(jnp.atleast_2d(target), x.shape[1])
    hits = jax.nn.one_hot(labels, x.shape[1], dtype=bool) & listed[:, :, None]
    return jnp.any(hits, axis=1).astype(self.dtype).reshape(self.shape)


@lower(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    is_target = _is_target(self, target)
    return _multilabel_margin(self, target, is_target, reduction), is_target


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    """Cast to the input's dtype here: the op has no meta kernel to set it."""
    _, pullback = jax.vjp(lambda x: _multilabel_margin(x, target, is_target, reduction), upcast(self))
    return pullback(upcast(grad_output))[0].astype(self.dtype)


def _safe_logsumexp(values, axis):
    """logsumexp that is -inf (with zero gradient, not NaN) where every value is -inf: unreachable CTC states."""
    peak = jax.lax.stop_gradient(jnp.max(values, axis=axis, keepdims=True))
    peak = jnp.where(jnp.isfinite(peak), peak, 0)
    total = jnp.sum(jnp.exp(values - peak), axis=axis)
    positive = total > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, total, 1)), -jnp.inf) + jnp.squeeze(peak, axis)


def _ctc_labels(targets, target_lengths, blank):
    """Each sequence's targets interleaved with blanks, (N, 2 * S + 1), and where a state may skip the one before
    it (its label differs from the label two states back). 1-d `targets` holds the sequences concatenated."""
    batch, longest = len(target_lengths), max(target_lengths, default=0)
    if targets.ndim == 1:
        starts = np.cumsum([0, *target_lengths[:-1]])
        index = np.minimum(starts[:, None] + np.arange(longest), max(targets.shape[0] - 1, 0))
        targets = targets[index] if targets.shape[0] else jnp.zeros((batch, longest), targets.dtype)
    labels = jnp.full((batch, 2 * longest + 1), blank, targets.dtype).at[:, 1::2].set(targets[:, :longest])
    skip = jnp.zeros(labels.shape, bool).at[:, 2:].set(labels[:, 2:] != labels[:, :-2])
    return labels, skip


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank):
    """CTC's forward (alpha) recursion in log space, all sequences at once: per sequence the negative log
    likelihood, and log_alpha (N, T, 2 * S + 1), frozen from each sequence's last input step on."""
    lp = upcast(log_probs)
    labels, skip = _ctc_labels(targets, target_lengths, blank)
    emissions = jnp.take_along_axis(lp, jnp.broadcast_to(labels[None], lp.shape[:2] + labels.shape[1:]), axis=2)
    state = np.arange(labels.shape[1])
    lengths = np.asarray(target_lengths)[:, None]
    first = jnp.where((state == 0) | ((state == 1) & (lengths > 0)), emissions[0], -jnp.inf)
    inputs = np.asarray(input_lengths)

    def step(alpha, t):
        before = jnp.pad(alpha, ((0, 0), (1, 0)), constant_values=-jnp.inf)[:, :-1]
        skipped = jnp.where(skip, jnp.pad(alpha, ((0, 0), (2, 0)), constant_values=-jnp.inf)[:, :-2], -jnp.inf)
        new = _safe_logsumexp(jnp.stack([alpha, before, skipped]), 0) + emissions[t]
        alpha = jnp.where((t < inputs)[:, None], new, alpha)
        return alpha, alpha

    last, rest = jax.lax.scan(step, first, jnp.arange(1, lp.shape[0]))
    log_alpha = jnp.concatenate([first[None], rest]).swapaxes(0, 1)
    ends = jnp.take_along_axis(last, np.stack([2 * lengths[:, 0], 2 * lengths[:, 0] - 1], 1).clip(0), axis=1)
    ends = jnp.where(np.stack([np.ones(len(lengths), bool), lengths[:, 0] > 0], 1), ends, -jnp.inf)
    nll = -_safe_logsumexp(ends, 1)
    return jnp.where(inputs == 0, jnp.where(lengths[:, 0] == 0, 0, jnp.inf), nll), log_alpha


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """Per-sequence losses, not reduced (`ctc_loss` reduces, and zeroes infinite losses with `zero_infinity`)."""
    return _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank)


@lower(aten._ctc_loss_backward.default)
def _ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank, zero_infinity=False
):
    """ATen's gradient: `exp(lp) - exp(log(alpha * beta) + nll - lp)` per step before each input's end, times the
    loss's gradient; the `exp(lp)` term assumes log-softmax inputs, as ATen does. The second term is the gradient
    of the forward recursion (reverse-mode through it is the beta recursion). An impossible alignment (infinite
    loss) gives NaN, or 0 with `zero_infinity`."""
    lp, grad = upcast(log_probs), upcast(grad)

    def loss(x):
        return _ctc_forward(x, targets, input_lengths, target_lengths, blank)[0]

    nll, pullback = jax.vjp(loss, lp)
    result = pullback(grad)[0] + jnp.exp(lp) * grad[None, :, None]
    running = (np.arange(lp.shape[0])[:, None] < np.asarray(input_lengths))[:, :, None]
    infinite = jnp.isinf(nll)[None, :, None]
    result = jnp.where(infinite, 0 if zero_infinity else jnp.nan, result)
    return jnp.where(running, result, 0)
