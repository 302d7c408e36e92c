"""`torch_tpu::_pallas_gpu_sdpa`: JAX's Pallas flash attention for GPUs (`jax.experimental.pallas.ops.gpu.attention
.mha`, Triton), the kernel `F.scaled_dot_product_attention` takes on the GPU platform for the calls cuDNN does not
(float32 above all: cuDNN's flash attention is 16-bit only) and tokamax, where installed, does not take either.

Layout is SDPA's (B, H, T, D), transposed to the kernel's (B, T, H, D). The kernel takes equal query and key/value
heads (no GQA), no mask but causal (equal lengths: PyTorch's causal mask is aligned to the top left, as the
kernel's), no dropout, head dims from 16 to 256 (padded to a power of two inside), and sequence lengths its tiles
divide: the forward's 128-row blocks (or the whole length below 128) and the backward's 32-row blocks. The backward
op is `jax.vjp` of the same call (the kernel's own Triton backward). On every platform but GPU the kernel runs in
Pallas interpret mode (plain HLO: what the CPU tests check against the math path); its traces run with x64 off, as
Triton takes no 64-bit index types. The CPU kernel is PyTorch's math SDPA (the reference).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

from torch_tpu.kernels.prebuilt import library
from torch_tpu.runtime import platform

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEAD_DIMS = (16, 256)
FORWARD_BLOCK, BACKWARD_BLOCK = 128, 32  # the kernel's default tiles (BlockSizes.get_default())
CUSTOM_CALL = "__gpu$xla.gpu.triton"  # the kernels' target in the HLO


def _tiles(length: int) -> bool:
    """Whether the kernel's forward and backward tiles (each clipped to the length) divide `length`."""
    return all(length % min(block, length) == 0 for block in (FORWARD_BLOCK, BACKWARD_BLOCK))


def serves(query, key, value, attn_mask, dropout_p, enable_gqa, is_causal) -> bool:
    """Whether the Pallas GPU kernel computes this SDPA call (its shapes, dtypes, mask and dropout)."""
    if attn_mask is not None or dropout_p != 0.0:
        return False
    if not library.attention_layout(query, key, value, DTYPES, enable_gqa) or query.shape[1] != key.shape[1]:
        return False
    q_len, kv_len, dim = query.shape[2], key.shape[2], query.shape[3]
    if not HEAD_DIMS[0] <= dim <= HEAD_DIMS[1] or not (_tiles(q_len) and _tiles(kv_len)):
        return False
    return not is_causal or q_len == kv_len


def attention(query, key, value, is_causal=False, scale=None):
    """The Pallas kernel over (B, H, T, D) arrays (interpreted off GPU)."""
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    interpret = platform.platform() != "gpu"
    with library.kernel_trace():
        q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))
        out = pallas_attention.mha(q, k, v, None, sm_scale=float(scale), causal=bool(is_causal), interpret=interpret)
    return jnp.swapaxes(out, 1, 2)


def backward(grad, query, key, value, is_causal, scale):
    """The gradients of `attention` (the kernel's Triton backward), for the query, key and value."""
    with library.kernel_trace():
        _, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, is_causal, scale), query, key, value)
        return vjp(grad.astype(query.dtype))


def reference(query, key, value, is_causal=False, scale=None):
    """What the kernel computes, in PyTorch (the CPU kernel)."""
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale)


def install() -> None:
    """Define `torch_tpu::_pallas_gpu_sdpa` and its backward op, with autograd between them."""
    library.define_attention("_pallas_gpu_sdpa", attention, backward, reference)
