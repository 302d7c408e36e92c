"""`torch_tpu::_cudnn_sdpa`: cuDNN's fused attention through `jax.nn.dot_product_attention(implementation="cudnn")`,
the kernel `F.scaled_dot_product_attention` takes on the GPU platform where cuDNN serves the call (`sdpa.choose`).

Layout is `F.scaled_dot_product_attention`'s, (B, H, T, D) query and (B, KV, S, D) key and value (KV dividing H),
transposed to JAX's (B, T, N, D) around the kernel. cuDNN's flash attention takes bfloat16 and float16, head dims
that are multiples of 8 up to 128 (256 on Hopper; 128 is what routing assumes), no dropout; here no mask other than
causal (with equal query and key lengths: PyTorch's causal mask is aligned to the top left). The backward op is
`jax.vjp` of the same call (cuDNN's backward kernel). Only a CUDA build of jaxlib with cuDNN runs it; the CPU kernel
is PyTorch's math SDPA (the reference), and the tests export its CUDA lowering from a CPU host.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

from torch_tpu.kernels.prebuilt import library

DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128
CUSTOM_CALLS = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")  # the kernels' targets in the HLO


def serves(query, key, value, attn_mask, dropout_p, enable_gqa, is_causal) -> bool:
    """Whether cuDNN's fused attention computes this SDPA call (its shapes, dtypes, mask and dropout)."""
    if attn_mask is not None or dropout_p != 0.0:
        return False
    if not library.attention_layout(query, key, value, DTYPES, enable_gqa):
        return False
    _, _, q_len, dim = query.shape
    if dim % 8 or dim > MAX_HEAD_DIM:
        return False
    return not is_causal or q_len == key.shape[2]


def attention(query, key, value, is_causal=False, scale=None):
    """cuDNN's attention over (B, H, T, D) arrays."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))
    out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=bool(is_causal), implementation="cudnn")
    return jnp.swapaxes(out, 1, 2)


def backward(grad, query, key, value, is_causal, scale):
    """The gradients of `attention` (cuDNN's backward kernel), for the query, key and value."""
    _, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, is_causal, scale), query, key, value)
    return vjp(grad.astype(query.dtype))


def reference(query, key, value, is_causal=False, scale=None):
    """What the kernel computes, in PyTorch (the CPU kernel)."""
    gqa = query.shape[1] != key.shape[1]
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale, enable_gqa=gqa)


def install() -> None:
    """Define `torch_tpu::_cudnn_sdpa` and its backward op, with autograd between them."""
    library.define_attention("_cudnn_sdpa", attention, backward, reference)
