"""Lowerings: the fused LSTM and GRU cells that `lstm` / `gru` / `lstm_cell` / `gru_cell` use on an accelerator.

The forward ops take the two gate projections (`input @ w_ih.T`, `hx @ w_hh.T`) and return the new state plus a
`workspace` that only their backward ops read; its layout is CUDA's (LSTM: the activated gates; GRU: r, z, n, hx
and the hidden candidate projection), computed in float32 for half types and returned in the input dtype.
"""

import jax
import jax.numpy as jnp

from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, lower


def _cast(dtype, *arrays):
    return tuple(None if a is None else a.astype(dtype) for a in arrays)


def _gates(gates, bias):
    gates = upcast(gates)
    return gates if bias is None else gates + upcast(bias)


@lower(aten._thnn_fused_lstm_cell.default)
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _gates(input_gates, input_bias) + _gates(hidden_gates, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * upcast(cx) + i * g
    hy = o * jnp.tanh(cy)
    return _cast(input_gates.dtype, hy, cy, jnp.concatenate([i, f, g, o], axis=1))


@lower(aten._thnn_fused_lstm_cell_backward_impl.default)
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(upcast(workspace), 4, axis=1)
    cx, cy = upcast(cx), upcast(cy)
    tanh_cy = jnp.tanh(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else upcast(grad_hy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + upcast(grad_cy)
    grad_i, grad_f = grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f)
    grad_g, grad_o = grad_c * i * (1 - g * g), grad_hy * tanh_cy * o * (1 - o)
    grad_gates = jnp.concatenate([grad_i, grad_f, grad_g, grad_o], axis=1)
    grad_bias = jnp.sum(grad_gates, axis=0) if has_bias else None
    return _cast(workspace.dtype, grad_gates, grad_c * f, grad_bias)


@lower(aten._thnn_fused_gru_cell.default)
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    input_r, input_z, input_n = jnp.split(_gates(input_gates, input_bias), 3, axis=1)
    hidden_r, hidden_z, hidden_n = jnp.split(_gates(hidden_gates, hidden_bias), 3, axis=1)
    hx = upcast(hx)
    r = jax.nn.sigmoid(input_r + hidden_r)
    z = jax.nn.sigmoid(input_z + hidden_z)
    n = jnp.tanh(input_n + r * hidden_n)
    return _cast(input_gates.dtype, n + z * (hx - n), jnp.concatenate([r, z, n, hx, hidden_n], axis=1))


@lower(aten._thnn_fused_gru_cell_backward.default)
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hidden_n = jnp.split(upcast(workspace), 5, axis=1)
    grad_hy = upcast(grad_hy)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hidden_n * r * (1 - r)
    grad_input_gates = jnp.concatenate([grad_r, grad_z, grad_n], axis=1)
    grad_hidden_gates = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=1)
    grad_biases = (jnp.sum(grad_input_gates, axis=0), jnp.sum(grad_hidden_gates, axis=0)) if has_bias else (None, None)
    return _cast(workspace.dtype, grad_input_gates, grad_hidden_gates, grad_hy * z, *grad_biases)
