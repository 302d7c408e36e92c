"""Prometheus metrics for the kit: `torch-tpu serve`'s /metrics and `torch-tpu evaluate --metrics-port`.

Two sources, read at scrape time so that nothing is copied on the hot path:

- the runtime's public counters (`torch.tpu._get_cache_stats()`, `torch_tpu.metrics`, `torch.tpu.memory_allocated`):
  compiles, cache hits and misses per tier, CPU fallbacks, device memory;
- `run`, a plain-Python record of a training run's progress (step time, throughput, loss, last checkpoint,
  quality against the contract) that the kit's training loop updates with `progress`/`checkpoint`/`quality`.
  It imports nothing, so the loop pays a few attribute writes per step and runs without prometheus_client.

Ages are exported both as timestamps (`*_timestamp_seconds`, what Prometheus alert rules compare with `time()`) and
as `torch_tpu_seconds_since_last_*` (computed at scrape, what a dashboard shows). Each registry is its own
`CollectorRegistry`, so servers and tests in one process never collide on the global one.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# The cache tiers of `torch.tpu._get_cache_stats()`: (tier label, hits key, misses key) in its "persistent" dict;
# tier 1 (in-process) is computed from num_cache_reqs and num_cache_hits.
_DISK_TIERS = (
    ("disk", "hits", "misses"),
    ("graph_index", "graph_hits", "graph_misses"),
    ("aot_autograd", "aot_autograd_hits", "aot_autograd_misses"),
)


@dataclasses.dataclass
class RunState:
    """A training run's progress as the kit's loop reports it; read by the collector at scrape time."""

    steps: int = 0
    samples: int = 0
    step_seconds: float = 0.0  # the last step's wall time
    step_seconds_total: float = 0.0
    samples_per_second: float = 0.0  # the last step's throughput
    loss: float = float("nan")
    started: float = dataclasses.field(default_factory=time.time)
    last_progress: float | None = None
    last_checkpoint: float | None = None
    checkpoints: int = 0
    quality: float | None = None
    quality_target: float | None = None
    meets_contract: bool | None = None


run = RunState()
_lock = threading.Lock()


def progress(step_seconds: float, samples: int, loss: float) -> None:
    """One finished training step: its wall time, the samples it consumed and its loss."""
    with _lock:
        run.steps += 1
        run.samples += samples
        run.step_seconds = step_seconds
        run.step_seconds_total += step_seconds
        run.samples_per_second = samples / step_seconds if step_seconds > 0 else 0.0
        run.loss = loss
        run.last_progress = time.time()


def checkpoint() -> None:
    """A checkpoint was written."""
    with _lock:
        run.checkpoints += 1
        run.last_checkpoint = time.time()


def quality(value: float | None, target: float, meets_contract: bool) -> None:
    """The quality metric measured at the end of training, and whether it meets the workload's contract."""
    with _lock:
        run.quality, run.quality_target, run.meets_contract = value, target, meets_contract


def reset() -> None:
    """Forget the recorded run (a new run in the same process, or a test)."""
    global run
    with _lock:
        run = RunState()


def runtime_values() -> dict[str, Any]:
    """The runtime's counters this module exports, from public stats only (no torch_tpu internals)."""
    import torch

    from torch_tpu import metrics as backend_metrics

    stats = torch.tpu._get_cache_stats()
    persistent = stats["persistent"]
    tiers = {"memory": (stats["num_cache_hits"], stats["num_cache_reqs"] - stats["num_cache_hits"])}
    tiers.update({tier: (persistent[h], persistent[m]) for tier, h, m in _DISK_TIERS})
    dynamo = sys.modules.get("torch._dynamo.utils")
    return {
        "tiers": tiers,
        # The XLA programs this process compiled: misses of the persistent tier, each one a compile; with the
        # tier off there is no such count, and every new in-process executable is one (an upper bound).
        "compiles": persistent["misses"] if persistent["enabled"] else stats["num_inserts"],
        "executables": stats["num_inserts"],
        "graphs": int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0,
        "cpu_fallbacks": dict(backend_metrics.cpu_fallbacks),
        "memory_allocated": torch.tpu.memory_allocated(),
        "max_memory_allocated": torch.tpu.max_memory_allocated(),
    }


class RuntimeCollector:
    """Compiles, cache hits/misses per tier, CPU fallbacks and device memory, read at each scrape."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        values = runtime_values()
        hits = CounterMetricFamily("torch_tpu_cache_hits", "Executable cache hits, per tier", labels=["tier"])
        misses = CounterMetricFamily("torch_tpu_cache_misses", "Executable cache misses, per tier", labels=["tier"])
        for tier, (hit, miss) in values["tiers"].items():
            hits.add_metric([tier], hit)
            misses.add_metric([tier], miss)
        yield hits
        yield misses
        yield CounterMetricFamily(
            "torch_tpu_compiles", "XLA programs compiled by this process (persistent-tier misses)", values["compiles"]
        )
        yield CounterMetricFamily(
            "torch_tpu_executables_created", "Executables added to the in-process cache", values["executables"]
        )
        yield CounterMetricFamily("torch_tpu_graphs_compiled", "torch.compile graphs traced", values["graphs"])
        fallbacks = CounterMetricFamily("torch_tpu_cpu_fallbacks", "Ops that ran on CPU instead of tpu", labels=["op"])
        for op, count in sorted(values["cpu_fallbacks"].items()):
            fallbacks.add_metric([op], count)
        yield fallbacks
        yield GaugeMetricFamily(
            "torch_tpu_device_memory_allocated_bytes", "torch.tpu.memory_allocated()", values["memory_allocated"]
        )
        yield GaugeMetricFamily(
            "torch_tpu_device_memory_peak_bytes", "torch.tpu.max_memory_allocated()", values["max_memory_allocated"]
        )


class RunCollector:
    """A training run's progress (`run`): steps, step time, throughput, loss, checkpoint and progress ages."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with _lock:
            state = dataclasses.replace(run)
        now = time.time()
        yield CounterMetricFamily("torch_tpu_train_steps", "Training steps finished", state.steps)
        yield CounterMetricFamily("torch_tpu_train_samples", "Training samples consumed", state.samples)
        yield CounterMetricFamily(
            "torch_tpu_train_step_seconds", "Wall time spent in training steps", state.step_seconds_total
        )
        yield GaugeMetricFamily("torch_tpu_train_last_step_seconds", "The last step's wall time", state.step_seconds)
        yield GaugeMetricFamily(
            "torch_tpu_train_samples_per_second", "The last step's throughput", state.samples_per_second
        )
        yield GaugeMetricFamily("torch_tpu_train_loss", "The last step's loss", state.loss)
        yield CounterMetricFamily("torch_tpu_checkpoints", "Checkpoints written", state.checkpoints)
        # Before the first event, the age counts from the start of the run: a run that never progresses alerts.
        for name, stamp, what in (
            ("progress", state.last_progress, "a finished training step"),
            ("checkpoint", state.last_checkpoint, "a written checkpoint"),
        ):
            yield GaugeMetricFamily(
                f"torch_tpu_last_{name}_timestamp_seconds",
                f"Unix time of {what} (the run's start before the first)",
                stamp if stamp is not None else state.started,
            )
            yield GaugeMetricFamily(
                f"torch_tpu_seconds_since_last_{name}",
                f"Seconds since {what} (since the run's start before the first)",
                now - (stamp if stamp is not None else state.started),
            )
        if state.quality is not None and state.quality_target is not None:
            yield GaugeMetricFamily("torch_tpu_quality", "Quality metric at the end of training", state.quality)
            yield GaugeMetricFamily("torch_tpu_quality_target", "The workload's quality contract", state.quality_target)
        if state.meets_contract is not None:
            yield GaugeMetricFamily(
                "torch_tpu_quality_meets_contract", "1 when the quality meets the contract", int(state.meets_contract)
            )


def registry(training: bool = True) -> Any:
    """A fresh CollectorRegistry with the runtime's counters, the process's CPU and memory, and (`training`) the
    run's progress."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    result = CollectorRegistry()
    result.register(RuntimeCollector())
    ProcessCollector(registry=result)
    if training:
        result.register(RunCollector())
    return result


def serve_http(port: int, host: str = "0.0.0.0", registry_: Any = None) -> Any:
    """Serve `registry_` (default: a training registry) on http://host:port/metrics from a daemon thread; returns
    the HTTP server, whose `shutdown()` stops it."""
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=host, registry=registry_ if registry_ is not None else registry())
    return server
