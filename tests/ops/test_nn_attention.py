"""Masked softmax and the inference fast paths of nn.MultiheadAttention / nn.TransformerEncoderLayer
(`_native_multi_head_attention`, `_transformer_encoder_layer_fwd`, taken in eval mode without autograd) on
`tpu` against CPU PyTorch, which takes the same fast paths."""

import copy

import pytest
import torch
from torch import nn

import torch_tpu.precision
from torch_tpu.testing.compare import assert_close, check_op, to_tpu

FLOAT, BF16 = torch.float32, torch.bfloat16
aten = torch.ops.aten


def masks(kind):
    if kind == 0:
        return torch.rand(5, 5) > 0.6
    if kind == 1:
        return torch.rand(2, 5) > 0.6
    return torch.rand(2, 3, 5, 5) > 0.6


@pytest.mark.parametrize("dtype", [FLOAT, BF16])
@pytest.mark.parametrize("mask_type", [0, 1, 2, None])
def test_masked_softmax(mask_type, dtype):
    mask = masks(mask_type)
    mask[..., 0, :] = True  # a fully masked row (NaN, as on CPU) where the mask has rows
    check_op(lambda x, m: aten._masked_softmax(x, m, 3, mask_type), torch.randn(2, 3, 5, 5).to(dtype), mask)


@pytest.mark.parametrize("dim", [1, 3])
def test_masked_softmax_grad(dim):
    mask = masks(2)
    mask[..., 0] = False  # keeps every row partly unmasked
    mask[:, 0] = False
    check_op(lambda x: aten._masked_softmax(x, mask.to(x.device), dim), torch.randn(2, 3, 5, 5).requires_grad_(),
             grad=True)  # fmt: skip


def compare_modules(module, *inputs, **kwargs):
    """The module in eval mode without autograd (PyTorch's fast path) on CPU and on tpu."""
    module.eval()
    theirs = copy.deepcopy(module)
    ours = module.to("tpu")
    with torch.no_grad():
        expected = theirs(*inputs, **kwargs)
        moved = {id(x): x.to("tpu") for x in inputs}  # self-attention: the same tensor as query, key and value
        actual = ours(*[moved[id(x)] for x in inputs], **to_tpu(kwargs))
    assert_close(actual, expected)


def ran(op):
    """Whether `op` has run on tpu in this process (i.e. the fast path was taken)."""
    return op in {entry["name"] for entry in torch.tpu._get_cache_stats()["per_entry_stats"]}


def padding():
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True
    return mask


MHA_MASKS = {
    "none": {},
    "padding": {"key_padding_mask": padding()},
    "causal": {"attn_mask": nn.Transformer.generate_square_subsequent_mask(5).isinf()},
    "both": {"key_padding_mask": padding(), "attn_mask": nn.Transformer.generate_square_subsequent_mask(5).isinf()},
}


@pytest.mark.parametrize("weights", ["averaged", "per_head", "none"])
@pytest.mark.parametrize("mask", sorted(MHA_MASKS))
def test_multihead_attention_fast_path(mask, weights):
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16)
    compare_modules(attention, x, x, x, need_weights=weights != "none", average_attn_weights=weights == "averaged",
                    **MHA_MASKS[mask])  # fmt: skip
    assert ran("aten._native_multi_head_attention.default")


ENCODER_LAYERS = [  # (mask, activation, norm_first, dtype)
    ("none", "relu", False, FLOAT),
    ("padding", "gelu", False, FLOAT),
    ("causal", "relu", True, FLOAT),
    ("both", "gelu", True, FLOAT),
    ("padding", "relu", True, BF16),
    ("both", "gelu", False, BF16),
]


@pytest.mark.parametrize("mask, activation, norm_first, dtype", ENCODER_LAYERS)
def test_transformer_encoder_layer_fast_path(mask, activation, norm_first, dtype):
    layer = nn.TransformerEncoderLayer(16, 4, 32, activation=activation, norm_first=norm_first, batch_first=True)
    kwargs = {"none": {}, "padding": {"src_key_padding_mask": padding()},
              "causal": {"src_mask": nn.Transformer.generate_square_subsequent_mask(5)},
              "both": {"src_key_padding_mask": padding().float() * -1e9,
                       "src_mask": nn.Transformer.generate_square_subsequent_mask(5)}}[mask]  # fmt: skip
    compare_modules(layer.to(dtype), torch.randn(2, 5, 16).to(dtype), **kwargs)
    assert ran("aten._transformer_encoder_layer_fwd.default")


def test_transformer_encoder_fast_path():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16), enable_nested_tensor=False)
    compare_modules(encoder, torch.randn(2, 5, 16), src_key_padding_mask=padding())


@pytest.mark.xfail(strict=True, raises=NotImplementedError,
                   reason="nested tensors are not supported on tpu: with enable_nested_tensor=True (the default) "
                   "and a padding mask, nn.TransformerEncoder's inference fast path builds one")  # fmt: skip
def test_transformer_encoder_nested_fast_path():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    compare_modules(nn.TransformerEncoder(layer, 2), torch.randn(2, 5, 16), src_key_padding_mask=padding())


@pytest.mark.parametrize("level", list(torch.tpu.Precision))
def test_the_fast_paths_multiply_at_the_precision_in_force(level):
    """Every product of the fast paths carries the precision in force (on a TPU a product without one would be
    a single bf16 pass whatever the user asked: a silent loss the CPU platform cannot show in values)."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.ops.nn import attention

    x, w, b = jnp.ones((2, 8, 16)), jnp.ones((48, 16)), jnp.ones(48)
    pw, pb = jnp.ones((16, 16)), jnp.ones(16)
    with torch.tpu.precision(level):
        jaxpr = jax.make_jaxpr(lambda t: attention._attention(t, t, t, 16, 4, w, b, pw, pb, None, None))(x)
        expected = (torch_tpu.precision.for_dot(),) * 2
    products = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(products) == 6 and all(e.params["precision"] == expected for e in products)
