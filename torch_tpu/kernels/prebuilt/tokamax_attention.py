"""`torch_tpu::_tokamax_sdpa`: tokamax's attention (`tokamax.dot_product_attention`, the optional extra
`torch_tpu[kernels]`) for the `F.scaled_dot_product_attention` calls no other kernel takes (`sdpa.choose`).

Where tokamax is importable: on TPU its Mosaic TPU flash kernel (after splash), on GPU its Mosaic GPU or Triton
flash kernel (after cuDNN), each falling back to tokamax's XLA implementation where the kernel raises
`NotImplementedError` for the call (tokamax's own implementation chain); forced on CPU, its XLA implementation (how the
CPU tests compare it with the math path). Without tokamax the calls take the XLA path. Layout is SDPA's (B, H, T, D),
transposed to tokamax's (B, T, N, D) around the call; a boolean mask broadcastable to (B, H, T, S) is passed as
tokamax's mask; causal only with equal query and key lengths; no dropout. Traced with x64 off (Mosaic rejects 64-bit
types). The backward op is `jax.vjp` of the same call (tokamax's kernels' own VJPs). tokamax's options (absl flags) keep
their defaults: the program's command line is not parsed as absl flags.
"""

from __future__ import annotations

import functools
import importlib.util

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

from torch_tpu.kernels.prebuilt import library
from torch_tpu.runtime import platform

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# tokamax's implementation chain per platform: the first that accepts the call runs.
CHAINS = {"tpu": ("mosaic", "xla"), "gpu": ("mosaic", "triton", "xla"), "cpu": ("xla",)}


@functools.cache
def available() -> bool:
    """Whether tokamax is installed (`pip install torch_tpu[kernels]`)."""
    return importlib.util.find_spec("tokamax") is not None


def serves(query, key, value, attn_mask, dropout_p, enable_gqa, is_causal) -> bool:
    """Whether tokamax's attention computes this SDPA call (tokamax installed, and its shapes, dtypes, mask and
    dropout)."""
    if not available() or dropout_p != 0.0:
        return False
    if not library.attention_layout(query, key, value, DTYPES, enable_gqa):
        return False
    batch, heads, q_len, _ = query.shape
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool or attn_mask.ndim > 4:
            return False
        full = (batch, heads, q_len, key.shape[2])
        if any(m not in (1, f) for m, f in zip(attn_mask.shape[::-1], full[::-1], strict=False)):
            return False
    return not is_causal or q_len == key.shape[2]


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """tokamax's attention over (B, H, T, D) arrays, by the platform's implementation chain."""
    import tokamax
    from absl import flags

    if not flags.FLAGS.is_parsed():  # tokamax's options are absl flags, parsed from sys.argv on first use otherwise:
        flags.FLAGS.mark_as_parsed()  # a PyTorch program's own arguments (absl refuses them), so take the defaults
    where = platform.platform()
    with library.kernel_trace():
        q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))
        mask = None if attn_mask is None else attn_mask.reshape((1,) * (4 - attn_mask.ndim) + attn_mask.shape)
        out = tokamax.dot_product_attention(
            q, k, v, mask=mask, scale=scale, is_causal=bool(is_causal), implementation=CHAINS.get(where, ("xla",))
        )
        return jnp.swapaxes(out, 1, 2).astype(query.dtype)


def backward(grad, query, key, value, attn_mask, is_causal, scale):
    """The gradients of `attention` for the query, key and value."""
    with library.kernel_trace():
        _, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, attn_mask, is_causal, scale), query, key, value)
        return vjp(grad.astype(query.dtype))


def reference(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """What the kernel computes, in PyTorch (the CPU kernel)."""
    gqa = query.shape[1] != key.shape[1]
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=gqa
    )


def _reference_backward(grad, query, key, value, attn_mask, is_causal, scale):
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (query, key, value)]
        return torch.autograd.grad(reference(*inputs, attn_mask, is_causal, scale), inputs, grad)


def _fake(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return query.new_empty(query.shape)


def _fake_backward(grad, query, key, value, attn_mask, is_causal, scale):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup(ctx, inputs, keyword_only_inputs, output) -> None:
    ctx.save_for_backward(*inputs)
    ctx.options = (keyword_only_inputs.get("is_causal", False), keyword_only_inputs.get("scale"))


def install() -> None:
    """Define `torch_tpu::_tokamax_sdpa` and its backward op, with autograd between them (whether or not tokamax is
    installed: routing takes the op only where it is)."""
    forward = library.define(
        "_tokamax_sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, *, bool is_causal=False, "
        "float? scale=None) -> Tensor",
        attention,
        reference,
        _fake,
    )
    grads = library.define(
        "_tokamax_sdpa_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
        "bool is_causal, float? scale) -> (Tensor, Tensor, Tensor)",
        backward,
        _reference_backward,
        _fake_backward,
    )

    def differentiate(ctx, grad):
        query, key, value, attn_mask = ctx.saved_tensors
        return *grads(grad.contiguous(), query, key, value, attn_mask, *ctx.options), None

    library.differentiable(forward, differentiate, _setup)
