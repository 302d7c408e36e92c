"""tokamax's attention for `F.scaled_dot_product_attention` (`kernels/prebuilt/tokamax_attention.py`, the optional
extra `torch_tpu[kernels]`): the routing with tokamax present and absent (a pure function; its presence faked), and,
where tokamax is installed, the forced path (tokamax's XLA implementation on CPU) against the math path, eager and
compiled, with gradients."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import meta
from torch_tpu.kernels.prebuilt import sdpa, tokamax_attention
from torch_tpu.testing.compare import assert_close


@pytest.mark.parametrize("installed", [True, False])
def test_routing_takes_tokamax_for_what_splash_and_cudnn_do_not_only_where_installed(monkeypatch, installed):
    monkeypatch.setattr(tokamax_attention, "available", lambda: installed)
    tokamax = "tokamax" if installed else "xla"
    q = kv = meta(2, 8, 1024, 64)
    bf16 = meta(2, 8, 1024, 64, dtype=torch.bfloat16)
    mask = meta(1024, 1024, dtype=torch.bool)
    assert sdpa.choose("tpu", q, kv, kv, attn_mask=mask) == "xla"  # float32 at "highest": no TPU kernel (one bf16 pass)
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        _tokamax_routes(q, kv, bf16, mask, tokamax, installed)


def _tokamax_routes(q, kv, bf16, mask, tokamax, installed):
    assert sdpa.choose("tpu", q, kv, kv) == "splash"  # splash first on TPU, cuDNN first on GPU
    assert sdpa.choose("gpu", bf16, bf16, bf16) == "cudnn"
    assert sdpa.choose("tpu", q, kv, kv, attn_mask=mask) == tokamax
    assert sdpa.choose("gpu", q, kv, kv) == ("tokamax" if installed else "pallas_gpu")  # float32: not cuDNN's
    assert sdpa.choose("tpu", meta(2, 8, 1000, 64), meta(2, 8, 1000, 64), meta(2, 8, 1000, 64)) == tokamax
    assert sdpa.choose("tpu", q, kv, kv, attn_mask=meta(2, 1, 1024, 1024, dtype=torch.bool)) == tokamax
    assert sdpa.choose("tpu", q, kv, kv, attn_mask=meta(1024, 1024)) == "xla"  # an additive float mask
    assert sdpa.choose("tpu", q, kv, kv, attn_mask=meta(3, 1, 1024, 1024, dtype=torch.bool)) == "xla"  # no broadcast
    assert sdpa.choose("gpu", q, kv, kv, dropout_p=0.1) == "xla"
    assert sdpa.choose("gpu", meta(1, 4, 100, 64), meta(1, 4, 300, 64), meta(1, 4, 300, 64), is_causal=True) == "xla"
    assert sdpa.choose("gpu", q, meta(2, 2, 1024, 64), meta(2, 2, 1024, 64)) == "xla"  # GQA needs enable_gqa
    assert sdpa.choose("gpu", q, meta(2, 2, 1024, 64), meta(2, 2, 1024, 64), enable_gqa=True) == tokamax
    assert sdpa.choose("cpu", q, kv, kv, attn_mask=mask) == "xla"
    with sdpa.force("tokamax"):
        assert sdpa.choose("cpu", q, kv, kv, attn_mask=mask) == tokamax


def _math(q, k, v, mask, is_causal):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "boolean mask"])
def test_forced_tokamax_equals_the_math_path_eager_and_compiled_with_gradients(masked):
    pytest.importorskip("tokamax")
    torch._dynamo.reset()
    sdpa.choices.clear()
    q, k, v = torch.randn(2, 4, 24, 16), torch.randn(2, 2, 24, 16), torch.randn(2, 2, 24, 16)
    mask = (torch.rand(2, 1, 24, 24) > 0.3) | torch.eye(24, dtype=torch.bool) if masked else None
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    expected = _math(*leaves, mask, not masked)
    seed = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, seed)
    with sdpa.force("tokamax"):
        for run in (_math, torch.compile(_math, backend="tpu", fullgraph=True)):
            tpu = [t.to("tpu").requires_grad_() for t in (q, k, v)]
            out = run(*tpu, None if mask is None else mask.to("tpu"), not masked)
            assert_close(out, expected.float(), rtol=2e-5, atol=2e-5)
            grads = torch.autograd.grad(out, tpu, seed.float().to("tpu"))
            assert_close(grads, [g.float() for g in expected_grads], rtol=2e-5, atol=2e-5)
    assert sdpa.choices["tokamax"] >= 2 and not sdpa.choices["xla"]
