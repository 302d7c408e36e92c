"""Attention kernels: `torch.tpu.ops.splash_sdpa` (JAX's splash kernel, interpreted on the CPU platform, at 128-long
sequences so that each case takes seconds) against a float64 CPU PyTorch reference (causal, scaled, GQA, segment
ids; forward and gradients, eager and compiled with no graph break), and the routing of
`F.scaled_dot_product_attention` on tpu: which path a call takes per platform (the platform faked), the kernel path
forced on CPU equal to the math path, and the XLA path by default here."""

import types

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import meta
from torch_tpu.kernels.prebuilt import sdpa
from torch_tpu.runtime import platform
from torch_tpu.testing.compare import TOLERANCES, assert_close

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

# float32 kernel vs float64 reference: splash's blockwise softmax rounds per block. On a TPU the kernel's float32
# products are one bf16 pass (Mosaic's dot precision, whatever the precision in force; measured 3e-3 to 6e-3 from the
# reference on a v5e, bench/device_run.sh correctness): the chip is held to bfloat16's tolerance.
BF16_RTOL, BF16_ATOL = TOLERANCES[torch.bfloat16]
TOL = dict(rtol=2e-5, atol=2e-5) if platform.platform() != "tpu" else dict(rtol=BF16_RTOL, atol=BF16_ATOL)


def _reference(query, key, value, segment_ids=None, kv_segment_ids=None, is_causal=True, scale=None):
    """Splash's result by PyTorch's math SDPA in float64, key/value heads repeated, the causal/segment mask built."""
    groups = query.shape[1] // key.shape[1]
    q, k, v = query.double(), key.double().repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1)
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
    mask = (mask.tril() if is_causal else mask)[None, None]
    if segment_ids is not None:
        kv = segment_ids if kv_segment_ids is None else kv_segment_ids
        mask = mask & (segment_ids[:, None, :, None] == kv[:, None, None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).to(query.dtype)


def _qkv(batch=1, heads=2, kv_heads=2, length=128, kv_length=128, dim=16, dtype=torch.float32):
    return (
        torch.randn(batch, heads, length, dim, dtype=dtype),
        torch.randn(batch, kv_heads, kv_length, dim, dtype=dtype),
        torch.randn(batch, kv_heads, kv_length, dim, dtype=dtype),
    )


def _check(fn, reference, tensors, extra=()):
    """`fn(*tensors, *extra)` on tpu, eager and compiled (fullgraph): output and gradients equal `reference`'s."""
    torch._dynamo.reset()
    leaves = [t.detach().requires_grad_() for t in tensors]
    expected = reference(*leaves, *extra)
    seed = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, seed)
    for run in (fn, torch.compile(fn, backend="tpu", fullgraph=True)):
        tpu = [t.detach().to("tpu").requires_grad_() for t in tensors]
        out = run(*tpu, *[e.to("tpu") if isinstance(e, torch.Tensor) else e for e in extra])
        assert_close(out, expected.detach(), **TOL)
        assert_close(torch.autograd.grad(out, tpu, seed.to("tpu")), expected_grads, **TOL)


def test_splash_causal_matches_the_float64_reference_eager_and_compiled():
    _check(torch.tpu.ops.splash_sdpa, _reference, _qkv())


@pytest.mark.slow  # GQA is in the fast forced-path case; this adds non-causal and a scale
def test_splash_grouped_query_attention_non_causal_with_a_scale():
    def splash(q, k, v):
        return torch.tpu.ops.splash_sdpa(q, k, v, is_causal=False, scale=0.3)

    _check(splash, lambda q, k, v: _reference(q, k, v, is_causal=False, scale=0.3), _qkv(heads=4, kv_heads=2))


def test_splash_segment_ids_keep_packed_sequences_apart():
    segments = torch.tensor([[0] * 50 + [1] * 78, [0] * 128], dtype=torch.int32)
    _check(torch.tpu.ops.splash_sdpa, _reference, _qkv(batch=2), (segments,))


@pytest.mark.slow
def test_splash_cross_attention_with_query_and_key_segment_ids_and_the_cpu_kernel():
    q, k, v = _qkv(length=128, kv_length=256)
    segments = torch.tensor([[0] * 64 + [1] * 64])
    kv_segments = torch.tensor([[0] * 100 + [1] * 156])

    def splash(q, k, v, ids, kv_ids):
        return torch.tpu.ops.splash_sdpa(q, k, v, ids, kv_ids, is_causal=False)

    def reference(q, k, v, ids, kv_ids):
        return _reference(q, k, v, ids, kv_ids, is_causal=False)

    _check(splash, reference, (q, k, v), (segments, kv_segments))
    assert_close(splash(q, k, v, segments, kv_segments), reference(q, k, v, segments, kv_segments), **TOL)


def test_splash_bfloat16_forward():
    q, k, v = _qkv(dtype=torch.bfloat16)
    out = torch.tpu.ops.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    assert out.dtype == torch.bfloat16
    assert_close(out, _reference(q, k, v))


@pytest.mark.parametrize(
    "change, error, words",
    [
        (dict(query=torch.randn(1, 2, 128, 16, dtype=torch.float64)), TypeError, "query has dtype torch.float64"),
        (dict(query=torch.randn(2, 128, 16)), ValueError, "query must be 4-D"),
        (dict(key=torch.randn(1, 3, 128, 16), value=torch.randn(1, 3, 128, 16)), ValueError, "multiple of key's 3"),
        (dict(value=torch.randn(1, 2, 128, 8)), ValueError, "value shape"),
        (dict(query=torch.randn(1, 2, 100, 16)), ValueError, "query's sequence length 100 must be a multiple of 128"),
        (dict(segment_ids=torch.zeros(1, 64, dtype=torch.int32)), ValueError, "segment_ids must have shape (1, 128)"),
        (dict(segment_ids=torch.zeros(1, 128)), TypeError, "segment_ids has dtype torch.float32"),
        (dict(kv_segment_ids=torch.zeros(1, 128, dtype=torch.int32)), ValueError, "kv_segment_ids needs segment_ids"),
    ],
    ids=["float64", "3-D query", "heads", "value shape", "length", "segment shape", "segment dtype", "kv alone"],
)
def test_splash_rejects_bad_arguments_naming_them(change, error, words):
    q, k, v = _qkv()
    arguments = {**dict(query=q, key=k, value=v, segment_ids=None, kv_segment_ids=None), **change}
    tpu = {name: t if t is None else t.to("tpu") for name, t in arguments.items()}
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        torch.tpu.ops.splash_sdpa(**tpu)


def test_routing_by_platform_shapes_dtype_mask_and_dropout():
    q, kv = meta(2, 8, 1024, 64, dtype=torch.bfloat16), meta(2, 8, 1024, 64, dtype=torch.bfloat16)
    gqa_kv = meta(2, 2, 1024, 64, dtype=torch.bfloat16)
    assert sdpa.choose("tpu", q, kv, kv) == "splash"
    assert sdpa.choose("tpu", q, gqa_kv, gqa_kv, enable_gqa=True) == "splash"
    q32 = meta(2, 8, 1024, 64)
    assert sdpa.choose("tpu", q32, q32, q32) == "xla"  # float32 at PyTorch's default "highest": not splash's bf16 pass
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        assert sdpa.choose("tpu", q32, q32, q32) == "splash"
    assert sdpa.choose("tpu", q, gqa_kv, gqa_kv) == "xla"  # PyTorch's SDPA refuses unequal heads without enable_gqa
    assert sdpa.choose("tpu", q, kv, kv, attn_mask=meta(1024, 1024, dtype=torch.bool)) == "xla"
    assert sdpa.choose("tpu", q, kv, kv, dropout_p=0.1) == "xla"
    assert sdpa.choose("tpu", meta(2, 8, 1000, 64), kv, kv) == "xla"  # not in 128 blocks
    half = meta(2, 8, 1024, 64, dtype=torch.float16)
    assert sdpa.choose("tpu", half, half, half) == "xla"
    assert sdpa.choose("tpu", meta(8, 1024, 64), meta(8, 1024, 64), meta(8, 1024, 64)) == "xla"
    assert sdpa.choose("cpu", q, kv, kv) == "xla"
    assert (
        sdpa.choose("gpu", q32, q32, q32) == "pallas_gpu"
    )  # float32: not cuDNN's (tests/kernels/test_pallas_gpu_sdpa.py)
    with sdpa.force("splash"):
        assert sdpa.choose("cpu", q, kv, kv) == "splash"
        assert sdpa.choose("cpu", q, kv, kv, dropout_p=0.1) == "xla"  # forced only where splash serves the call
    with sdpa.force("xla"):
        assert sdpa.choose("tpu", q, kv, kv) == "xla"
    with pytest.raises(ValueError, match="SDPA kernel must be one of"):
        sdpa.force("flash").__enter__()


def _math(q, k, v, is_causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)


@pytest.mark.parametrize(
    "is_causal, kv_heads",
    [(True, 2), pytest.param(False, 1, marks=pytest.mark.slow)],
    ids=["causal GQA", "multi-query"],
)
def test_sdpa_kernel_path_forced_equals_the_math_path_eager_and_compiled(is_causal, kv_heads):
    sdpa.choices.clear()
    with sdpa.force("splash"):
        _check(
            _math,
            lambda q, k, v, c: _math(q.double(), k.double(), v.double(), c).float(),
            _qkv(4, 2, kv_heads),
            (is_causal,),
        )
    assert sdpa.choices["splash"] >= 2 and not sdpa.choices["xla"]  # eager, and the compiled graph's trace


def test_sdpa_on_a_tpu_platform_runs_splash_where_it_serves(monkeypatch):
    sdpa.choices.clear()
    monkeypatch.setattr(sdpa, "platform", types.SimpleNamespace(platform=lambda: "tpu"))
    q, k, v = (t.to("tpu") for t in _qkv())
    F.scaled_dot_product_attention(q, k, v, is_causal=True)  # float32 at PyTorch's default "highest": XLA
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(128, 128, dtype=torch.bool, device="tpu"))
        with torch.inference_mode():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    F.scaled_dot_product_attention(*(t.bfloat16() for t in (q, k, v)), is_causal=True)  # bf16: at any precision
    assert sdpa.choices == {"splash": 3, "xla": 2}
    assert_close(out, _reference(*(t.cpu() for t in (q, k, v))), **TOL)


def test_sdpa_on_the_cpu_platform_takes_the_xla_path_with_masks_and_gradients():
    sdpa.choices.clear()
    q, k, v = _qkv(length=24, kv_length=24)
    mask = torch.rand(24, 24) > 0.3
    mask.fill_diagonal_(True)

    def attention(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    _check(attention, lambda q, k, v, m: attention(q.double(), k.double(), v.double(), m).float(), (q, k, v), (mask,))
    assert sdpa.choices["xla"] >= 2 and not sdpa.choices["splash"]
