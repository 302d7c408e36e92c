"""The platform numerics that docs/numerics.md documents and this package keeps: subnormal flush to zero on
XLA CPU/TPU, bit-exact transfers of subnormals, and full-fp32 matmuls at every precision level on XLA CPU."""

import pytest
import torch

from torch_tpu.runtime import platform

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

FLUSHING = pytest.mark.skipif(platform.platform() not in ("cpu", "tpu"), reason="XLA CPU and TPUs flush subnormals")
ON_CPU = pytest.mark.skipif(platform.platform() != "cpu", reason="a fact of the XLA CPU platform")


@FLUSHING
@pytest.mark.parametrize(
    ("dtype", "a", "b"), [(torch.float64, 1e-300, 1e-10), (torch.float32, 1e-30, 1e-10), (torch.bfloat16, 1e-30, 1e-10)]
)
def test_subnormal_results_flush_to_zero(dtype, a, b):
    x, y = torch.tensor([a, 1.0], dtype=dtype), torch.tensor([b, 0.5], dtype=dtype)
    cpu = x * y
    assert cpu[0] != 0 and cpu[0].abs() < torch.finfo(dtype).tiny  # CPU PyTorch underflows gradually
    assert torch.equal((x.to("tpu") * y.to("tpu")).cpu(), torch.tensor([0.0, 0.5], dtype=dtype))


@FLUSHING
@pytest.mark.parametrize(("dtype", "value"), [(torch.float64, 1e-310), (torch.float32, 1e-40)])
def test_subnormal_inputs_read_as_zero_but_transfer_bit_exactly(dtype, value):
    host = torch.tensor([value, -value], dtype=dtype)
    on_tpu = host.to("tpu")
    if dtype == torch.float64 and platform.platform() == "tpu":
        # the TPU holds float64 as its emulation does (a pair of float32s): a float64 subnormal, far below float32's
        # range, is zero as soon as it is on the chip (measured on a v5e; docs/numerics.md)
        assert torch.equal(on_tpu.cpu(), torch.zeros(2, dtype=dtype))
    else:
        assert torch.equal(on_tpu.cpu(), host)  # a transfer computes nothing
    assert torch.equal((on_tpu * 1.0).cpu(), torch.zeros(2, dtype=dtype))
    assert (on_tpu > 0).cpu().tolist() == [False, False] and (host > 0).tolist() == [True, False]


@FLUSHING
def test_float16_subnormals_survive():
    x = torch.tensor([6e-8, 3e-5, 1e-4], dtype=torch.float16)
    y = torch.tensor([1.0, 1.0, 1e-3], dtype=torch.float16)
    assert torch.equal((x.to("tpu") * y.to("tpu")).cpu(), x * y)
    assert (x * y)[0] != 0


@ON_CPU
def test_every_precision_level_is_full_fp32_on_the_cpu_platform():
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    results = []
    for level in torch.tpu.Precision:
        with torch.tpu.precision(level):
            results.append((a.to("tpu") @ b.to("tpu")).cpu())
    assert all(torch.equal(r, results[0]) for r in results)
    reference = a.double() @ b.double()
    # full fp32: a K=128 dot's rounding error, far below the 2.4e-3 of one bfloat16 pass (DEFAULT on a TPU)
    assert ((results[0].double() - reference).abs().max() / reference.abs().max()).item() < 1e-5


@ON_CPU
def test_bfloat16_chains_round_per_op_as_cpu_does():
    x, u = (torch.randn(512) * 3).bfloat16(), torch.randn(512).bfloat16()

    def chain(t, v):
        for _ in range(8):
            t = t * v + 0.37
        return t

    compiled = torch.compile(chain, backend="tpu")(x.to("tpu"), u.to("tpu")).cpu()
    assert torch.equal(compiled, chain(x, u))
