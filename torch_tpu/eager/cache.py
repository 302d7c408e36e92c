"""The executable cache shared by eager per-op executables (and, later, compiled graphs)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable
from typing import Any


@dataclasses.dataclass
class Entry:
    """One cached executable and the facts `torch.tpu._get_cache_stats()` reports about it."""

    name: str
    executable: Callable
    meta: Any
    compilation_duration: float = 0.0
    source: str = "compiled"  # "compiled" now, loaded from "disk", or run op by op ("eager")
    read_count: int = 0
    last_read: float = 0.0
    layout: Any = None  # a single tensor output's storage layout (`storage.layout`), for the eager fast path


class ExecutableCache:
    """Tier 1: in-process, keyed by (op, shapes, dtypes, static arguments)."""

    def __init__(self) -> None:
        self.entries: dict[Hashable, Entry] = {}
        self.num_cache_reqs = 0
        self.num_cache_hits = 0

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
        self.entries[key] = entry
        return entry

    def stats(self) -> dict[str, Any]:
        from torch_tpu.compile import cache as persistent

        return {
            "persistent": persistent.stats.as_dict(),
            "num_cache_reqs": self.num_cache_reqs,
            "num_cache_hits": self.num_cache_hits,
            "num_entries": len(self.entries),
            "per_entry_stats": [
                {
                    "name": e.name,
                    "read_count": e.read_count,
                    "compilation_duration": e.compilation_duration,
                    "last_read": e.last_read,
                    "source": e.source,
                }
                for e in self.entries.values()
            ],
        }

    def clear(self) -> None:
        self.entries.clear()
        self.num_cache_reqs = 0
        self.num_cache_hits = 0


executables = ExecutableCache()
