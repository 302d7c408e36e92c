"""The `tpu` device itself: registration, torch.tpu, torch.accelerator, tensor and module methods."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import torch

import torch_tpu
from torch_tpu.eager import encoding
from torch_tpu.testing.processes import child_env

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


@pytest.mark.children
def test_import_torch_alone_registers_tpu():
    code = "import torch; x = torch.ones(3, device='tpu'); print(type(x).__name__, x.device, (x * 2).cpu().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Tensor", "tpu:0", "[2.0,", "2.0,", "2.0]"]


@pytest.mark.children
def test_import_torch_loads_no_compiler():
    """Autoloading us must not cost a CPU-only `import torch` Dynamo's seconds: the compile backend loads when
    `torch.compile` asks for it (the entry point), the distributed layer's graph hook sits outside it."""
    code = "import sys, torch; print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch_tpu.co'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['torch_tpu.compile', 'torch_tpu.compile.capturable', 'torch_tpu.compile.skips']"


def test_tensor_is_plain_and_on_tpu():
    x = torch.ones(2, 3, device="tpu")
    assert type(x) is torch.Tensor
    assert x.device == torch.device("tpu", 0)
    assert x.is_tpu and not torch.ones(1).is_tpu


def test_tensor_and_module_tpu_methods():
    x = torch.arange(4.0).tpu()
    assert x.device.type == "tpu"
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    model = torch.nn.Linear(3, 2).tpu()
    assert all(p.device.type == "tpu" for p in model.parameters())


def test_device_module_api():
    tpu = torch.tpu
    assert tpu is torch_tpu.tpu
    assert tpu.is_available() and tpu.device_count() == 1 and tpu.current_device() == 0
    tpu.set_device(0)
    with pytest.raises(RuntimeError, match="one tpu device per process"):
        tpu.set_device(1)
    assert torch.ones(1, device="tpu") is not None and tpu.is_initialized()
    name = tpu.get_device_name()
    assert "tpu device emulated on cpu" in name or "TPU" in name or "gpu" in name
    props = tpu.get_device_properties()
    assert props.name == name and props.total_memory > 0
    assert torch.bfloat16 in tpu.get_amp_supported_dtype()
    assert tpu.current_stream() is tpu.default_stream()
    tpu.synchronize()


def test_device_name_matches_platform():
    from torch_tpu.runtime import platform

    if platform.platform() == "cpu":
        assert torch.tpu.get_device_name() == "XLA CPU (tpu device emulated on cpu)"


def test_platform_variable_is_checked(monkeypatch):
    from torch_tpu.runtime import platform

    monkeypatch.setenv("TORCH_TPU_PLATFORM", "quantum")
    with pytest.raises(ValueError, match="TORCH_TPU_PLATFORM"):
        platform.requested()
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "CPU")
    assert platform.requested() == "cpu"


@pytest.mark.children
def test_platform_cpu_selected_in_fresh_process():
    code = "import torch; torch.ones(1, device='tpu'); print(torch.tpu.get_device_properties().platform)"
    env = child_env(clean=True, TORCH_TPU_PLATFORM="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "cpu"


def test_accelerator_api():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == 1
    torch.accelerator.synchronize()
    torch.accelerator.synchronize("tpu")
    base = torch.accelerator.memory_allocated()
    x = torch.ones(1024, device="tpu")
    x.add_(1)
    assert torch.accelerator.memory_allocated() == base + 4096
    assert torch.accelerator.max_memory_allocated() >= base + 4096
    del x
    assert torch.accelerator.memory_allocated() == base
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base


def test_events_time_work():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    torch.ones(8, 8, device="tpu").mul_(2)
    end.record()
    assert start.elapsed_time(end) >= 0.0


def test_device_mismatch_raises_like_pytorch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="tpu") + torch.ones(3)


def test_zero_dim_cpu_tensor_mixes_like_cuda():
    out = torch.ones(3, device="tpu") * torch.tensor(2.0)
    assert out.device.type == "tpu" and out.cpu().tolist() == [2.0, 2.0, 2.0]


def test_recurring_zero_dim_cpu_tensors_keep_dtype_sign_and_value():
    # 0-dim host tensors are cached on the device once a value recurs: the cache must tell them apart exactly
    base = torch.tensor([1.5, -2.0, 3.0])
    scalars = [
        torch.tensor(0.0),
        torch.tensor(-0.0),
        torch.tensor(2.5),
        torch.tensor(2.5, dtype=torch.float64),
        torch.tensor(2.5, dtype=torch.bfloat16),
        torch.tensor(3),
        torch.tensor(True),
        torch.tensor(1 + 2j),
        torch.tensor(float("nan")),
    ]
    for _ in range(3):
        for scalar in scalars:
            expected = base * scalar
            out = base.to("tpu") * scalar
            assert out.dtype == expected.dtype
            torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0, equal_nan=True)
            if not expected.is_complex():
                assert torch.equal(torch.signbit(out.cpu()), torch.signbit(expected))


def test_recurring_python_numbers_are_transferred_as_jax_types_them_without_a_compile():
    """A Python number used again becomes a device array by a transfer: making it with `jnp.asarray` compiled a
    program in every process (~0.35 s on a TPU)."""
    compiles = []

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    values = (2.718281828459045, -0.0, 987654321, False)
    encoding._scalars.clear()
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        arrays = [[encoding._device_scalar(value) for _ in range(2)][1] for value in values]
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    for value, array in zip(values, arrays, strict=True):
        expected = jnp.asarray(value)
        assert isinstance(array, jax.Array) and (array.dtype, array.weak_type) == (expected.dtype, expected.weak_type)
        # JAX's own array of the number on this platform (a TPU's emulated float64 keeps ~48 bits); -0.0 its sign
        assert str(array.item()) == str(expected.item())
