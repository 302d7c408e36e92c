"""JAX's Pallas (Triton) flash attention for `F.scaled_dot_product_attention` on the GPU platform
(`kernels/prebuilt/pallas_gpu.py`): the routing as a pure function of (platform, shapes, dtypes, mask, dropout), the
kernel interpreted here (forced on the CPU platform) against a float64 math SDPA, forward and gradients, eager and
compiled with no graph break, SDPA on a faked GPU platform tracing to the op, and the op's GPU lowering exported
from this CPU host (the Triton custom calls in it, forward and backward). No GPU runs here."""

import types

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from jax import export
from torch.fx.experimental.proxy_tensor import make_fx

from tests.helpers import meta
from torch_tpu.kernels.prebuilt import pallas_gpu, sdpa
from torch_tpu.testing.compare import assert_close
from torch_tpu.testing.export import exported

# float32 kernel vs a float64 reference: the kernel's online softmax rounds per 128-key block; the backward
# recomputes the probabilities per 32-row tile and accumulates dq/dk/dv in float32.
TOL = dict(rtol=2e-5, atol=2e-5)


def test_routing_on_gpu_takes_what_cudnn_does_not_where_the_tiles_fit():
    single = meta(2, 8, 1024, 64)
    assert sdpa.choose("gpu", single, single, single) == "pallas_gpu"
    assert sdpa.choose("gpu", single, single, single, is_causal=True) == "pallas_gpu"
    half = meta(2, 8, 1024, 64, dtype=torch.bfloat16)
    assert sdpa.choose("gpu", half, half, half) == "cudnn"  # cuDNN first where it serves
    odd = meta(2, 8, 1024, 60, dtype=torch.bfloat16)
    assert sdpa.choose("gpu", odd, odd, odd) == "pallas_gpu"  # a head dim cuDNN refuses
    for length, path in (
        (64, "pallas_gpu"),
        (32, "pallas_gpu"),
        (20, "pallas_gpu"),
        (384, "pallas_gpu"),
        (48, "xla"),
        (200, "xla"),
    ):  # tiles: 128 forward, 32 backward, clipped to the length
        t = meta(1, 4, length, 64)
        assert sdpa.choose("gpu", t, t, t) == path, length
    for dim, path in ((8, "xla"), (16, "pallas_gpu"), (100, "pallas_gpu"), (256, "pallas_gpu"), (512, "xla")):
        t = meta(1, 4, 128, dim)
        assert sdpa.choose("gpu", t, t, t) == path, dim
    gqa = meta(2, 2, 1024, 64)
    assert sdpa.choose("gpu", single, gqa, gqa, enable_gqa=True) == "xla"  # the kernel takes equal heads
    assert sdpa.choose("gpu", single, single, single, attn_mask=meta(1024, 1024, dtype=torch.bool)) == "xla"
    assert sdpa.choose("gpu", single, single, single, dropout_p=0.1) == "xla"
    short, long = meta(1, 4, 128, 64), meta(1, 4, 256, 64)
    assert sdpa.choose("gpu", short, long, long) == "pallas_gpu"
    assert sdpa.choose("gpu", short, long, long, is_causal=True) == "xla"  # causal only aligned (equal lengths)
    assert sdpa.choose("cpu", single, single, single) == "xla"
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):  # float32 on the TPU's kernels: one bf16 pass
        assert sdpa.choose("tpu", single, single, single) == "splash"
    with sdpa.force("pallas_gpu"):
        assert sdpa.choose("cpu", single, single, single) == "pallas_gpu"
        assert sdpa.choose("cpu", single, gqa, gqa, enable_gqa=True) == "xla"  # forced only where it serves


def _math(q, k, v, is_causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_forced_kernel_equals_the_float64_math_path_eager_and_compiled(is_causal):
    torch._dynamo.reset()
    sdpa.choices.clear()
    tensors = [torch.randn(1, 2, 64, 32) for _ in range(3)]
    leaves = [t.double().requires_grad_() for t in tensors]
    expected = _math(*leaves, is_causal)
    seed = torch.randn(expected.shape, dtype=torch.float32)
    expected_grads = [g.float() for g in torch.autograd.grad(expected, leaves, seed.double())]
    with sdpa.force("pallas_gpu"):
        for run in (_math, torch.compile(_math, backend="tpu", fullgraph=True)):
            tpu = [t.to("tpu").requires_grad_() for t in tensors]
            out = run(*tpu, is_causal)
            assert_close(out, expected.float().detach(), **TOL)
            assert_close(torch.autograd.grad(out, tpu, seed.to("tpu")), expected_grads, **TOL)
    assert sdpa.choices["pallas_gpu"] >= 2 and not sdpa.choices["xla"]  # eager, and the compiled graph's trace


def test_sdpa_on_a_gpu_platform_traces_to_the_pallas_op_forward_and_backward(monkeypatch):
    monkeypatch.setattr(sdpa, "platform", types.SimpleNamespace(platform=lambda: "gpu"))
    sdpa.choices.clear()

    def step(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(out.sum(), (q, k, v))

    q, k, v = (torch.randn(1, 4, 128, 64, device="tpu").requires_grad_() for _ in range(3))
    graph = make_fx(step, tracing_mode="fake")(q, k, v)
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert {"torch_tpu._pallas_gpu_sdpa.default", "torch_tpu._pallas_gpu_sdpa_backward.default"} <= targets
    assert sdpa.choices == {"pallas_gpu": 1}


def test_exported_gpu_lowering_holds_the_triton_kernels_forward_and_backward(monkeypatch):
    monkeypatch.setattr(pallas_gpu, "platform", types.SimpleNamespace(platform=lambda: "gpu"))  # not interpreted
    q = jax.ShapeDtypeStruct((2, 4, 128, 64), jnp.float32)  # (B, H, T, D), as SDPA gives it
    checks = [export.DisabledSafetyCheck.custom_call(pallas_gpu.CUSTOM_CALL)]

    def forward(q, k, v):
        return pallas_gpu.attention(q, k, v, True, 0.125)

    def backward(q, k, v):
        return pallas_gpu.backward(forward(q, k, v), q, k, v, True, 0.125)

    text = exported(forward, (q, q, q), "cuda", checks).mlir_module()
    assert text.count(f"stablehlo.custom_call @{pallas_gpu.CUSTOM_CALL}(") == 1
    assert "tensor<2x128x4x64xf32>" in text  # the kernel's (B, T, H, D) layout inside
    grads = exported(backward, (q, q, q), "cuda", checks)
    assert grads.mlir_module().count(f"stablehlo.custom_call @{pallas_gpu.CUSTOM_CALL}(") >= 3  # fwd, dq, dkv
    assert [a.shape for a in grads.out_avals] == [(2, 4, 128, 64)] * 3


def test_the_ops_cpu_kernel_and_gradients_are_the_math_sdpa():
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.ops.torch_tpu._pallas_gpu_sdpa(*leaves, is_causal=True, scale=0.3)
    expected_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*expected_leaves, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, expected)
    seed = torch.randn_like(out)
    torch.testing.assert_close(
        torch.autograd.grad(out, leaves, seed), torch.autograd.grad(expected, expected_leaves, seed)
    )
