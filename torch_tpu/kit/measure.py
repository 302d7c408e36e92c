"""Timing that a reviewer can trust: completion (not return) times, warm-up until stable, percentiles.

Each timed call ends with `torch.accelerator.synchronize()`, because an async backend returns before the device
finishes. Warm-up is not a fixed count: windows of calls run until the medians of the last `windows` windows
agree within `tolerance`, so a slow compile or cache fill cannot leak into the "steady state" numbers. If that
never happens within `max_warmup` calls the result says `stable: False` rather than pretending.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(medians: list[float], windows: int) -> float | None:
    """The relative spread (max - min) / median of the last `windows` window medians; None before there are
    that many or when their median is zero."""
    if len(medians) < windows:
        return None
    tail = medians[-windows:]
    centre = statistics.median(tail)
    return (max(tail) - min(tail)) / centre if centre > 0 else None


def is_stable(medians: list[float], windows: int, tolerance: float) -> bool:
    """True when the last `windows` window medians spread by at most `tolerance` of their median."""
    found = spread(medians, windows)
    return found is not None and found <= tolerance


@dataclasses.dataclass
class Timing:
    first_call_seconds: float
    warmup_calls: int
    stable: bool
    latencies: list[float]
    batch_size: int
    warmup_spread: float | None = None
    tolerance: float = 0.15

    def summary(self) -> dict[str, Any]:
        total = sum(self.latencies)
        return {
            "first_call_seconds": self.first_call_seconds,
            "warmup_calls": self.warmup_calls,
            "stable": self.stable,
            "warmup_spread": self.warmup_spread,
            "stability_tolerance": self.tolerance,
            "iterations": len(self.latencies),
            "mean_batch_seconds": total / len(self.latencies),
            "p50_ms": percentile(self.latencies, 50) * 1e3,
            "p90_ms": percentile(self.latencies, 90) * 1e3,
            "p99_ms": percentile(self.latencies, 99) * 1e3,
            "samples_per_second": len(self.latencies) * self.batch_size / total if total > 0 else 0.0,
            "latencies_ms": [t * 1e3 for t in self.latencies],
        }


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    torch.accelerator.synchronize()
    return time.perf_counter() - start


def measure(
    call: Callable[[], Any],
    batch_size: int,
    iterations: int = 50,
    window: int = 5,
    windows: int = 3,
    tolerance: float = 0.15,
    max_warmup: int = 200,
    progress: Progress | None = None,
) -> Timing:
    """First call, warm-up until stable (bounded), then `iterations` timed calls."""
    torch.accelerator.synchronize()
    first = _timed(call)
    medians: list[float] = []
    warmup = 0
    while warmup < max_warmup and not is_stable(medians, windows, tolerance):
        medians.append(statistics.median(_timed(call) for _ in range(window)))
        warmup += window
        if progress:
            progress.advance(0, extra=f"warm-up {warmup}")
    stable = is_stable(medians, windows, tolerance)
    latencies = []
    for _ in range(iterations):
        latencies.append(_timed(call))
        if progress:
            progress.advance(1)
    return Timing(first, warmup, stable, latencies, batch_size, spread(medians, windows), tolerance)


class Progress:
    """A dependency-free progress bar on stderr (only drawn when stderr is a terminal or forced)."""

    def __init__(self, label: str, total: int, enabled: bool | None = None) -> None:
        self.label, self.total, self.done = label, max(total, 1), 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.perf_counter()

    def advance(self, n: int = 1, extra: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if self.enabled:
            filled = int(30 * self.done / self.total)
            elapsed = time.perf_counter() - self.start
            sys.stderr.write(
                f"\r{self.label:<28} [{'#' * filled}{'.' * (30 - filled)}] "
                f"{self.done}/{self.total} {elapsed:6.1f}s {extra:<16}"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
