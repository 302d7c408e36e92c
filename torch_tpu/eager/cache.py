"""Tier 1 of the executable cache: in-process, shared by eager per-op executables, fused clusters and compiled graphs.

The table is bounded, least recently used out, by count (`TORCH_TPU_EXECUTABLE_CACHE_ENTRIES`, default 2048) and
by an estimate of the executables' bytes (`TORCH_TPU_EXECUTABLE_CACHE_BYTES`, default 1 GiB). Every executable
keeps its code mapped (XLA's CPU runtime maps ~3-21 regions per executable, against a kernel limit of 65,530 per
process by default), and it is freed only when nothing references it: the table holds the only reference, so an
evicted executable is really released (an evicted program compiles again, or loads from the persistent tier).
The defaults hold every op signature, fused cluster and graph of a training job many times over; a job that
exceeds them is compiling new programs all the time anyway.

An executable's size is estimated by `persistent.footprint`: its serialized size when the persistent tier wrote
or read it (the code and the metadata XLA keeps resident), else `persistent.DEFAULT_FOOTPRINT`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax

from torch_tpu import metrics
from torch_tpu.runtime import persistent, storage

_EVICT_TO = 0.9  # on overflow, evict down to this fraction of the bounds: the scan runs once per many inserts


@dataclasses.dataclass
class Entry:
    """One cached executable and the facts `torch.tpu._get_cache_stats()` reports about it."""

    name: str
    executable: Callable
    compilation_duration: float = 0.0
    source: str = "compiled"  # "compiled" now, loaded from "disk", or run op by op ("eager")
    read_count: int = 0
    last_read: float = 0.0
    layout: Any = None  # a single tensor output's storage layout (`storage.layout`), for the eager fast path
    nbytes: int = 0  # the size estimate the byte bound counts (set on insert)
    donated: tuple[int, ...] = ()  # the inputs a Fused cluster's executable consumes (`fused._donatable`)
    undonated: tuple[int, ...] = ()  # inputs it never consumes: values still to compute when it compiled
    temp_bytes: int | None = None  # a compiled graph's scratch memory as XLA planned it (`persistent.temp_bytes`)
    out_avals: Any = None  # an eager op's result as avals (a pytree), for Strict eager's queue (`eager.warmup`)
    compiling: Any = None  # Strict eager's cold op while its program compiles (`eager.warmup._Program`)
    better: Any = None  # a cluster's final program, compiling while its parts or a quick one run (`programs.switch`)

    def describe(self, out_avals: Any) -> None:
        """An eager op's result as avals (a pytree: what Strict eager's queue makes of it while it waits,
        `eager.warmup`) and, for a single array, its storage layout (the dispatcher's fast path wraps it)."""
        self.out_avals = out_avals
        if isinstance(out_avals, jax.ShapeDtypeStruct):
            self.layout = storage.layout(out_avals.shape, out_avals.dtype)


def _limit(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        limit = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if limit < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return limit


class ExecutableCache:
    """Keyed by (op, shapes, dtypes, static arguments) — or a cluster's fingerprint, or a graph's key.

    Recency is `Entry.last_read`, which a hit sets (the eager fast path in `eager.dispatch` reads `entries`
    directly and sets it too), so a hit costs no reordering; `entries` is never rebound."""

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        self.entries: dict[Hashable, Entry] = {}
        self.max_entries = max_entries or _limit("TORCH_TPU_EXECUTABLE_CACHE_ENTRIES", 2048)
        self.max_bytes = max_bytes or _limit("TORCH_TPU_EXECUTABLE_CACHE_BYTES", 1 << 30)
        self.nbytes = 0
        self.num_cache_reqs = 0
        self.num_cache_hits = 0
        self.num_inserts = 0
        self.num_evictions = 0

    def lookup(self, key: Hashable) -> Entry | None:
        self.num_cache_reqs += 1
        entry = self.entries.get(key)
        if entry is not None:
            self.num_cache_hits += 1
            entry.read_count += 1
            entry.last_read = time.time()
        return entry

    def insert(self, key: Hashable, entry: Entry) -> Entry:
        entry.read_count = 1
        entry.last_read = time.time()
        entry.nbytes = persistent.footprint(entry.executable) if entry.source != "eager" else 0
        old = self.entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        if len(self.entries) >= self.max_entries or self.nbytes + entry.nbytes > self.max_bytes:
            self._evict(entry.nbytes)
        self.entries[key] = entry
        self.nbytes += entry.nbytes
        self.num_inserts += 1
        return entry

    def refit(self, key: Hashable, entry: Entry) -> None:
        """`entry`'s executable has changed (a compile finished: `eager.warmup`): its size again, if still cached."""
        if self.entries.get(key) is entry:
            size = persistent.footprint(entry.executable)
            self.nbytes += size - entry.nbytes
            entry.nbytes = size

    def discard(self, key: Hashable, entry: Entry) -> None:
        """Drop `entry` if it is still the one cached under `key` (its compile failed: the next call tries again)."""
        if self.entries.get(key) is entry:
            del self.entries[key]
            self.nbytes -= entry.nbytes

    def _evict(self, incoming: int) -> None:
        """Drop the least recently read entries until `incoming` fits under both bounds with room to spare."""
        keep_entries = int(self.max_entries * _EVICT_TO)
        keep_bytes = int(self.max_bytes * _EVICT_TO) - incoming
        by_age = sorted(self.entries.items(), key=lambda item: item[1].last_read)
        for key, entry in by_age:
            if len(self.entries) < keep_entries and self.nbytes <= keep_bytes:
                break
            del self.entries[key]
            self.nbytes -= entry.nbytes
            self.num_evictions += 1

    def stats(self) -> dict[str, Any]:
        return {
            "persistent": persistent.stats.as_dict(),
            "num_cache_reqs": self.num_cache_reqs,
            "num_cache_hits": self.num_cache_hits,
            "num_entries": len(self.entries),
            "num_inserts": self.num_inserts,
            "num_evictions": self.num_evictions,
            "nbytes": self.nbytes,
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
            "per_entry_stats": [
                {
                    "name": e.name,
                    "read_count": e.read_count,
                    "compilation_duration": e.compilation_duration,
                    "last_read": e.last_read,
                    "source": e.source,
                    "nbytes": e.nbytes,
                    "donated": len(e.donated),
                    "temp_bytes": e.temp_bytes,
                }
                for e in self.entries.values()
            ],
        }

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0
        self.num_cache_reqs = 0
        self.num_cache_hits = 0


executables = ExecutableCache()
metrics.tally("in_process", lambda: {"requests": executables.num_cache_reqs, "hits": executables.num_cache_hits})
