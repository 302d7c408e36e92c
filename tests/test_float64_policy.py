"""float64 on a TPU (torch_tpu/runtime/float64.py): the ops measured there at float32 accuracy and complex128 are
refused naming the op, XLA's own refusals are named, everything else runs; other platforms are untouched. The
platform is made to answer "tpu" here, so the policy's decisions are checked on any machine; on a TPU
tests/test_on_chip.py checks the values."""

import types

import jax
import numpy as np
import pytest
import torch

from torch_tpu.runtime import float64, platform, storage

F64, C128, F32 = np.dtype(np.float64), np.dtype(np.complex128), np.dtype(np.float32)


@pytest.fixture
def on_a_tpu(monkeypatch):
    monkeypatch.setattr(float64, "platform", types.SimpleNamespace(platform=lambda: "tpu"))


def test_the_measured_ops_and_complex128_are_refused_naming_the_op(on_a_tpu):
    for op in ("aten::pow.Tensor_Scalar", "aten.atan2.default", "aten::prod.dim_int"):
        with pytest.raises(NotImplementedError, match=r"'.*(pow|atan2|prod).*' is not supported in float64 on the TPU"):
            float64.check(op, [F64, None])
    with pytest.raises(NotImplementedError, match="'aten::add.Tensor' on complex128"):
        float64.check("aten::add.Tensor", [C128])
    float64.check("aten::add.Tensor", [F64, F64])  # measured float64-accurate: runs
    float64.check("aten::pow.Tensor_Scalar", [F32, F32])  # float32 is not the policy's business


def test_xlas_refusals_are_named_and_other_errors_pass_through(on_a_tpu):
    error = jax.errors.JaxRuntimeError("UNIMPLEMENTED: LU decomposition of F64 is not implemented on TPU")
    refused = float64.refusal("aten::linalg_inv_ex", error, [F64])
    assert isinstance(refused, NotImplementedError) and "'aten::linalg_inv_ex'" in str(refused)
    assert float64.refusal("aten::linalg_inv_ex", error, [F32]) is None
    assert float64.refusal("aten::add", jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: x"), [F64]) is None


def test_other_platforms_compute_every_float64_op():
    float64.check("aten::pow.Tensor_Scalar", [F64])
    float64.check("aten::add.Tensor", [C128])
    x = torch.rand(7, dtype=torch.float64) + 0.5
    torch.testing.assert_close(torch.pow(x.to("tpu"), 2.5).cpu(), torch.pow(x, 2.5), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_eager_refuses_before_running(on_a_tpu, mode):
    modes = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}
    x = (torch.rand(3, 11, dtype=torch.float64) + 0.5).to("tpu")  # a shape no other test compiles
    with torch.tpu.set_eager_mode(modes[mode]):
        with pytest.raises(NotImplementedError, match="'aten.pow.Tensor_Scalar' is not supported in float64"):
            (x**2.5).cpu()
        torch.testing.assert_close((x * 3).cpu(), x.cpu() * 3, rtol=0, atol=0)


def test_compiled_graphs_refuse_before_compiling(on_a_tpu):
    x = (torch.rand(5, 13, dtype=torch.float64) + 0.5).to("tpu")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="'aten.prod.default' is not supported in float64 on the TPU"):
        torch.compile(lambda t: t.prod(), backend="tpu")(x)
    torch._dynamo.reset()


def test_complex128_is_refused_on_transfer_to_a_tpu(monkeypatch):
    monkeypatch.setattr(storage, "platform", types.SimpleNamespace(platform=lambda: "tpu", device=platform.device))
    with pytest.raises(TypeError, match="complex128 is not supported on the TPU"):
        torch.ones(2, dtype=torch.complex128).to("tpu")


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_64_bit_scalar_in_a_32_bit_op_is_not_the_policys_business(on_a_tpu, mode):
    """A Python scalar reaches an op as a 0-d 64-bit value (autograd's `exponent - 1` in pow's backward, a CPU
    scalar tensor); the op computes at its tensors' width, so nothing is refused (on the chip, Llama's and the
    double-backward tests' float32 steps were)."""
    modes = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}
    z = torch.randn(3, 5, dtype=torch.complex64)
    x = torch.rand(3, 5, requires_grad=True)
    with torch.tpu.set_eager_mode(modes[mode]):
        scaled = z.to("tpu") * torch.tensor(1 + 2j, dtype=torch.complex128)  # a complex128 0-d CPU operand
        torch.testing.assert_close(scaled.cpu(), z * (1 + 2j))
        on_tpu = x.detach().to("tpu").requires_grad_()
        (grad,) = torch.autograd.grad(on_tpu.pow(3).sum(), on_tpu, create_graph=True)
        (second,) = torch.autograd.grad(grad.sum(), on_tpu)
    torch.testing.assert_close(second.cpu(), 6 * x.detach())
