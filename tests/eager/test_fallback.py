"""Ops without a lowering: a clear NotImplementedError, or a counted, warned CPU fallback behind a switch."""

import subprocess
import sys

import pytest
import torch

import torch_tpu
from torch_tpu import metrics
from torch_tpu.testing.processes import child_env

# An op we deliberately leave unlowered: special functions are rare in models.
UNLOWERED = torch.ops.aten.special_bessel_j0.default


def test_unlowered_op_names_the_overload():
    from torch_tpu.ops.registry import LOWERINGS

    assert UNLOWERED not in LOWERINGS
    x = torch.rand(3, device="tpu")
    with pytest.raises(NotImplementedError, match=r"aten\.special_bessel_j0"):
        torch.special.bessel_j0(x)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_quantized_tensors_are_refused_naming_the_op():
    """Quantized dtypes are not supported: quantizing on `tpu` (so flip of a quantized tensor too) names the op, and
    moving a quantized CPU tensor raises PyTorch's own NotImplementedError for the Quantizedtpu key."""
    x = torch.rand(4, device="tpu")
    with pytest.raises(NotImplementedError, match=r"aten\.quantize_per_tensor"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8).flip(0)
    with pytest.raises(NotImplementedError, match="Quantizedtpu"):
        torch.quantize_per_tensor(x.cpu(), 0.1, 0, torch.qint8).to("tpu")


def test_cpu_fallback_switch_runs_counts_and_warns_once():
    x = torch.rand(3)
    torch_tpu.set_cpu_fallback(True)
    metrics.reset()
    try:
        with pytest.warns(UserWarning, match="is not implemented for TPU. Falling back to CPU"):
            out = torch.special.bessel_j0(x.to("tpu"))
        again = torch.special.bessel_j0(x.to("tpu"))
    finally:
        torch_tpu.set_cpu_fallback(False)
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), torch.special.bessel_j0(x))
    torch.testing.assert_close(again.cpu(), out.cpu())
    assert sum(metrics.cpu_fallbacks.values()) >= 2


def test_cpu_fallback_environment_variable():
    code = (
        "import torch, torch_tpu, warnings\n"
        "warnings.simplefilter('error')\n"
        "try:\n"
        "    torch.special.bessel_j0(torch.rand(2, device='tpu'))\n"
        "except UserWarning as w:\n"
        "    print('warned:', w)\n"
        "print(torch_tpu.cpu_fallback_enabled())\n"
    )
    env = child_env(clean=True, TORCH_TPU_CPU_FALLBACK="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "Falling back to CPU" in out and out.strip().endswith("True")


def test_fallback_writes_back_mutated_arguments():
    torch_tpu.set_cpu_fallback(True)
    metrics.reset()
    try:
        x = torch.zeros(4, device="tpu")
        torch.ops.aten.special_bessel_j0.out(torch.ones(4, device="tpu"), out=x)
    finally:
        torch_tpu.set_cpu_fallback(False)
    assert metrics.cpu_fallbacks["aten.special_bessel_j0.out"] == 1
    torch.testing.assert_close(x.cpu(), torch.special.bessel_j0(torch.ones(4)))
