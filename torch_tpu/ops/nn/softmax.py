"""Lowerings: softmax and log-softmax, their backward ops, and the masked-row-safe softmax of attention."""

import jax
import jax.numpy as jnp

from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import dtypes


def _axis(x, dim):
    """`dim` as a JAX axis; a 0-d tensor has none (PyTorch accepts dim 0 / -1 for it)."""
    return dim if x.ndim else None


@lower(aten._softmax.default)
def _softmax(self, dim, half_to_float):
    return jax.nn.softmax(upcast(self), axis=_axis(self, dim))


@lower(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
    return jax.nn.log_softmax(upcast(self), axis=_axis(self, dim))


@lower(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
    x = upcast(self) if dtype is None else self.astype(dtypes.to_jax(dtype))
    axis = _axis(x, dim)
    fully_masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
    return jnp.where(fully_masked, 0, jax.nn.softmax(x, axis=axis))


@lower(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    grad, out = upcast(grad_output), upcast(output)
    return out * (grad - jnp.sum(grad * out, axis=_axis(out, dim), keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    grad, out = upcast(grad_output), upcast(output)
    return grad - jnp.exp(out) * jnp.sum(grad, axis=_axis(out, dim), keepdims=True)
