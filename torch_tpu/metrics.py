"""What the backend did, counted: the questions users ask first about a slow or surprising run.

What compiled (eager per-op executables, Fused clusters, compiled graphs) and how long that took, what each cache
tier served, which ops fell back to CPU or were decomposed, what crossed between host and device, how ops fused
into clusters, and what the collectives moved (eager calls, and those inside compiled graphs, per run of the
graph). Each layer bumps these counters where it already does the work (a compile, a transfer, a cluster run, a
collective call or a graph's run), so counting adds nothing to an op served from the cache; the caches' own
counters are read through `tally`. `report()` is the text, `summary()` the same as a dict, `reset()` starts both
afresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

cpu_fallbacks: Counter[str] = Counter()
decompositions: Counter[str] = Counter()
# Executables made, by kind ("eager", "fused", "graph"), how ("compiled", "disk": loaded from the persistent tier,
# "traced": a data-dependent op run through JAX op by op), and the seconds they took: tracing, lowering, compiling or
# loading, and the first run.
compiles: Counter[tuple[str, str]] = Counter()
compile_seconds: Counter[str] = Counter()
transfers: Counter[str] = Counter()  # "host_to_device", "device_to_host": tensor copies
transfer_bytes: Counter[str] = Counter()
fused_clusters: Counter[int] = Counter()  # Fused-mode cluster runs, by the number of ops in the cluster
collectives: Counter[str] = Counter()  # c10d collective calls on tpu tensors, by op, and the bytes this rank sent
collective_bytes: Counter[str] = Counter()
# Collectives run inside compiled graphs (one SPMD program each): per run of a graph, each of its collectives, by
# functional op (all_reduce, all_gather_into_tensor, ...), and the bytes of its input on this rank.
graph_collectives: Counter[str] = Counter()
graph_collective_bytes: Counter[str] = Counter()

_COUNTERS = (
    cpu_fallbacks,
    decompositions,
    compiles,
    compile_seconds,
    transfers,
    transfer_bytes,
    fused_clusters,
    collectives,
    collective_bytes,
    graph_collectives,
    graph_collective_bytes,
)
_TIER_KEYS = (
    "hits",
    "misses",
    "writes",
    "discarded",
    "graph_hits",
    "graph_misses",
    "aot_autograd_hits",
    "aot_autograd_misses",
)
_tallies: dict[str, Callable[[], dict[str, int]]] = {}
_baselines: dict[str, dict[str, int]] = {}


def compiled(kind: str, how: str, seconds: float) -> None:
    """Count one executable made (called where it was just compiled or loaded)."""
    compiles[kind, how] += 1
    compile_seconds[kind] += seconds


def tally(name: str, read: Callable[[], dict[str, int]]) -> None:
    """Report `read()`'s cumulative counters (a cache's own) under `name`, counted from the last `reset()`."""
    _tallies[name] = read
    _baselines[name] = read()


def _tallied(name: str) -> dict[str, int]:
    now, base = _tallies[name](), _baselines.get(name, {})
    # a counter below its baseline was reset by its owner (a cache cleared): it counts from 0 again
    return {key: value - base.get(key, 0) if value >= base.get(key, 0) else value for key, value in now.items()}


def _memory() -> dict[str, int]:
    from torch_tpu.runtime.memory import memory

    return {"allocated_bytes": memory.allocated, "peak_allocated_bytes": memory.peak, "num_ooms": memory.num_ooms}


def summary() -> dict[str, Any]:
    """Every counter since the last `reset()`, as plain dicts (JSON-ready)."""
    kinds = sorted({kind for kind, _ in compiles} | set(compile_seconds))
    persistent = {**dict.fromkeys(_TIER_KEYS, 0), **(_tallied("persistent") if "persistent" in _tallies else {})}
    clusters = sum(fused_clusters.values())
    ops = sum(size * runs for size, runs in fused_clusters.items())
    return {
        "compiles": {
            kind: {
                **{how: count for (k, how), count in sorted(compiles.items()) if k == kind},
                "seconds": compile_seconds[kind],
            }
            for kind in kinds
        },
        "cache": {
            "in_process": _tallied("in_process") if "in_process" in _tallies else {},
            "persistent": {key: persistent[key] for key in ("hits", "misses", "writes", "discarded")},
            "warm_start": {
                key: persistent[key]
                for key in ("graph_hits", "graph_misses", "aot_autograd_hits", "aot_autograd_misses")
            },
        },
        "cpu_fallbacks": dict(cpu_fallbacks),
        "decompositions": dict(decompositions),
        "transfers": {
            direction: {"count": transfers[direction], "bytes": transfer_bytes[direction]}
            for direction in ("host_to_device", "device_to_host")
        },
        "fused_clusters": {
            "runs": clusters,
            "ops": ops,
            "mean_ops": ops / clusters if clusters else 0.0,
            "max_ops": max(fused_clusters, default=0),
            "by_size": dict(sorted(fused_clusters.items())),
        },
        "collectives": {op: {"count": collectives[op], "bytes": collective_bytes[op]} for op in sorted(collectives)},
        "graph_collectives": {
            op: {"count": graph_collectives[op], "bytes": graph_collective_bytes[op]}
            for op in sorted(graph_collectives)
        },
        "memory": _memory(),
    }


def _bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _top(counter: dict[str, int], limit: int = 10) -> str:
    shown = sorted(counter.items(), key=lambda item: (-item[1], item[0]))[:limit]
    more = f", ... {len(counter) - limit} more" if len(counter) > limit else ""
    return ", ".join(f"{name} x{count}" for name, count in shown) + more


def report() -> str:
    """`summary()` as text, one line per question."""
    data = summary()
    lines = ["torch_tpu metrics (since the last reset)"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<24}: {text}")

    for kind, made in data["compiles"].items():
        parts = ", ".join(f"{count} {how}" for how, count in made.items() if how != "seconds")
        row(f"compiles, {kind}", f"{parts} in {made['seconds']:.3f} s")
    if not data["compiles"]:
        row("compiles", "none")
    tier1, disk, warm = (data["cache"][tier] for tier in ("in_process", "persistent", "warm_start"))
    if tier1:
        row("in-process cache", f"{tier1['hits']} hits of {tier1['requests']} lookups")
    discarded = f", {disk['discarded']} discarded" if disk["discarded"] else ""
    row("persistent cache", f"{disk['hits']} hits, {disk['misses']} misses, {disk['writes']} writes{discarded}")
    row(
        "warm start",
        f"graph index {warm['graph_hits']} hits / {warm['graph_misses']} misses, "
        f"AOTAutograd {warm['aot_autograd_hits']} hits / {warm['aot_autograd_misses']} misses",
    )
    row("CPU fallbacks", _top(data["cpu_fallbacks"]) or "none")
    row("decompositions", _top(data["decompositions"]) or "none")
    for direction, moved in data["transfers"].items():
        row(direction.replace("_", " "), f"{moved['count']} copies, {_bytes(moved['bytes'])}")
    fused = data["fused_clusters"]
    if fused["runs"]:
        row(
            "fused clusters",
            f"{fused['runs']} runs of {fused['mean_ops']:.1f} ops on average (largest {fused['max_ops']})",
        )
    for op, moved in data["collectives"].items():
        row(f"collective {op}", f"{moved['count']} calls, {_bytes(moved['bytes'])} sent")
    for op, moved in data["graph_collectives"].items():
        row(f"in graphs {op}", f"{moved['count']} runs, {_bytes(moved['bytes'])} sent")
    memory = data["memory"]
    row(
        "tpu memory",
        f"{_bytes(memory['allocated_bytes'])} allocated, peak {_bytes(memory['peak_allocated_bytes'])}, "
        f"{memory['num_ooms']} out-of-memory errors",
    )
    return "\n".join(lines)


def reset() -> None:
    """Start every counter afresh (the caches' own counters are kept: counted from here)."""
    for counter in _COUNTERS:
        counter.clear()
    for name, read in _tallies.items():
        _baselines[name] = read()
