"""Zero-copy exchange with JAX (torch_tpu/interop.py): `torch_tpu.to_jax` / `from_jax` and the DLPack protocol."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import platform
from torch_tpu.testing.compare import float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

ON_CPU = pytest.mark.skipif(platform.platform() != "cpu", reason="the XLA CPU platform's DLPack device is kDLCPU")


_NO_CAPSULE = r"no DLPack capsule .* torch_tpu\.to_jax\(tensor\) gives its jax\.Array without a copy"


def _pointer(value):
    return value.unsafe_buffer_pointer()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int64, jnp.bool_, jnp.complex64])
def test_from_jax_wraps_the_array_itself(dtype):
    array = jnp.asarray(np.arange(12).reshape(3, 4) % 3, dtype=dtype)
    tensor = torch_tpu.from_jax(array)
    assert tensor.device.type == "tpu" and tensor.shape == (3, 4)
    expected = torch.from_numpy(np.asarray(array.astype(jnp.float32) if dtype == jnp.bfloat16 else array).copy())
    assert torch.equal(tensor.cpu(), expected.to(tensor.dtype))
    assert torch_tpu.to_jax(tensor) is array  # the round trip hands back the same buffer


def test_to_jax_of_an_op_result_is_its_buffer():
    x = torch.randn(5, 7)
    result = x.to("tpu") * 2 + 1
    exported = torch_tpu.to_jax(result)
    assert isinstance(exported, jax.Array)
    np.testing.assert_array_equal(np.asarray(exported), (x * 2 + 1).numpy())
    assert _pointer(exported) == _pointer(torch_tpu.to_jax(result))
    assert _pointer(torch_tpu.to_jax(torch_tpu.from_jax(exported))) == _pointer(exported)


def test_to_jax_of_views_computes_their_values():
    host = torch.arange(24.0).reshape(4, 6)
    base = host.to("tpu")
    for view, expected in ((base.t(), host.t()), (base[1:3, ::2], host[1:3, ::2]), (base.view(torch.int32), None)):
        expected = host.view(torch.int32) if expected is None else expected
        np.testing.assert_array_equal(np.asarray(torch_tpu.to_jax(view)), expected.numpy())
    conj = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    np.testing.assert_array_equal(np.asarray(torch_tpu.to_jax(conj.to("tpu").conj())), conj.conj().resolve_conj())


def test_to_jax_in_fused_mode_materialises():
    x = torch.randn(8)
    previous = torch.tpu.eager_mode
    torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE
    try:
        exported = torch_tpu.to_jax(x.to("tpu").exp() * 3)
    finally:
        torch.tpu.eager_mode = previous
    rtol, atol = float32_tolerance(2e-7, 0)  # one exp: correctly rounded on CPU, ~100 ulp on a TPU
    np.testing.assert_allclose(np.asarray(exported), (x.exp() * 3).numpy(), rtol=rtol, atol=atol)


def test_shared_arrays_are_snapshots():
    array = jnp.arange(4.0)
    tensor = torch_tpu.from_jax(array)
    tensor.add_(10)  # a new array in the tensor's storage; the jax.Array is immutable
    np.testing.assert_array_equal(np.asarray(array), np.arange(4.0))
    assert torch.equal(tensor.cpu(), torch.arange(4.0) + 10)


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="expected a tpu tensor, got a tensor on cpu"):
        torch_tpu.to_jax(torch.ones(2))
    with pytest.raises(TypeError, match="expected a concrete jax.Array, got ndarray"):
        torch_tpu.from_jax(np.ones(2))
    with pytest.raises(TypeError, match="concrete jax.Array"):
        jax.jit(lambda a: torch_tpu.from_jax(a))(jnp.ones(2))
    with pytest.raises(RuntimeError, match="require gradient"):
        torch.ones(2, device="tpu", requires_grad=True).__dlpack__()


def test_jax_consumes_tpu_tensors_through_dlpack_without_a_copy():
    tensor = torch.randn(3, 4).to("tpu") - 1
    buffer = torch_tpu.to_jax(tensor)
    if platform.platform() == "tpu":  # JAX exports no DLPack capsule of a TPU array: the error says what does
        for export in (tensor.__dlpack__, tensor.__dlpack_device__, lambda: jnp.from_dlpack(tensor)):
            with pytest.raises(BufferError, match=_NO_CAPSULE):
                export()
        return
    for consume in (jnp.from_dlpack, jax.dlpack.from_dlpack):
        imported = consume(tensor)
        np.testing.assert_array_equal(np.asarray(imported), tensor.cpu().numpy())
        assert _pointer(imported) == _pointer(buffer)


class _TpuArray:
    """What JAX hands back for an array on a TPU (measured on a v5e): no DLPack device, no capsule."""

    def __dlpack_device__(self):
        raise BufferError("__dlpack__ device only supported for CPU and GPU, got platform: tpu")

    def __dlpack__(self, **kwargs):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: Device TPU_0 cannot be used as a DLPack device.")


def test_the_tpu_platforms_refusal_names_the_zero_copy_way(monkeypatch):
    tensor = torch.ones(3, device="tpu")
    monkeypatch.setattr(torch_tpu.interop, "to_jax", lambda t: _TpuArray())
    for export in (tensor.__dlpack__, tensor.__dlpack_device__, lambda: torch.utils.dlpack.to_dlpack(tensor)):
        with pytest.raises(BufferError, match=_NO_CAPSULE):
            export()


def test_another_runtime_error_of_the_export_is_not_renamed(monkeypatch):
    class Deleted(_TpuArray):
        def __dlpack__(self, **kwargs):
            raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: buffer has been deleted or donated")

    monkeypatch.setattr(torch_tpu.interop, "to_jax", lambda t: Deleted())
    with pytest.raises(jax.errors.JaxRuntimeError, match="deleted or donated"):
        torch.ones(3, device="tpu").__dlpack__()


@ON_CPU
def test_to_dlpack_of_a_tpu_tensor_exports_the_jax_buffer():
    tensor = torch.arange(6.0).to("tpu") * 3
    assert tensor.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLCPU, 0)
    for export in (torch.utils.dlpack.to_dlpack, torch.to_dlpack):
        host = torch.utils.dlpack.from_dlpack(export(tensor))  # a CPU view of the same memory
        assert host.data_ptr() == _pointer(torch_tpu.to_jax(tensor))
        assert torch.equal(host, torch.arange(6.0) * 3)


def test_torch_from_dlpack_of_a_tpu_tensor_aliases_it():
    tensor = torch.randn(4).to("tpu")
    alias = torch.from_dlpack(tensor)
    assert alias.device == tensor.device and alias.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    alias.mul_(2)  # shares the storage, as torch.from_dlpack of a CUDA tensor does
    assert torch.equal(tensor.cpu(), alias.cpu())
    copied = torch.from_dlpack(tensor, copy=True)
    assert copied.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
    assert torch.equal(copied.cpu(), tensor.cpu())
    with pytest.raises(ValueError, match="without copying"):
        torch.from_dlpack(tensor, device="cpu", copy=False)
    assert torch.equal(torch.from_dlpack(tensor, device="cpu"), tensor.cpu())


def test_torch_from_dlpack_of_a_jax_array_with_device_tpu_wraps_it():
    array = jnp.linspace(0.0, 1.0, 5)
    tensor = torch.from_dlpack(array, device="tpu")
    assert tensor.device.type == "tpu" and torch_tpu.to_jax(tensor) is array


@ON_CPU
def test_torch_from_dlpack_of_a_jax_array_stays_a_cpu_tensor_on_the_cpu_platform():
    array = jnp.arange(6, dtype=jnp.int32)
    host = torch.from_dlpack(array)
    assert host.device.type == "cpu" and host.data_ptr() == _pointer(array)
    assert torch.equal(host, torch.arange(6, dtype=torch.int32))


def test_pinned_cpu_tensors_stay_kdlcpu():
    host = torch.arange(3.0).pin_memory()
    assert host.__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLCPU, 0)
    imported = np.from_dlpack(host)
    assert imported.ctypes.data == host.data_ptr()
    assert jnp.from_dlpack(host).tolist() == [0.0, 1.0, 2.0]
