"""Host <-> device transfers and host interop behave as on CUDA."""

import copy
import io
import pickle

import numpy as np
import pytest
import torch

from torch_tpu.runtime import compat

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


def _sample(dtype):
    if dtype == torch.bool:
        return torch.tensor([[True, False, True], [False, False, True]])
    if dtype.is_complex:
        return torch.randn(2, 3, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(2, 3) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([[info.min, -1 if info.min < 0 else 0, 0], [1, 7, info.max]], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_exact(dtype):
    host = _sample(dtype)
    on_tpu = host.to("tpu")
    assert on_tpu.dtype == dtype and on_tpu.device.type == "tpu"
    assert torch.equal(on_tpu.cpu(), host)
    assert torch.equal(on_tpu.to("cpu", non_blocking=True), host)


def test_int64_and_float64_keep_their_width():
    big = torch.tensor([2**40 + 1, -(2**50) - 3], dtype=torch.int64)
    assert big.to("tpu").cpu().tolist() == big.tolist()
    precise = torch.tensor([1 + 1e-12], dtype=torch.float64)
    assert precise.to("tpu").cpu().item() == precise.item()


def test_item_tolist_and_scalars():
    x = torch.tensor([[1.5, -2.0], [3.25, 4.0]], device="tpu")
    assert x[0, 0].item() == 1.5
    assert x.tolist() == [[1.5, -2.0], [3.25, 4.0]]
    assert torch.tensor(7, device="tpu").item() == 7
    assert bool(torch.tensor(True, device="tpu")) is True
    assert float(torch.tensor(2.5, device="tpu")) == 2.5


def test_numpy_errors_like_cuda():
    x = torch.ones(2, device="tpu")
    with pytest.raises(TypeError, match="can't convert tpu:0 device type tensor to numpy"):
        x.numpy()
    assert np.array_equal(x.cpu().numpy(), np.ones(2, dtype=np.float32))


def test_from_numpy_and_tensor_constructor():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert torch.equal(torch.from_numpy(array).to("tpu").cpu(), torch.from_numpy(array))
    made = torch.tensor([[1, 2], [3, 4]], device="tpu")
    assert made.device.type == "tpu" and made.dtype == torch.int64
    assert made.cpu().tolist() == [[1, 2], [3, 4]]


def test_non_contiguous_and_offset_transfers():
    host = torch.arange(24.0).reshape(4, 6)
    device = host.to("tpu")
    for view in (lambda t: t.t(), lambda t: t[1:, 2:5], lambda t: t[:, ::2], lambda t: t.select(1, 3)):
        assert torch.equal(view(device).cpu(), view(host))
    target = torch.zeros(4, 6, device="tpu")
    target[1:3, ::2] = host[1:3, ::2]
    expected = torch.zeros(4, 6)
    expected[1:3, ::2] = host[1:3, ::2]
    assert torch.equal(target.cpu(), expected)


def test_dtype_conversion_on_device():
    x = torch.tensor([1.7, -2.2, 3.5], device="tpu")
    assert x.to(torch.int32).cpu().tolist() == [1, -2, 3]
    assert x.to(torch.bfloat16).dtype == torch.bfloat16
    assert x.double().cpu().dtype == torch.float64


def test_print_and_repr():
    x = torch.tensor([[1.0, 2.5], [3.0, -4.0]], device="tpu")
    text = repr(x)
    assert "device='tpu:0'" in text and "2.5000" in text
    assert str(torch.tensor([1, 2], device="tpu")) == "tensor([1, 2], device='tpu:0')"


def test_save_and_load_with_map_location():
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    state = {"w": x, "v": x[1]}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["w"].device.type == "tpu" and torch.equal(loaded["w"].cpu(), x.cpu())
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_cpu["v"].device.type == "cpu" and on_cpu["v"].tolist() == [3.0, 4.0, 5.0]


def test_module_state_dict_round_trip():
    model = torch.nn.Linear(4, 3).to("tpu")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = torch.nn.Linear(4, 3).to("tpu")
    fresh.load_state_dict(torch.load(buffer))
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_pickle_and_deepcopy_keep_values_views_and_device(dtype):
    host = _sample(dtype).reshape(3, 2)
    base = host.to("tpu")
    view = base.t()[:, 1:]  # a strided view at an offset into the shared storage
    state = {"base": base, "view": view, "param": torch.nn.Parameter(base.float())}
    for copy_of in (lambda s: pickle.loads(pickle.dumps(s)), copy.deepcopy):
        copied = copy_of(state)
        assert copied["view"].device.type == "tpu" and copied["view"].stride() == view.stride()
        assert torch.equal(copied["view"].cpu(), view.cpu()) and torch.equal(copied["base"].cpu(), base.cpu())
        assert isinstance(copied["param"], torch.nn.Parameter) and copied["param"].requires_grad
        copied["base"][0] = copied["base"][1]  # still one storage after the copy, apart from the original's
        assert torch.equal(copied["view"].cpu(), copied["base"].t()[:, 1:].cpu())
        assert torch.equal(base.cpu(), host)


def test_storage_constructors_on_tpu():
    # PyTorch builds these with its C++ allocator, which a Python backend cannot provide: they must still work
    assert (torch.UntypedStorage(10, device="tpu").nbytes(), torch.UntypedStorage(10, device="tpu").device.type) == (
        10,
        "tpu",
    )
    assert torch.UntypedStorage([1, 2, 255], device="tpu").tolist() == [1, 2, 255]
    typed = torch.TypedStorage(4, device="tpu", dtype=torch.float32)
    assert (typed.size(), typed.dtype, typed.device.type) == (4, torch.float32, "tpu")
    storage = torch.arange(4, dtype=torch.int32, device="tpu").untyped_storage()
    clone = storage.clone()
    assert clone.device.type == "tpu" and clone.tolist() == storage.tolist()
    clone.fill_(0)
    assert storage.tolist() != clone.tolist()  # a copy, not an alias
    assert (storage.new().device.type, storage.new().nbytes()) == ("tpu", 0)
    assert torch.UntypedStorage(3).device.type == "cpu" and torch.UntypedStorage(3, device="meta").device.type == "meta"
    kept = storage.tolist()
    if not compat.STORAGE_SWAPS_DATA_POINTER:  # torch 2.11: refused, naming the release it needs
        with pytest.raises(NotImplementedError, match=r"resize_ of a tpu storage needs torch >= 2\.12"):
            storage.resize_(100)
        return
    storage.resize_(100)  # in place, keeping its bytes (test_storage_resize.py)
    assert storage.nbytes() == 100 and storage.tolist()[:16] == kept


def test_host_tensor_mutated_after_a_transfer_leaves_the_device_copy_alone():
    # the transfer is asynchronous and, on the CPU platform, may alias host memory: the device copy is private
    host = torch.randn(257)
    expected = host.clone()
    moved, moved_async = host.to("tpu"), host.to("tpu", non_blocking=True)
    target = torch.zeros(257, device="tpu")
    target.copy_(host)
    host.mul_(2)
    for tensor in (moved, moved_async, target):
        assert torch.equal(tensor.cpu(), expected)
