"""Lowerings: the masked softmax and the inference fast paths of nn.MultiheadAttention and
nn.TransformerEncoderLayer (taken in eval mode without autograd), with PyTorch's mask semantics.

A mask marks what is masked out: any nonzero (True, or -inf in the float masks the modules build) removes a
key; a row with every key removed is NaN, as on CPU. `mask_type` says how a 2-d mask of 4-d scores broadcasts:
0 is an attention mask (L, S), 1 a key padding mask (B, S); otherwise the mask broadcasts as it is.
"""

import jax
import jax.numpy as jnp

from torch_tpu import precision
from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, lower


def _broadcast_mask(mask, scores, mask_type):
    mask = mask != 0
    if mask.ndim == 2 and scores.ndim == 4:
        if mask_type == 1:
            return mask[:, None, None, :]
        if mask_type == 0:
            return mask[None, None]
    return mask


def _masked_softmax_of(scores, mask, axis):
    return jax.nn.softmax(jnp.where(mask, -jnp.inf, upcast(scores)), axis=axis)


@lower(aten._masked_softmax.default)
def _masked_softmax(self, mask, dim=None, mask_type=None):
    axis = self.ndim - 1 if dim is None else dim
    return _masked_softmax_of(self, _broadcast_mask(mask, self, mask_type), axis).astype(self.dtype)


@lower(aten._masked_softmax_backward.default)
def _masked_softmax_backward(grad_output, output, mask, dim=None):
    axis = output.ndim - 1 if dim is None else dim
    grad, out = upcast(grad_output), upcast(output)
    grad_input = out * (grad - jnp.sum(grad * out, axis=axis, keepdims=True))
    return jnp.where(jnp.broadcast_to(mask != 0, out.shape), 0, grad_input).astype(grad_output.dtype)


def _mm(a, b):
    """a @ b at the precision in force (a TPU's DEFAULT would make these float32 products one bf16 pass)."""
    return jnp.matmul(a, b, precision=precision.for_dot())


def _heads(x, num_head):
    """(B, T, D) -> (B, num_head, T, D / num_head)."""
    batch, length, dim = x.shape
    return x.reshape(batch, length, num_head, dim // num_head).transpose(0, 2, 1, 3)


def _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """The attention output (B, T, D) and the per-head weights (B, num_head, T, S), in float32 for half types."""
    weights = jnp.split(upcast(qkv_weight), 3)
    biases = jnp.split(upcast(qkv_bias), 3)
    q, k, v = (
        _heads(_mm(upcast(x), w.T) + b, num_head) for x, w, b in zip((query, key, value), weights, biases, strict=True)
    )
    scores = _mm(q / jnp.sqrt(jnp.float32(embed_dim // num_head)), k.transpose(0, 1, 3, 2))
    if mask is None:
        probabilities = jax.nn.softmax(scores, axis=-1)
    else:
        probabilities = _masked_softmax_of(scores, _broadcast_mask(mask, scores, mask_type), -1)
    context = _mm(probabilities, v).transpose(0, 2, 1, 3).reshape(query.shape[:2] + (embed_dim,))
    return _mm(context, upcast(proj_weight).T) + upcast(proj_bias), probabilities


@lower(aten._native_multi_head_attention.default)
def _native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    out, weights = _attention(
        query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type
    )
    if not need_weights:
        return out.astype(query.dtype), None
    if average_attn_weights:
        weights = jnp.mean(weights, axis=1)
    return out.astype(query.dtype), weights.astype(query.dtype)


def _layer_norm(x, weight, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * upcast(weight) + upcast(bias)


@lower(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    x = upcast(src)
    attended = _layer_norm(x, norm_weight_1, norm_bias_1, eps) if norm_first else x
    attended, _ = _attention(
        attended,
        attended,
        attended,
        embed_dim,
        num_heads,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        mask_type,
    )
    x = x + attended
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    hidden = _layer_norm(x, norm_weight_2, norm_bias_2, eps) if norm_first else x
    hidden = _mm(hidden, upcast(ffn_weight_1).T) + upcast(ffn_bias_1)
    hidden = jax.nn.gelu(hidden, approximate=False) if use_gelu else jax.nn.relu(hidden)
    x = x + _mm(hidden, upcast(ffn_weight_2).T) + upcast(ffn_bias_2)
    if not norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    return x.astype(src.dtype)
