"""`torch.tpu` / `torch.accelerator` memory statistics in CUDA's shape, followed exactly through allocations and
frees; PJRT's out-of-memory errors as `torch.OutOfMemoryError`."""

import gc

import jax
import numpy as np
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import compat, fills, memory, storage

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

# The keys of `torch.cuda.memory_stats()` / `torch.accelerator.memory_stats()`, as PyTorch's C++ builds them
# (torch/csrc/cuda/Module.cpp `THCPModule_memoryStats`, torch/csrc/DeviceAccelerator.cpp `_accelerator_getDeviceStats`:
# six event counters, nine StatArrays over the all/small_pool/large_pool pools, two Stats), flattened by
# `torch.cuda.memory_stats`. Pinned here: torch.cuda cannot produce them without CUDA.
_FIELDS = ("current", "peak", "allocated", "freed")
CUDA_KEYS = (
    {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc", "num_device_free"}
    | {
        f"{stat}.{pool}.{field}"
        for stat in (
            "allocated_bytes",
            "reserved_bytes",
            "active_bytes",
            "requested_bytes",
            "allocation",
            "segment",
            "active",
            "inactive_split",
            "inactive_split_bytes",
        )
        for pool in ("all", "small_pool", "large_pool")
        for field in _FIELDS
    }
    | {f"{stat}.{field}" for stat in ("oversize_allocations", "oversize_segments") for field in _FIELDS}
)
POOLS = ("all", "small_pool", "large_pool")
SMALL, LARGE = 4096, 3 << 20  # bytes: one allocation from each pool (the small pool holds up to 1 MiB)


@pytest.fixture
def clean():
    """Counters from a known point: garbage collected, peaks and totals reset."""
    gc.collect()
    torch.tpu.reset_peak_memory_stats()
    torch.tpu.reset_accumulated_memory_stats()
    return torch.tpu.memory_stats()


def _assert_reserved_covers_allocated(reserved: int, allocated: int) -> None:
    """Where PJRT reports the device's memory (a TPU), reserved is its bytes in use: the tensors and what the
    runtime holds besides (programs, their temporaries); elsewhere nothing but the tensors is reserved."""
    if jax.devices()[0].memory_stats():
        assert reserved >= allocated
    else:
        assert reserved == allocated


def _delta(before: dict, after: dict, *keys: str) -> list[int]:
    return [after[key] - before[key] for key in keys]


def test_the_key_set_is_cudas():
    assert len(CUDA_KEYS) == 122
    assert set(torch.tpu.memory_stats()) == CUDA_KEYS
    assert set(torch.accelerator.memory_stats()) == CUDA_KEYS
    assert list(torch.tpu.memory_stats()) == sorted(CUDA_KEYS)  # sorted, as torch.cuda.memory_stats returns them


def test_values_follow_allocations_and_frees(clean):
    base = clean
    small = torch.empty(SMALL // 4, dtype=torch.float32, device="tpu")
    large = torch.empty(LARGE, dtype=torch.uint8, device="tpu")
    stats = torch.tpu.memory_stats()
    assert _delta(base, stats, "allocated_bytes.all.current", "allocated_bytes.all.peak") == [SMALL + LARGE] * 2
    assert _delta(base, stats, "allocated_bytes.small_pool.current", "allocated_bytes.large_pool.current") == [
        SMALL,
        LARGE,
    ]
    assert stats["allocated_bytes.all.allocated"] == SMALL + LARGE and stats["allocated_bytes.all.freed"] == 0
    assert stats["allocation.all.allocated"] == 2 and stats["allocation.large_pool.allocated"] == 1
    assert _delta(base, stats, "allocation.all.current", "segment.all.current", "active.all.current") == [2, 2, 2]
    for same in ("active_bytes", "requested_bytes", "allocated_bytes"):
        assert stats[f"{same}.all.current"] == stats["allocated_bytes.all.current"], same
    _assert_reserved_covers_allocated(stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"])
    assert (
        torch.tpu.memory_allocated()
        == torch.accelerator.memory_allocated()
        == base["allocated_bytes.all.current"] + (SMALL + LARGE)
    )
    view = large[1:]  # a view allocates nothing
    del large
    stats = torch.tpu.memory_stats()
    assert _delta(base, stats, "allocated_bytes.large_pool.current") == [LARGE]  # the view keeps its storage
    del view
    stats = torch.tpu.memory_stats()
    assert _delta(base, stats, "allocated_bytes.all.current", "allocated_bytes.all.peak") == [SMALL, SMALL + LARGE]
    assert stats["allocated_bytes.large_pool.freed"] == LARGE and stats["allocation.all.freed"] == 1
    assert stats["allocated_bytes.large_pool.peak"] == LARGE
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.memory_allocated()
    torch.accelerator.reset_accumulated_memory_stats()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.freed"] == 0
    assert stats["allocation.all.allocated"] == stats["num_device_alloc"] == 0
    assert _delta(base, stats, "allocated_bytes.all.current", "allocation.all.current") == [SMALL, 1]
    del small


def test_each_pools_peak_is_exact(clean):
    """The small pool peaks while a large buffer is live, the whole device at another moment."""
    base = clean
    large = torch.empty(LARGE, dtype=torch.uint8, device="tpu")
    small = [torch.empty(SMALL, dtype=torch.uint8, device="tpu") for _ in range(3)]
    del large
    more = [torch.empty(SMALL, dtype=torch.uint8, device="tpu") for _ in range(2)]  # 5 small, no large
    stats = torch.tpu.memory_stats()
    assert _delta(base, stats, "allocated_bytes.small_pool.peak") == [5 * SMALL]
    assert _delta(base, stats, "allocated_bytes.all.peak") == [LARGE + 3 * SMALL]
    assert _delta(base, stats, "allocation.all.peak", "allocation.small_pool.peak") == [5, 5]
    assert _delta(base, stats, "allocation.large_pool.peak", "allocation.large_pool.current") == [1, 0]
    del small, more


@pytest.mark.skipif(not compat.STORAGE_SWAPS_DATA_POINTER, reason=f"torch {torch.__version__}: no tpu storage resize")
def test_zero_bytes_allocate_nothing_and_resize_reallocates(clean):
    empty = torch.empty(0, device="tpu")
    assert torch.tpu.memory_stats()["allocation.all.allocated"] == 0
    grown = torch.empty(SMALL, dtype=torch.uint8, device="tpu")
    grown.untyped_storage().resize_(2 * SMALL)  # as CUDA: the old block freed, a new one allocated
    stats = torch.tpu.memory_stats()
    assert stats["allocation.all.allocated"] == 2 and stats["allocation.all.freed"] == 1
    assert stats["allocated_bytes.all.freed"] == SMALL
    del empty, grown


def test_summary_is_cudas_table_labelled_for_tpu(clean):
    kept = torch.empty(SMALL, dtype=torch.uint8, device="tpu")
    text = torch.tpu.memory_summary()
    assert "PyTorch TPU memory summary, device ID 0" in text and "TPU OOMs: 0" in text
    assert "TPU reserved memory" in text and "from large pool" in text
    assert all(len(line) == 77 for line in text.splitlines()), "every row is CUDA's 75 columns wide plus borders"
    current = torch.tpu.memory_allocated()
    row = next(line for line in text.splitlines() if line.startswith("| Allocated memory"))
    assert f"{current // 1024 if current >= 768 * 1024 else current:6d}" in row
    assert "from large pool" not in torch.tpu.memory_summary(abbreviated=True)
    del kept


def test_torch_cudas_summary_accepts_our_stats(monkeypatch):
    """The key set, checked by PyTorch's own consumer of it."""
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: torch.tpu.memory_stats())
    text = torch.cuda.memory.memory_summary(0)
    assert "Allocated memory" in text and "Oversize GPU segments" in text


def test_accelerator_calls():
    torch.accelerator.empty_cache()
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total == torch.tpu.get_device_properties().total_memory
    assert torch.tpu.mem_get_info() == pytest.approx((free, total), rel=0.05)
    assert torch.accelerator.memory_reserved() == torch.tpu.memory_reserved()
    _assert_reserved_covers_allocated(torch.tpu.memory_reserved(), torch.tpu.memory_allocated())
    assert torch.accelerator.max_memory_reserved() == torch.tpu.max_memory_reserved()
    torch.accelerator.reset_peak_memory_stats()
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["num_ooms"] == 0


def test_empty_cache_drops_cached_device_arrays():
    torch.empty(3, 5, device="tpu").add_(1).cpu()  # reads shared zeros: an op on a storage never written
    torch.ones((), device="tpu").cpu()  # a shared 0-d one (runtime/fills.py)
    assert storage._zero_arrays and fills._SCALARS
    torch.tpu.empty_cache()
    assert not storage._zero_arrays and not fills._SCALARS
    assert torch.empty(3, 5, device="tpu").add_(1).sum().item() == 15  # and they come back when needed
    assert torch.ones((), device="tpu").item() == 1


def test_pjrt_figures_where_the_platform_has_them(monkeypatch):
    """TPU and GPU report memory statistics (XLA:CPU reports None): reserved and free memory are PJRT's."""
    held = torch.ones(1000, device="tpu")  # allocated: at least its 4000 bytes
    allocated = torch.tpu.memory_allocated()
    in_use, peak = allocated + 5000, torch.tpu.max_memory_allocated() + 9000
    figures = {"bytes_in_use": in_use, "peak_bytes_in_use": peak, "bytes_limit": 16 << 30}
    monkeypatch.setattr(memory, "_pjrt_stats", lambda index=0: figures)
    assert torch.tpu.memory_reserved() == in_use and torch.tpu.max_memory_reserved() == peak
    assert torch.tpu.mem_get_info() == ((16 << 30) - in_use, 16 << 30)
    assert torch.accelerator.get_memory_info() == ((16 << 30) - in_use, 16 << 30)
    del held


def test_reserved_covers_allocated_when_pjrt_holds_less(monkeypatch):
    """A storage not written yet holds no device memory, so PJRT's bytes in use can be below the allocated figure
    (a TPU reported 1.3 MB in use with 3.1 MB of `torch.empty` allocated); reserved stays at least allocated, as
    CUDA's does, so `reserved - allocated` never turns negative."""
    unwritten = torch.empty(1 << 20, dtype=torch.uint8, device="tpu")
    figures = {"bytes_in_use": 1000, "peak_bytes_in_use": 2000, "bytes_limit": 16 << 30}
    monkeypatch.setattr(memory, "_pjrt_stats", lambda index=0: figures)
    stats = torch.tpu.memory_stats()
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"] >= 1 << 20
    assert stats["reserved_bytes.all.peak"] == stats["allocated_bytes.all.peak"] >= 1 << 20
    del unwritten


def test_snapshot_lists_live_buffers_with_their_stacks():
    made = torch.arange(777, dtype=torch.float32, device="tpu") + 1
    address = torch_tpu.to_jax(made).unsafe_buffer_pointer()  # (computed: a cold op's value may still be queued)
    segments = torch.tpu.memory_snapshot()
    mine = [s for s in segments if s["address"] == address]
    assert len(mine) == 1 and mine[0]["total_size"] == 777 * 4 and mine[0]["segment_type"] == "small"
    assert mine[0]["blocks"][0]["state"] == "active_allocated"
    assert any(frame["name"] == "test_snapshot_lists_live_buffers_with_their_stacks" for frame in mine[0]["frames"])


def _resource_exhausted(*args, **kwargs):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4096 bytes.")


def test_a_transfer_out_of_memory_is_torchs_and_the_process_goes_on(monkeypatch):
    host = torch.arange(1024, dtype=torch.float32)
    before = torch.tpu.memory_stats()["num_ooms"]
    monkeypatch.setattr(compat, "_batched_device_put", _resource_exhausted)  # PJRT refusing the device buffer
    with pytest.raises(torch.cuda.OutOfMemoryError, match=r"^TPU out of memory\. Tried to allocate 4\.00 KiB\."):
        host.to("tpu")
    monkeypatch.undo()
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    assert "TPU OOMs: " + str(before + 1) in torch.tpu.memory_summary()
    torch.testing.assert_close((host.to("tpu") * 2).cpu(), host * 2)


def test_an_executions_out_of_memory_is_torchs_and_the_process_goes_on(monkeypatch):
    """The real error: the CPU client refuses a 1 PiB output (beyond any address space) at once: at the op, or
    (a cold op's first run, queued while its program compiled: `eager.warmup`) where its value is read."""
    if open("/proc/sys/vm/overcommit_memory").read().strip() == "1":
        pytest.skip("with overcommit always on, the host could try to provide the memory")
    gc.collect()
    one = torch.ones(1, dtype=torch.uint8, device="tpu")
    allocated, before = torch.tpu.memory_allocated(), torch.tpu.memory_stats()["num_ooms"]
    try:
        one.expand(1 << 50).clone().flatten()[0].item()
    except torch.cuda.OutOfMemoryError as error:
        assert str(error).startswith("TPU out of memory. Tried to allocate 1024.00 TiB.")
        assert "RESOURCE_EXHAUSTED" in str(error) and isinstance(error.__cause__, jax.errors.JaxRuntimeError)
    else:
        raise AssertionError("no out-of-memory error")
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    assert torch.tpu.memory_allocated() == allocated  # nothing was left allocated
    assert (one + 1).item() == 2


@pytest.mark.parametrize("where", ["fused", "graph"])
def test_a_clusters_or_graphs_out_of_memory_is_torchs(where):
    """The same real error from a Fused-mode cluster and from a compiled graph."""
    if open("/proc/sys/vm/overcommit_memory").read().strip() == "1":
        pytest.skip("with overcommit always on, the host could try to provide the memory")
    one = torch.ones(1, dtype=torch.uint8, device="tpu")
    gc.collect()  # an earlier test's failed output, kept by its traceback's frames until collected
    before, held = torch.tpu.memory_stats()["num_ooms"], torch.tpu.memory_allocated()
    with pytest.raises(
        torch.cuda.OutOfMemoryError, match=r"^TPU out of memory\. Tried to allocate 1024\.00 TiB\."
    ) as info:
        if where == "fused":
            with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                (one.expand(1 << 50) + 1).cpu()
        else:
            torch.compile(lambda t: t.expand(1 << 50).clone(), backend="tpu")(one)
    # the output that failed to materialise is not counted as held (Fused mode had counted it when recorded)
    assert f"Of the allocated memory {memory._format_bytes(held)} is held by tpu tensors." in str(info.value)
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        assert (one * 3).item() == 3


def test_requested_sizes_in_xlas_wordings():
    assert memory.requested_bytes("RESOURCE_EXHAUSTED: Out of memory allocating 1125899906842624 bytes.") == 1 << 50
    assert memory.requested_bytes("Error allocating device buffer: Attempting to allocate 1.50G. That was") == 3 << 29
    assert memory.requested_bytes("Attempting to reserve 12.00M at the bottom of memory") == 12 << 20
    tpu = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (1.00P) exceeds"
    assert memory.requested_bytes(tpu + " available HBM (15.75G).") == 1 << 50  # a v5e's wording
    assert memory.requested_bytes("RESOURCE_EXHAUSTED: something else") is None
    error = memory.out_of_memory(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: no size"))
    memory.memory.num_ooms -= 1  # (not a real event)
    assert "Tried to allocate an amount XLA did not state" in str(error)
    assert memory.is_oom(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: x"))
    assert not memory.is_oom(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: x"))
    assert not memory.is_oom(MemoryError("RESOURCE_EXHAUSTED"))  # only PJRT's error


def test_the_accounting_matches_a_replay_of_every_event():
    """Random allocations and frees in both pools, with resets between: every figure equals a direct replay."""
    rng = np.random.default_rng(0)
    stats, live = memory.MemoryStats(), []
    reference = {pool: {"current": [0, 0], "peak": [0, 0], "allocated": [0, 0], "freed": [0, 0]} for pool in POOLS}
    for step in range(3000):
        if live and rng.random() < 0.45:
            nbytes = live.pop(int(rng.integers(len(live))))
            stats.release(nbytes)
            change, field = -1, "freed"
        else:
            nbytes = int(rng.choice([0, 1, 512, 1 << 20, (1 << 20) + 1, 5 << 20]))
            stats.acquire(nbytes)
            live.append(nbytes)
            change, field = 1, "allocated"
        if nbytes:
            for pool in ("all", "large_pool" if nbytes > memory.SMALL_POOL_BYTES else "small_pool"):
                ref = reference[pool]
                ref["current"][0] += change * nbytes
                ref["current"][1] += change
                ref[field][0] += nbytes
                ref[field][1] += 1
                ref["peak"] = [max(p, c) for p, c in zip(ref["peak"], ref["current"], strict=True)]
        if step % 700 == 699:
            stats.reset_peak()
            for ref in reference.values():
                ref["peak"] = list(ref["current"])
        if step % 1100 == 1099:
            stats.reset_accumulated()
            for ref in reference.values():
                ref["allocated"], ref["freed"] = [0, 0], [0, 0]
        if step % 97 == 0 or step == 2999:
            found = stats.pools()
            expected = {pool: {field: tuple(value) for field, value in ref.items()} for pool, ref in reference.items()}
            assert found == expected, step
