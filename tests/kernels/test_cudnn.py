"""cuDNN attention for `F.scaled_dot_product_attention` on the GPU platform (`kernels/prebuilt/cudnn.py`): the
routing as a pure function of (platform, shapes, dtypes, mask, dropout), the op's CUDA lowering exported from this
CPU host (the cuDNN custom calls in it, forward and backward), SDPA on a faked GPU platform tracing to the op, and
the op's CPU kernel and autograd against PyTorch's math SDPA. No GPU runs here: the kernel itself is not executed."""

import functools
import types

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from jax import export
from jax._src.cudnn import fused_attention_stablehlo
from torch.fx.experimental.proxy_tensor import make_fx

from tests.helpers import meta
from torch_tpu.kernels.prebuilt import cudnn, sdpa

_CHECKS = [export.DisabledSafetyCheck.custom_call(target) for target in cudnn.CUSTOM_CALLS]


_meta = functools.partial(meta, dtype=torch.bfloat16)  # cuDNN's dtype unless told


def test_routing_on_gpu_by_dtype_head_dim_heads_mask_dropout_and_causal_lengths():
    q = kv = _meta(2, 8, 1024, 64)
    gqa = _meta(2, 2, 1024, 64)
    assert sdpa.choose("gpu", q, kv, kv) == "cudnn"
    assert sdpa.choose("gpu", q, kv, kv, is_causal=True) == "cudnn"
    half = _meta(2, 8, 1024, 64, dtype=torch.float16)
    assert sdpa.choose("gpu", half, half, half) == "cudnn"
    single = _meta(2, 8, 1024, 64, dtype=torch.float32)
    # cuDNN's flash attention is 16-bit only: float32 goes to Pallas (tests/kernels/test_pallas_gpu_sdpa.py)
    assert sdpa.choose("gpu", single, single, single) == "pallas_gpu"
    assert sdpa.choose("gpu", q, half, half) == "xla"  # mixed dtypes
    assert sdpa.choose("gpu", q, kv, kv, attn_mask=_meta(1024, 1024, dtype=torch.bool)) == "xla"
    assert sdpa.choose("gpu", q, kv, kv, dropout_p=0.1) == "xla"
    assert sdpa.choose("gpu", q, gqa, gqa, enable_gqa=True) == "cudnn"
    assert sdpa.choose("gpu", q, gqa, gqa) == "xla"  # PyTorch refuses unequal heads without enable_gqa
    dims = ((8, "cudnn"), (72, "cudnn"), (128, "cudnn"), (60, "pallas_gpu"), (256, "pallas_gpu"), (512, "xla"))
    for dim, path in dims:
        t = _meta(1, 4, 256, dim)
        assert sdpa.choose("gpu", t, t, t) == path, dim
    short, long = _meta(1, 4, 100, 64), _meta(1, 4, 300, 64)
    assert sdpa.choose("gpu", short, long, long) == "cudnn"  # any lengths
    assert sdpa.choose("gpu", short, long, long, is_causal=True) == "xla"  # causal only aligned (equal lengths)
    three = _meta(8, 1024, 64)
    assert sdpa.choose("gpu", three, three, three) == "xla"
    assert sdpa.choose("tpu", q, kv, kv) == "splash"  # TPU keeps splash, CPU the XLA path
    assert sdpa.choose("cpu", q, kv, kv) == "xla"
    with sdpa.force("cudnn"):
        assert sdpa.choose("cpu", q, kv, kv) == "cudnn"
        assert sdpa.choose("tpu", q, kv, kv) == "cudnn"
        assert sdpa.choose("cpu", single, single, single) == "xla"  # forced only where cuDNN serves the call
    with sdpa.force("xla"):
        assert sdpa.choose("gpu", q, kv, kv) == "xla"


@pytest.fixture
def cudnn_present(monkeypatch):
    """JAX's cuDNN attention asks the CUDA plugin for cuDNN's version before lowering; this host has none, and
    exporting needs only the version (9.10) to pick the lowering's features."""
    monkeypatch.setattr(
        fused_attention_stablehlo, "cuda_versions", types.SimpleNamespace(cudnn_get_version=lambda: 91000)
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_exported_cuda_lowering_holds_the_cudnn_kernels_forward_and_backward(cudnn_present, is_causal):
    q = jax.ShapeDtypeStruct((2, 8, 128, 64), jnp.bfloat16)  # (B, H, T, D), as SDPA gives it
    kv = jax.ShapeDtypeStruct((2, 2, 128, 64), jnp.bfloat16)

    def forward(q, k, v):
        return cudnn.attention(q, k, v, is_causal, 0.125)

    def backward(q, k, v):
        return cudnn.backward(forward(q, k, v), q, k, v, is_causal, 0.125)

    text = export.export(jax.jit(forward), platforms=["cuda"], disabled_checks=_CHECKS)(q, kv, kv).mlir_module()
    assert "stablehlo.custom_call @__cudnn$fmhaSoftmax(" in text
    assert ("CAUSAL" in text) == is_causal  # the mask is the kernel's, not a materialised (T, S) array
    assert "tensor<2x128x8x64xbf16>" in text  # JAX's (B, T, N, D) layout inside
    grads = export.export(jax.jit(backward), platforms=["cuda"], disabled_checks=_CHECKS)(q, kv, kv)
    assert "stablehlo.custom_call @__cudnn$fmhaSoftmaxBackward(" in grads.mlir_module()
    assert [a.shape for a in grads.out_avals] == [(2, 8, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64)]


def test_sdpa_on_a_gpu_platform_traces_to_the_cudnn_op_forward_and_backward(monkeypatch):
    monkeypatch.setattr(sdpa, "platform", types.SimpleNamespace(platform=lambda: "gpu"))
    sdpa.choices.clear()

    def step(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(out.float().sum(), (q, k, v))

    q, k, v = (torch.randn(1, 4, 128, 64, dtype=torch.bfloat16, device="tpu").requires_grad_() for _ in range(3))
    graph = make_fx(step, tracing_mode="fake")(q, k, v)
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert {"torch_tpu._cudnn_sdpa.default", "torch_tpu._cudnn_sdpa_backward.default"} <= targets
    assert sdpa.choices == {"cudnn": 1}


def test_the_ops_cpu_kernel_and_gradients_are_the_math_sdpa():
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.ops.torch_tpu._cudnn_sdpa(*leaves, is_causal=True, scale=0.3)
    expected_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*expected_leaves, is_causal=True, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, expected)
    seed = torch.randn_like(out)
    torch.testing.assert_close(
        torch.autograd.grad(out, leaves, seed), torch.autograd.grad(expected, expected_leaves, seed)
    )
