"""Device memory accounting in the CUDA caching allocator's shape: `torch.tpu.memory_stats()` and its readers,
PJRT's out-of-memory errors as `torch.OutOfMemoryError`, and a snapshot of the device's live buffers.

Every `tpu` storage is one device buffer: PJRT allocates per array, with no caching layer that PyTorch could see
between, so in torch_tpu's accounting the allocated, active, requested and reserved figures are one and the same,
nothing is inactive or split, and each allocation is its own segment. Pools split as CUDA's do: an allocation of
at most 1 MiB is from the small pool, a larger one from the large pool. A storage of 0 bytes allocates nothing.

Where PJRT reports memory statistics (`jax.Device.memory_stats()`: TPU and GPU; XLA:CPU reports none),
`reserved_bytes.all.current`/`.peak` are PJRT's figures instead, for every buffer the process holds on the device
(JAX arrays outside torch tensors, cached constants), but never less than the allocated ones, as CUDA's: a storage
not written yet (`torch.empty`) or a Fused eager value not computed yet holds no device memory, and a caller's
`reserved - allocated` must not turn negative. `mem_get_info` reads PJRT's limit.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import torch

from torch_tpu.runtime import platform

SMALL_POOL_BYTES = 1 << 20  # CUDA's kSmallSize: allocations up to 1 MiB come from the small pool
_POOLS = ("all", "large_pool", "small_pool")
_STAT_FIELDS = ("allocated", "current", "freed", "peak")
# CUDA's memory_stats arrays: (name, whether it counts bytes) — all of them are one figure here (see above).
_ARRAYS = (
    ("active", False),
    ("active_bytes", True),
    ("allocated_bytes", True),
    ("allocation", False),
    ("inactive_split", None),
    ("inactive_split_bytes", None),
    ("requested_bytes", True),
    ("reserved_bytes", True),
    ("segment", False),
)


class MemoryStats:
    """Counters of live `tpu` storages, updated by `storage.DeviceBuffer` without a lock (each update is
    straight-line attribute arithmetic, which CPython's eval loop does not interrupt for another thread).

    A small-pool buffer touches only `allocated` (bytes now), `total` (bytes allocated since the last
    accumulated-stats reset), `num_alloc`/`num_free` (since then) and the running peaks of bytes and of
    `num_alloc - num_free`; a large-pool one goes through `add_large`/`free_large`, which first fold the running
    peaks into the per-pool peaks. That is exact: between two large-pool events the large pool holds a fixed
    amount, so the small pool's peak there is the running peak less that amount.
    """

    def __init__(self) -> None:
        self.allocated = 0
        self.total = 0
        self.num_alloc = 0
        self.num_free = 0
        self.running_peak = 0
        self.running_count_peak = 0  # of num_alloc - num_free: the live count less `_base_count`
        self.num_ooms = 0
        self._base_bytes = 0  # `allocated` and the live count when accumulated stats were last reset
        self._base_count = 0
        self._large = [0, 0]  # bytes, buffers: in the large pool now
        self._large_total = [0, 0]  # allocated from / freed to the large pool since the reset
        self._large_freed = [0, 0]
        self._peaks = {pool: [0, 0] for pool in _POOLS}  # bytes, buffers

    def live_count(self) -> int:
        return self._base_count + self.num_alloc - self.num_free

    def _fold(self) -> None:
        """Move the running peaks (since the last large-pool event) into the per-pool peaks; restart them."""
        large_bytes, large_count = self._large
        count_peak = self._base_count + self.running_count_peak
        for pool, peak_bytes, peak_count in (
            ("all", self.running_peak, count_peak),
            ("small_pool", self.running_peak - large_bytes, count_peak - large_count),
            ("large_pool", large_bytes, large_count),
        ):
            peaks = self._peaks[pool]
            peaks[0], peaks[1] = max(peaks[0], peak_bytes), max(peaks[1], peak_count)
        self._restart()

    def _restart(self) -> None:
        """Start the running peaks at the current values (after a large-pool event: a new stretch)."""
        self.running_peak = self.allocated
        self.running_count_peak = self.num_alloc - self.num_free

    def add_large(self, nbytes: int) -> None:
        """A large-pool buffer of `nbytes` was made."""
        self._fold()
        self.allocated += nbytes
        self.total += nbytes
        self.num_alloc += 1
        for counters in (self._large, self._large_total):
            counters[0] += nbytes
            counters[1] += 1
        self._restart()

    def free_large(self, nbytes: int) -> None:
        """A large-pool buffer of `nbytes` was freed."""
        self._fold()
        self.allocated -= nbytes
        self.num_free += 1
        self._large[0] -= nbytes
        self._large[1] -= 1
        self._large_freed[0] += nbytes
        self._large_freed[1] += 1
        self._restart()

    def acquire(self, nbytes: int) -> None:
        """A buffer of `nbytes` was made (what `DeviceBuffer.__init__` does inline)."""
        if nbytes > SMALL_POOL_BYTES:
            self.add_large(nbytes)
        elif nbytes:
            self.allocated += nbytes
            self.total += nbytes
            self.num_alloc += 1
            self.running_peak = max(self.running_peak, self.allocated)
            self.running_count_peak = max(self.running_count_peak, self.num_alloc - self.num_free)

    def release(self, nbytes: int) -> None:
        """A buffer of `nbytes` was freed (what `DeviceBuffer.__del__` does inline)."""
        if nbytes > SMALL_POOL_BYTES:
            self.free_large(nbytes)
        elif nbytes:
            self.allocated -= nbytes
            self.num_free += 1

    @property
    def peak(self) -> int:
        self._fold()
        return self._peaks["all"][0]

    def reset_peak(self) -> None:
        """CUDA's reset_peak_memory_stats: every peak becomes the current value."""
        self._fold()
        live = self.live_count()
        self._peaks["all"] = [self.allocated, live]
        self._peaks["large_pool"] = list(self._large)
        self._peaks["small_pool"] = [self.allocated - self._large[0], live - self._large[1]]

    def reset_accumulated(self) -> None:
        """CUDA's reset_accumulated_memory_stats: the allocated/freed totals and event counters restart at 0."""
        self._fold()
        self._base_bytes, self._base_count = self.allocated, self.live_count()
        self.total = self.num_alloc = self.num_free = self.num_ooms = self.running_count_peak = 0
        self._large_total = [0, 0]
        self._large_freed = [0, 0]

    def pools(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Per pool, per stat field (current, peak, allocated, freed): (bytes, buffers)."""
        self._fold()
        whole = {
            "current": (self.allocated, self.live_count()),
            "allocated": (self.total, self.num_alloc),
            "freed": (self._base_bytes + self.total - self.allocated, self.num_free),
        }
        large = {
            "current": tuple(self._large),
            "allocated": tuple(self._large_total),
            "freed": tuple(self._large_freed),
        }
        small = {field: (whole[field][0] - large[field][0], whole[field][1] - large[field][1]) for field in whole}
        result = {"all": whole, "large_pool": large, "small_pool": small}
        for pool, fields in result.items():
            fields["peak"] = tuple(self._peaks[pool])
        return result


memory = MemoryStats()


def _pjrt_stats(index: int = 0) -> dict[str, int] | None:
    """PJRT's memory statistics of the device (None on XLA:CPU)."""
    return platform.device(index).memory_stats()


def stats_as_nested_dict(index: int = 0) -> dict[str, Any]:
    """`torch.cuda.memory_stats_as_nested_dict`'s shape, from the accounting above (and PJRT's reserved
    figures where it has them)."""
    pools = memory.pools()
    result: dict[str, Any] = {
        "num_alloc_retries": 0,  # PJRT does not retry an allocation after freeing cached blocks
        "num_ooms": memory.num_ooms,
        "max_split_size": -1,  # no block splitting (CUDA's value when max_split_size_mb is unset)
        "num_sync_all_streams": 0,
        "num_device_alloc": memory.num_alloc,
        "num_device_free": memory.num_free,
    }
    for name, in_bytes in _ARRAYS:
        position = 0 if in_bytes else 1
        result[name] = {
            pool: {field: 0 if in_bytes is None else pools[pool][field][position] for field in _STAT_FIELDS}
            for pool in _POOLS
        }
    for name in ("oversize_allocations", "oversize_segments"):  # none: nothing is cached to be oversize
        result[name] = dict.fromkeys(_STAT_FIELDS, 0)
    pjrt = _pjrt_stats(index)
    if pjrt:  # at least the allocated figures: an unwritten storage or a Fused value holds no device memory yet
        reserved = result["reserved_bytes"]["all"]
        reserved["current"] = max(pjrt.get("pool_bytes", pjrt.get("bytes_in_use", 0)), reserved["current"])
        reserved["peak"] = max(pjrt.get("peak_pool_bytes", pjrt.get("peak_bytes_in_use", 0)), reserved["peak"])
    return result


def stats(index: int = 0) -> OrderedDict[str, Any]:
    """`torch.cuda.memory_stats`: the nested statistics flattened to dotted keys, sorted."""
    flat: list[tuple[str, Any]] = []

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    flatten("", stats_as_nested_dict(index))
    return OrderedDict(sorted(flat))


def mem_get_info(index: int = 0) -> tuple[int, int]:
    """(free, total) bytes: PJRT's limit less what is in use where it reports them, else the host's available
    and physical memory (XLA:CPU's device memory is the host's)."""
    pjrt = _pjrt_stats(index)
    if pjrt and "bytes_limit" in pjrt:
        return pjrt["bytes_limit"] - pjrt.get("bytes_in_use", 0), pjrt["bytes_limit"]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), platform.total_memory(index)


_cache_clearers: list[Callable[[], None]] = []


def on_empty_cache(clear: Callable[[], None]) -> None:
    """Register a cache of device arrays (shared zeros, recurring scalars) that `empty_cache` drops."""
    _cache_clearers.append(clear)


def empty_cache() -> None:
    """Drop torch_tpu's caches of device arrays (their memory returns once no tensor holds them); PJRT keeps no
    cache of freed blocks to release."""
    for clear in _cache_clearers:
        clear()


def snapshot(index: int = 0) -> list[dict[str, Any]]:
    """`torch.cuda.memory_snapshot()`'s shape: one segment per live device buffer on the device (every jax.Array,
    whether a tensor's or not), its address, size, pool and, as `frames` (innermost first, as CUDA's), the Python
    stack that created it: JAX's record, the one `jax.profiler.device_memory_profile()` reports."""
    device = platform.device(index)
    segments = []
    for array in jax.live_arrays():
        if array.is_deleted() or device not in array.devices():
            continue
        for shard in array.addressable_shards:
            if shard.device != device:
                continue
            size = shard.data.nbytes
            address = shard.data.unsafe_buffer_pointer()
            frames = [
                {"filename": frame.file_name, "line": frame.line_num, "name": frame.function_name}
                for frame in (array.traceback.frames if array.traceback is not None else [])
            ]
            block = {"address": address, "size": size, "requested_size": size, "state": "active_allocated"}
            segments.append(
                {
                    "device": index,
                    "address": address,
                    "total_size": size,
                    "allocated_size": size,
                    "active_size": size,
                    "requested_size": size,
                    "stream": 0,
                    "segment_type": "small" if size <= SMALL_POOL_BYTES else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "shape": tuple(array.shape),
                    "dtype": str(array.dtype),
                    "frames": frames,
                    "blocks": [{**block, "frames": frames}],
                }
            )
    return segments


def _scaled(value: int, preferred: float, prefixes: tuple[str, ...], base: int, limit: int) -> tuple[int, str]:
    """CUDA's summary scaling: step up a prefix while the row's preferred figure reaches `limit` of the next."""
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if preferred < limit * base:
            break
        prefix, value, preferred = new_prefix, value // base, preferred / base
    return value, prefix


def _format_size(size: int, preferred: float) -> str:
    size, prefix = _scaled(size, preferred, ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB"), 1024, 768)
    return f"{size:6d} {prefix}"


def _format_count(count: int, preferred: float) -> str:
    count, prefix = _scaled(count, preferred, (" ", "K", "M"), 1000, 750)
    return f"{count:7d} {prefix} "


_SUMMARY_ROWS = (
    ("allocated_bytes", "Allocated memory", _format_size),
    ("active_bytes", "Active memory", _format_size),
    ("requested_bytes", "Requested memory", _format_size),
    ("reserved_bytes", "TPU reserved memory", _format_size),
    ("inactive_split_bytes", "Non-releasable memory", _format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "TPU reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
)


def summary(index: int = 0, abbreviated: bool = False) -> str:
    """`torch.cuda.memory_summary`'s table, labelled for TPU, from `stats`."""
    figures = stats(index)
    rule, double = "-" * 75, "=" * 75
    lines = [
        double,
        f" {'':16} PyTorch TPU memory summary, device ID {index:<18d} ",
        rule,
        f"  {'':9} TPU OOMs: {figures['num_ooms']:<13d} | {'':6} "
        f"PJRT alloc retries: {figures['num_alloc_retries']:<8d}  ",
        double,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    pools = [("all", None)] + (
        [] if abbreviated else [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    )
    for key, title, formatter in _SUMMARY_ROWS:
        lines.append(rule)
        preferred = None
        for pool, label in pools:
            values = [figures[f"{key}.{pool}.{field}"] for field in ("current", "peak", "allocated", "freed")]
            preferred = preferred or values
            cells = " | ".join(formatter(value, reference) for value, reference in zip(values, preferred, strict=True))
            lines.append(f" {label or title:<21} | {cells} ")
    for key, title in (
        ("oversize_allocations", "Oversize allocations"),
        ("oversize_segments", "Oversize TPU segments"),
    ):
        lines.append(rule)
        values = [figures[f"{key}.{field}"] for field in ("current", "peak", "allocated", "freed")]
        lines.append(f" {title:<21} | {' | '.join(_format_count(value, value) for value in values)} ")
    lines.append(double)
    return "|" + "|\n|".join(lines) + "|\n"


# --- out of memory -------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
# XLA's wordings: "Out of memory allocating 123 bytes" (CPU), "Attempting to allocate 1.00G" (TPU), "while trying
# to allocate 123 bytes" (GPU), "Attempting to reserve 12.50G" (TPU, an executable's memory), "the total memory
# required for HLO temporaries (1.00P) exceeds available HBM" (TPU, a program's temporaries; seen on a v5e).
_REQUESTED = re.compile(
    r"(?:allocat\w*|reserve|required for [\w ]+?\()\s*(\d+(?:\.\d+)?)\s*(?:([KMGTP])i?B?|bytes|B)?\b", re.IGNORECASE
)


def is_oom(error: BaseException) -> bool:
    """Whether `error` is PJRT's out-of-memory error (RESOURCE_EXHAUSTED from an allocation, a transfer, an
    executable's compilation or execution)."""
    return isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error)


def _format_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def requested_bytes(message: str) -> int | None:
    """The size an XLA out-of-memory message says it tried to allocate, if it says."""
    found = _REQUESTED.search(message)
    if found is None:
        return None
    return int(float(found.group(1)) * _UNITS[(found.group(2) or "").upper()])


def out_of_memory(
    error: BaseException, nbytes: int | None = None, index: int = 0, pending: int = 0
) -> torch.OutOfMemoryError:
    """PyTorch's exception for PJRT's out-of-memory `error`, in CUDA's wording (`nbytes`: the size tried, when
    the caller knows it; `pending`: bytes already counted for the outputs that failed to materialise, which no
    tensor holds yet), counted in `num_ooms`; raise it `from error`."""
    memory.num_ooms += 1
    message = str(error).strip()
    nbytes = nbytes if nbytes is not None else requested_bytes(message)
    tried = _format_bytes(nbytes) if nbytes is not None else "an amount XLA did not state"
    try:
        free, total = mem_get_info(index)
        capacity = (
            f" tpu:{index} has a total capacity of {_format_bytes(total)} of which {_format_bytes(free)} is free."
        )
    except Exception:  # the device cannot be asked (it is what failed): the message without it
        capacity = ""
    return torch.OutOfMemoryError(
        f"TPU out of memory. Tried to allocate {tried}.{capacity} Of the allocated memory "
        f"{_format_bytes(memory.allocated - pending)} is held by tpu tensors. XLA reported: {message}"
    )
