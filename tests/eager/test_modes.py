"""Eager modes: Strict (default, async) and Debug (synchronous; NaN checks)."""

import subprocess
import sys

import pytest
import torch

from torch_tpu.eager import modes
from torch_tpu.testing.processes import child_env

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def test_default_mode_is_strict():
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER


def test_property_and_context_manager():
    debug = torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    with torch.tpu.set_eager_mode(debug):
        assert torch.tpu.eager_mode is debug
        x = torch.ones(3, device="tpu") * 2
        assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER
    torch.tpu.eager_mode = debug
    try:
        assert modes.launch_blocking()
    finally:
        torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_NEVER
    with pytest.raises(TypeError, match="EagerMode"):
        torch.tpu.eager_mode = "fast"


@pytest.mark.children
def test_launch_blocking_environment_variable():
    code = "import torch; torch.ones(1, device='tpu'); print(torch.tpu.eager_mode.name)"
    env = child_env(clean=True, TORCH_TPU_LAUNCH_BLOCKING="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "DEFER_NEVER_AND_LAUNCH_BLOCKING"


def test_debug_nans_names_the_op(monkeypatch):
    monkeypatch.setattr(modes.state, "debug_nans", True)
    x = torch.tensor([1.0, 0.0], device="tpu")
    with pytest.raises(FloatingPointError, match=r"aten\.div\.Tensor produced NaN or Inf"):
        x / torch.zeros(2, device="tpu")
    assert (x * 2).cpu().tolist() == [2.0, 0.0]


def test_strict_is_asynchronous_and_synchronize_waits():
    x = torch.rand(256, 256, device="tpu")
    for _ in range(5):
        x = x @ x * 1e-3
    torch.tpu.synchronize()
    from torch_tpu.runtime import storage

    assert storage.read(x).is_ready()


def test_set_eager_mode_as_a_call_and_as_a_block():
    fused, debug = torch.tpu.EagerMode.DEFER_AND_FUSE, torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    torch.tpu.set_eager_mode(fused)  # a call sets the mode (the README's switches table)
    try:
        assert torch.tpu.eager_mode is fused
        with torch.tpu.set_eager_mode(debug):  # a block sets it for the block, then restores the one before
            assert torch.tpu.eager_mode is debug
        assert torch.tpu.eager_mode is fused
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER
    with pytest.raises(TypeError, match="EagerMode"):
        torch.tpu.set_eager_mode("fused")
