"""What only a real TPU shows: Mosaic-compiled Pallas kernels, HBM accounting and out-of-memory, the profiler's TPU
planes, fp32 precision levels that differ, float64's emulation. Skipped on other platforms (their counterparts run
everywhere: interpreted kernels in tests/kernels, host-memory accounting in runtime/test_memory.py, the synthetic
device plane in profiler/test_profiler_xspace.py, exact fp32 in runtime/test_platform_numerics.py); run on the chip
by `bench/device_run.sh correctness`."""

import json

import jax
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from torch_tpu.kernels import examples
from torch_tpu.kernels.prebuilt import sdpa
from torch_tpu.runtime import platform
from torch_tpu.testing.compare import tolerance

pytestmark = [
    pytest.mark.tpu_device,
    pytest.mark.skipif(platform.platform() != "tpu", reason="needs a TPU (bench/device_run.sh correctness)"),
]
GIB = 1 << 30


def test_a_pallas_kernel_is_compiled_by_mosaic_and_matches_cpu():
    x, y = torch.randn(64, 512), torch.randn(64, 512)
    lowered = jax.jit(examples._add_call).lower(jax.numpy.asarray(x.numpy()), jax.numpy.asarray(y.numpy()))
    assert "tpu_custom_call" in lowered.as_text()  # Mosaic's kernel, not the interpreter's plain HLO
    added = examples.tiled_add_op(x.to("tpu"), y.to("tpu")).cpu()
    torch.testing.assert_close(added, x + y, rtol=0, atol=0)  # one float32 add per element: exact
    soft = examples.row_softmax_op(x.to("tpu")).cpu()
    # exp and the division run on the TPU's vector unit: a few float32 ulps, as in test_platform_numerics
    torch.testing.assert_close(soft, x.softmax(-1), rtol=1e-5, atol=1e-6)


def _attention(device, dtype, is_causal, kv_heads):
    """One SDPA call forward and backward on `device` in `dtype`: its output and the gradients of q, k and v."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 256, 64)
    k, v = torch.randn(2, kv_heads, 256, 64), torch.randn(2, kv_heads, 256, 64)
    leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=is_causal, enable_gqa=kv_heads != 4)
    out.backward(torch.ones_like(out))
    return [t.detach().cpu().double() for t in (out, *(leaf.grad for leaf in leaves))]


def _worst_errors(results, exact):
    return [float((got - want).abs().max()) for got, want in zip(results, exact, strict=True)]


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_sdpa_takes_splash_for_bfloat16_and_for_float32_at_default_precision(is_causal, kv_heads):
    """Output and gradients no further from float64 than twice CPU PyTorch's bfloat16 SDPA is, tensor by tensor.
    A fixed elementwise tolerance does not hold for attention's gradients: each is a sum over 256 keys of products
    rounded to bfloat16 (splash rounds the probabilities and dS to bfloat16 for its matmuls, as CPU's kernel does),
    so its error grows with the sum's terms, not with its value (one element in 1.3e5 missed bf16's elementwise
    rtol 1.6e-2 / atol 1e-2 on a v5e: 0.0136 off at 0.161)."""
    chosen = sdpa.choices["splash"]
    exact = _attention("cpu", torch.float64, is_causal, kv_heads)
    cpu = _worst_errors(_attention("cpu", torch.bfloat16, is_causal, kv_heads), exact)
    bfloat16 = _attention("tpu", torch.bfloat16, is_causal, kv_heads)
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):  # float32 products as one bf16 pass: as bf16 inputs
        float32 = _attention("tpu", torch.float32, is_causal, kv_heads)
    for results in (bfloat16, float32):
        ours = _worst_errors(results, exact)
        assert all(o <= 2 * c for o, c in zip(ours, cpu, strict=True)), f"worst errors {ours}, CPU bfloat16's {cpu}"
    assert sdpa.choices["splash"] == chosen + 2


def test_float32_sdpa_at_pytorchs_default_precision_keeps_full_float32_off_splash():
    chosen = dict(sdpa.choices)
    results = _attention("tpu", torch.float32, True, 2)
    assert sdpa.choices["splash"] == chosen.get("splash", 0) and sdpa.choices["xla"] == chosen.get("xla", 0) + 1
    rtol, atol = tolerance(torch.float32)  # HIGHEST products; softmax's exp at the chip's float32 accuracy
    for got, want in zip(results, _attention("cpu", torch.float64, True, 2), strict=True):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def test_ragged_dot_on_the_chip_matches_a_float64_grouped_matmul():
    lhs, rhs = torch.randn(96, 64), torch.randn(3, 64, 32)
    sizes = torch.tensor([32, 0, 64])
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        got = torch.tpu.ops.ragged_dot(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu")).cpu()
    groups = [(0, 32), (32, 0), (32, 64)]  # (start, size) of each group's rows
    want = torch.cat([lhs[s : s + n].double() @ rhs[g].double() for g, (s, n) in enumerate(groups)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)  # HIGHEST: full fp32 products


def test_precision_levels_differ_on_the_chip_as_documented():
    """DEFAULT is one bf16 pass (relative error ~2^-9 per product), HIGHEST full fp32 (~1e-7)."""
    a, b = torch.randn(256, 1024), torch.randn(1024, 256)
    exact = a.double() @ b.double()
    scale = exact.abs().max()
    errors = {}
    for level in torch.tpu.Precision:
        with torch.tpu.precision(level):
            errors[level] = float(((a.to("tpu") @ b.to("tpu")).cpu().double() - exact).abs().max() / scale)
    assert errors[torch.tpu.Precision.HIGHEST] < 1e-6
    assert errors[torch.tpu.Precision.DEFAULT] > 1e-4  # truly bf16: the level reaches the chip
    assert errors[torch.tpu.Precision.HIGH] < errors[torch.tpu.Precision.DEFAULT]


def test_memory_stats_track_hbm_and_out_of_memory_leaves_the_device_usable():
    total = torch.tpu.get_device_properties().total_memory
    assert 8 * GIB < total < 64 * GIB  # a TPU's HBM, not the host's memory
    free, reported_total = torch.tpu.mem_get_info()
    assert reported_total == total and 0 < free <= total
    before = torch.tpu.memory_allocated()
    block = torch.empty(256 << 20, dtype=torch.uint8, device="tpu").fill_(1)
    assert torch.tpu.memory_allocated() - before >= 256 << 20
    pjrt = jax.devices()[0].memory_stats()
    assert pjrt["bytes_in_use"] >= 256 << 20  # the chip's own figure agrees that the block lives in HBM
    del block
    assert torch.tpu.memory_allocated() == before
    with pytest.raises(torch.OutOfMemoryError):
        torch.ones(int(total // 4) * 2, dtype=torch.float32, device="tpu").sum().item()  # twice the HBM
    x = torch.randn(128, 128)
    torch.testing.assert_close((x.to("tpu") * 2).cpu(), x * 2)  # the device goes on


def test_a_device_capture_has_the_tpu_planes_in_key_averages_and_the_chrome_trace(tmp_path):
    x = torch.randn(512, 512).to("tpu")
    (x @ x).sum().item()  # compiled before the capture
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.TPU]) as prof:
        for _ in range(3):
            y = (x @ x).relu()
        y.sum().item()
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].self_device_time_total > 0
    out = tmp_path / "trace.json"
    prof.export_chrome_trace(str(out))
    events = json.loads(out.read_text())["traceEvents"]
    device_ops = [e for e in events if e.get("cat") == "xla_op"]
    assert device_ops, "no XLA op events from the TPU planes"
    assert any("dot" in e["name"] or "convolution" in e["name"] or "fusion" in e["name"] for e in device_ops)


def test_float64_runs_emulated_and_refuses_what_the_chip_cannot_compute():
    x = torch.rand(1000, dtype=torch.float64) + 0.5
    on_chip = x.to("tpu")
    assert on_chip.dtype == torch.float64
    # XLA's TPU backend emulates float64 (a pair of float32s): far beyond float32's 6e-8, measured ~1e-14
    torch.testing.assert_close(((on_chip * 3 + 1) / 7).cpu(), (x * 3 + 1) / 7, rtol=1e-12, atol=0)
    torch.testing.assert_close(on_chip.sum().cpu(), x.sum(), rtol=1e-12, atol=0)
    # XLA's own pow, atan2 and prod are float32-accurate there: torch_tpu/ops/emulated.py writes them out
    torch.testing.assert_close((on_chip**2.7).cpu(), x**2.7, rtol=1e-12, atol=0)
    # the emulation's arctan errs absolutely, not relatively, near 0: 1.8e-15 at a result of 1.4e-3 (a v5e)
    torch.testing.assert_close(torch.atan2(on_chip - 1, on_chip).cpu(), torch.atan2(x - 1, x), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(on_chip[:100].prod().cpu(), x[:100].prod(), rtol=1e-12, atol=0)
    # 0-d tensors too: the numerics bench's 0-d samples of pow and atan2 came out float32-accurate on a v5e
    base, exponent = x[3], x[7] * 2 - 1
    on_chip_power = base.to("tpu") ** exponent.to("tpu")
    torch.testing.assert_close(on_chip_power.cpu(), base**exponent, rtol=1e-12, atol=0)
    on_chip_angle = torch.atan2(exponent.to("tpu"), base.to("tpu"))
    torch.testing.assert_close(on_chip_angle.cpu(), torch.atan2(exponent, base), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["exp", "log", "atan", "tanh", "sqrt", "pow", "atan2", "mul"])
def test_float64_scalars_are_as_accurate_as_vectors(name):
    """The fifth device run's numerics bench measured 0-d float64 exp, log, atan, pow and atan2 at float32 accuracy
    (4.7e-8; 1-d: 5e-15): a silent float32 result. Each op one 0-d value at a time against CPU, at the bound the
    1-d tests above hold (the emulation's arctan errs absolutely near 0)."""
    x = torch.rand(16, dtype=torch.float64) * 4 + 0.5
    y = torch.rand(16, dtype=torch.float64) * 2 - 1
    calls = {"exp": lambda a, b: torch.exp(b), "log": lambda a, b: torch.log(a), "atan": lambda a, b: torch.atan(b)}
    calls |= {"tanh": lambda a, b: torch.tanh(b), "sqrt": lambda a, b: torch.sqrt(a)}
    calls |= {"pow": torch.pow, "atan2": torch.atan2, "mul": torch.mul}
    fn = calls[name]
    got = torch.stack([fn(a.to("tpu"), b.to("tpu")).cpu() for a, b in zip(x, y, strict=True)])
    torch.testing.assert_close(got, fn(x, y), rtol=1e-12, atol=1e-14)


def test_float64_norms_and_logsumexp_are_float64_accurate():
    """Reductions whose last step is a power or a log of one element (XLA's float64 `pow` on the TPU is
    float32-accurate, and so is its `log` of one element): written out and lifted (torch_tpu/ops/emulated.py)."""
    x, y = torch.rand(40, 30, dtype=torch.float64) + 0.1, torch.rand(20, 30, dtype=torch.float64)
    on_chip = x.to("tpu")
    for ord in (3, 0.5):
        torch.testing.assert_close(
            torch.linalg.vector_norm(on_chip, ord).cpu(), torch.linalg.vector_norm(x, ord), rtol=1e-12, atol=0
        )
    torch.testing.assert_close(torch.cdist(on_chip, y.to("tpu"), 3).cpu(), torch.cdist(x, y, 3), rtol=1e-12, atol=0)
    torch.testing.assert_close(
        torch.logsumexp(on_chip * 20, (0, 1)).cpu(), torch.logsumexp(x * 20, (0, 1)), rtol=1e-12, atol=0
    )
