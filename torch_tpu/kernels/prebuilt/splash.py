"""`torch.tpu.ops.splash_sdpa`: JAX's splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`)
as a PyTorch op, with causal masking, grouped-query attention (fewer key/value heads than query heads) and segment
ids (packed sequences: a query attends only to keys of its own segment).

Layout is `F.scaled_dot_product_attention`'s: query (B, H, T, D), key and value (B, KV, S, D) with H a multiple of
KV and sequence lengths multiples of 128 (splash's blocks, also interpreted). The kernel is compiled for TPU; on any
other platform it runs in Pallas interpret mode (plain HLO, slow; what the CPU tests exercise). Its traces run with
x64 off (Mosaic rejects 64-bit types, and splash fails even interpreted under x64), and the kernel object is built
at compile time, not inside the trace. The backward op recomputes the forward inside `jax.vjp` of the kernel
(splash's own custom VJP: its dq and dkv kernels).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

from torch_tpu.kernels.prebuilt import library
from torch_tpu.runtime import platform

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SEGMENT_DTYPES = (torch.int32, torch.int64)
_BLOCKS = (512, 256, 128)


def _block(length: int) -> int:
    """The largest of splash's usual block sizes dividing `length` (a multiple of 128, `check`'s rule)."""
    return next(size for size in _BLOCKS if length % size == 0)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_len: int, kv_len: int, causal: bool, interpret: bool):  # a splash kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    block_q, block_kv = _block(q_len), _block(kv_len)
    blocks = splash.BlockSizes(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=block_kv,
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=block_kv,
        block_q_dq=block_q,
        block_kv_dq=block_kv,
    )
    shape = (q_len, kv_len)
    head_mask = masks.CausalMask(shape) if causal else masks.FullMask(shape)
    mask = masks.MultiHeadMask([head_mask] * heads)
    with jax.ensure_compile_time_eval():  # built here, not as part of a trace (whose arity it could keep)
        return splash.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret)


def attention(query, key, value, segment_ids=None, kv_segment_ids=None, is_causal=True, scale=None):
    """The splash kernel over (B, H, T, D) arrays, in float32 for float16 (splash computes float32 and bfloat16)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    dtype = query.dtype
    compute = jnp.float32 if dtype == jnp.float16 else dtype
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    interpret = platform.platform() != "tpu"
    with library.kernel_trace():
        kernel = _kernel(query.shape[1], query.shape[2], key.shape[2], bool(is_causal), interpret)
        q = (query.astype(compute) * jnp.asarray(scale, compute)).astype(compute)
        k, v = key.astype(compute), value.astype(compute)
        if segment_ids is None:
            out = jax.vmap(kernel)(q, k, v)
        else:
            kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
            ids = splash.SegmentIds(q=segment_ids.astype(jnp.int32), kv=kv_ids.astype(jnp.int32))
            out = jax.vmap(lambda q, k, v, ids: kernel(q, k, v, segment_ids=ids))(q, k, v, ids)
    return out.astype(dtype)


def _backward(grad, query, key, value, segment_ids, kv_segment_ids, is_causal, scale):
    def forward(q, k, v):
        return attention(q, k, v, segment_ids, kv_segment_ids, is_causal, scale)

    with library.kernel_trace():
        _, vjp = jax.vjp(forward, query, key, value)
        return vjp(grad.astype(query.dtype))


def check(query, key, value, segment_ids=None, kv_segment_ids=None) -> None:
    """splash_sdpa's argument rules, each error naming the argument."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        library.check_tensor("splash_sdpa", name, tensor, (4,), DTYPES)
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            f"torch.tpu.ops.splash_sdpa: query, key and value must share a dtype, got {query.dtype}, {key.dtype}, "
            f"{value.dtype}"
        )
    batch, heads, q_len, dim = query.shape
    if key.shape[0] != batch or key.shape[3] != dim:
        raise ValueError(
            f"torch.tpu.ops.splash_sdpa: key shape {tuple(key.shape)} does not fit query {tuple(query.shape)}"
        )
    if value.shape != key.shape:
        raise ValueError(
            f"torch.tpu.ops.splash_sdpa: value shape {tuple(value.shape)} must equal key's {tuple(key.shape)}"
        )
    if heads % key.shape[1]:
        raise ValueError(
            f"torch.tpu.ops.splash_sdpa: query's {heads} heads must be a multiple of key's {key.shape[1]} heads"
        )
    kv_len = key.shape[2]
    for name, length in (("query", q_len), ("key", kv_len)):
        if length % 128:  # splash's blocks are multiples of 128 lanes, also interpreted
            raise ValueError(f"torch.tpu.ops.splash_sdpa: {name}'s sequence length {length} must be a multiple of 128")
    for name, ids, length in (("segment_ids", segment_ids, q_len), ("kv_segment_ids", kv_segment_ids, kv_len)):
        if ids is None:
            continue
        library.check_tensor("splash_sdpa", name, ids, (2,), SEGMENT_DTYPES)
        if tuple(ids.shape) != (batch, length):
            raise ValueError(
                f"torch.tpu.ops.splash_sdpa: {name} must have shape {(batch, length)}, got {tuple(ids.shape)}"
            )
    if segment_ids is None and kv_segment_ids is not None:
        raise ValueError("torch.tpu.ops.splash_sdpa: kv_segment_ids needs segment_ids")
    if segment_ids is not None and kv_segment_ids is None and kv_len != q_len:
        raise ValueError("torch.tpu.ops.splash_sdpa: segment_ids alone needs key length == query length")


def _mask(query, key, segment_ids, kv_segment_ids, is_causal):
    """The boolean (B, 1, T, S) mask splash applies, for the reference."""
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device)
    if is_causal:
        mask = mask.tril()
    mask = mask[None, None]
    if segment_ids is not None:
        kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
        mask = mask & (segment_ids[:, None, :, None] == kv_ids[:, None, None, :])
    return mask


def reference(query, key, value, segment_ids=None, kv_segment_ids=None, is_causal=True, scale=None):
    """What splash computes, in PyTorch: the math SDPA with the causal and segment mask, key/value heads repeated."""
    check(query, key, value, segment_ids, kv_segment_ids)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    mask = _mask(query, key, segment_ids, kv_segment_ids, is_causal)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def _reference_backward(grad, query, key, value, segment_ids, kv_segment_ids, is_causal, scale):
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (query, key, value)]
        out = reference(*inputs, segment_ids, kv_segment_ids, is_causal, scale)
        return torch.autograd.grad(out, inputs, grad)


def _fake(query, key, value, segment_ids=None, kv_segment_ids=None, is_causal=True, scale=None):
    check(query, key, value, segment_ids, kv_segment_ids)
    return query.new_empty(query.shape)


def _fake_backward(grad, query, key, value, segment_ids, kv_segment_ids, is_causal, scale):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


_ARGS = "Tensor query, Tensor key, Tensor value, Tensor? segment_ids=None, Tensor? kv_segment_ids=None"
_BACKWARD_ARGS = "Tensor? segment_ids, Tensor? kv_segment_ids, bool is_causal, float? scale"


def _setup(ctx, inputs, keyword_only_inputs, output) -> None:
    ctx.save_for_backward(*inputs)
    ctx.options = (keyword_only_inputs.get("is_causal", True), keyword_only_inputs.get("scale"))


def install() -> None:
    """Define `torch_tpu::splash_sdpa` and its backward op, with autograd between them."""
    forward = library.define(
        f"splash_sdpa({_ARGS}, *, bool is_causal=True, float? scale=None) -> Tensor", attention, reference, _fake
    )
    backward = library.define(
        f"splash_sdpa_backward(Tensor grad, Tensor query, Tensor key, Tensor value, {_BACKWARD_ARGS}) "
        "-> (Tensor, Tensor, Tensor)",
        _backward,
        _reference_backward,
        _fake_backward,
    )

    def differentiate(ctx, grad):
        query, key, value, segment_ids, kv_segment_ids = ctx.saved_tensors
        grads = backward(grad.contiguous(), query, key, value, segment_ids, kv_segment_ids, *ctx.options)
        return *grads, None, None

    library.differentiable(forward, differentiate, _setup)
