"""`UntypedStorage.resize_` of `tpu` storages (FSDP2 frees unsharded parameters with `resize_(0)` and regrows them),
against CPU storages: the kept bytes, the reported sizes, `memory_allocated`, and the device memory released."""

import gc
import warnings
import weakref

import pytest
import torch

import torch_tpu
from torch_tpu.runtime import compat, deferred, storage

pytestmark = pytest.mark.skipif(
    not compat.STORAGE_SWAPS_DATA_POINTER, reason=f"torch {torch.__version__}: no tpu storage resize (test_compat)"
)


def _bytes(s: torch.UntypedStorage) -> list[int]:
    """A storage's bytes, read through a uint8 tensor on it."""
    view = torch.empty(0, dtype=torch.uint8, device=s.device).set_(s, 0, (s.nbytes(),), (1,))
    return view.cpu().tolist()


@pytest.mark.parametrize(
    "dtype, new_nbytes",
    [
        (torch.float32, 12),
        (torch.float32, 40),
        (torch.float32, 6),  # not a whole number of elements
        (torch.float64, 0),
        (torch.bool, 9),
        (torch.complex64, 24),
        (torch.int16, 11),
    ],
)
def test_resize_keeps_the_leading_bytes_as_cpu_does(dtype, new_nbytes):
    host = (torch.arange(1, 7) * 37).to(dtype)
    cpu, tpu = host.clone().untyped_storage(), host.to("tpu").untyped_storage()
    kept = min(cpu.nbytes(), new_nbytes)
    assert tpu.resize_(new_nbytes) is tpu
    cpu.resize_(new_nbytes)
    assert tpu.nbytes() == tpu.size() == cpu.nbytes() == new_nbytes
    assert _bytes(tpu)[:kept] == list(cpu)[:kept]
    assert _bytes(tpu)[kept:] == [0] * (new_nbytes - kept)  # new bytes read as zeros (CPU's are uninitialised)


def test_resize_to_zero_releases_the_device_array_and_regrows():
    x = torch.arange(256, dtype=torch.float32, device="tpu") + 1
    gc.collect()  # earlier tests' garbage, freed by the collection below, must not move the figures
    base = torch.tpu.memory_allocated()
    array = weakref.ref(torch_tpu.to_jax(x))  # (computed: a cold op's value may still be queued)
    x.untyped_storage().resize_(0)
    gc.collect()
    assert array() is None, "the device array outlived resize_(0)"
    assert torch.tpu.memory_allocated() == base - 1024 and x.untyped_storage().nbytes() == 0
    x.untyped_storage().resize_(1024)
    assert torch.tpu.memory_allocated() == base
    x.copy_(torch.arange(256, dtype=torch.float32))  # FSDP2's all-gather copies into the regrown storage
    assert x.cpu().tolist() == list(range(256)) and x.shape == (256,)


def test_a_tensor_on_a_storage_resized_to_zero_raises_when_used():
    x = torch.ones(4, 3, device="tpu")
    row = x[1]
    x.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match=r"needs 48 bytes but its storage holds 0 .*resize_"):
        x + 1
    with pytest.raises(RuntimeError, match="needs 48 bytes but its storage holds 0"):
        x.fill_(2.0)
    with pytest.raises(RuntimeError, match="at storage offset 3 needs 24 bytes but its storage holds 0"):
        row.cpu()


def test_peak_follows_a_regrown_storage():
    x = torch.ones(8, device="tpu")
    x.untyped_storage().resize_(0)
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    x.untyped_storage().resize_(4096)
    assert torch.tpu.max_memory_allocated() == base + 4096


def test_resize_of_a_pending_buffer_in_fused_mode():
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        x = torch.arange(4, dtype=torch.float32, device="tpu") * 3
        freed = torch.arange(4, dtype=torch.float32, device="tpu") + 1
        assert deferred.is_pending(storage.buffer_of(x)._array)
        x.untyped_storage().resize_(8)
        freed.untyped_storage().resize_(0)
        assert torch.empty(0, device="tpu").set_(x.untyped_storage(), 0, (2,), (1,)).cpu().tolist() == [0.0, 3.0]
    assert id(storage.buffer_of(freed)) not in deferred.buffers


def test_typed_storage_resize_and_cpu_storages():
    with warnings.catch_warnings():  # PyTorch warns "TypedStorage is deprecated" once per process
        warnings.simplefilter("ignore", UserWarning)
        typed = torch.ones(3, device="tpu").storage()
    typed.resize_(5)
    assert typed.size() == 5 and typed.nbytes() == 20
    cpu = torch.UntypedStorage(8)
    cpu.resize_(16)  # PyTorch's own resize, untouched
    assert cpu.nbytes() == 16


def test_negative_size_raises():
    with pytest.raises(RuntimeError, match="must be non-negative"):
        torch.ones(2, device="tpu").untyped_storage().resize_(-1)
