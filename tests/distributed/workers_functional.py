"""What each rank runs in tests/distributed/test_functional.py (launched by `launch.py`); every check raises on
failure. Every rank knows every rank's input (`workers._input`), so each result is compared with the same
computation done locally on CPU PyTorch, bit for bit (the collectives' arithmetic is exact for two ranks)."""

from __future__ import annotations

import os
import re

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from workers import _TIMEOUT, _equal, _input

from torch_tpu import metrics

_COLLECTIVES_HLO = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all")


def _graph_entries(name: str) -> int:
    """How many executables of compiled graphs named `name` the cache holds."""
    stats = torch.tpu._get_cache_stats()["per_entry_stats"]
    return sum(entry["name"].startswith(f"{name}:") for entry in stats)


def _step(x: torch.Tensor, group: dist.ProcessGroup) -> tuple[torch.Tensor, ...]:
    """Every functional collective, chained, with ordinary ops between them."""
    summed = funcol.all_reduce(x * 2, "sum", group)
    biggest = funcol.all_reduce(x, "max", group)
    mean = funcol.all_reduce(x, "avg", group)
    gathered = funcol.all_gather_tensor(summed + 1, 0, group)
    scattered = funcol.reduce_scatter_tensor(gathered * x[0, 0], "sum", 0, group)
    smallest = funcol.reduce_scatter_tensor(gathered, "min", 0, group)
    exchanged = funcol.all_to_all_single(gathered, None, None, group)
    from_last = funcol.broadcast(torch.sin(x), dist.get_world_size(group) - 1, group)
    return summed, biggest, mean, gathered, scattered, smallest, exchanged, from_last


def _expected_step(rank: int, world: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """`_step` computed locally from every rank's known input."""
    xs = [_input(r, shape, torch.float64) for r in range(world)]
    summed = sum(x * 2 for x in xs[1:]) + xs[0] * 2 if world > 1 else xs[0] * 2
    biggest = torch.stack(xs).amax(0)
    mean = sum(xs[1:], xs[0]) / world
    gathered = torch.cat([summed + 1] * world)
    rows = shape[0]
    blocks = [(gathered * x[0, 0])[rank * rows : (rank + 1) * rows] for x in xs]
    scattered = sum(blocks[1:], blocks[0])
    smallest = gathered[rank * rows : (rank + 1) * rows]
    exchanged = torch.cat([gathered[rank * rows : (rank + 1) * rows]] * world)
    from_last = torch.sin(xs[world - 1])
    return summed, biggest, mean, gathered, scattered, smallest, exchanged, from_last


_NAMES = (
    "all_reduce sum",
    "all_reduce max",
    "all_reduce avg",
    "all_gather",
    "reduce_scatter sum",
    "reduce_scatter min",
    "all_to_all_single",
    "broadcast",
)


def _compiled_checks(rank: int, world: int) -> None:
    """One compiled graph holding every functional collective: one XLA program with the collectives in its HLO,
    equal to the local computation, no graph break, no recompile over later steps."""
    texts: list[str] = []
    group = dist.group.WORLD
    step = torch.compile(
        _step, backend="tpu", fullgraph=True, options={"name": "funcol", "debug_callback": lambda _, t: texts.append(t)}
    )
    shape = (2, 3)
    x = _input(rank, shape, torch.float64)
    metrics.reset()
    runs = 3
    for turn in range(runs):
        results = step(x.to("tpu"), group)
        for name, got, expected in zip(_NAMES, results, _expected_step(rank, world, shape), strict=True):
            _equal(got, expected, f"compiled {name} (call {turn})")
    # `_step`'s collectives and their inputs' bytes (x: 2x3 float64; gathered: world times as many rows), per run
    block, gathered = x.nbytes, x.nbytes * world
    per_run = {
        "all_reduce": (3, 3 * block),
        "all_gather_into_tensor": (1, block),
        "reduce_scatter_tensor": (2, 2 * gathered),
        "all_to_all_single": (1, gathered),
        "broadcast": (1, block),
    }
    counted = metrics.summary()
    expected_counts = {op: {"count": n * runs, "bytes": sent * runs} for op, (n, sent) in per_run.items()}
    assert counted["graph_collectives"] == expected_counts, counted["graph_collectives"]
    assert counted["collectives"] == {}, counted["collectives"]  # none of them ran as an eager c10d call
    assert "in graphs all_reduce" in metrics.report() and f"{3 * runs} runs" in metrics.report()
    assert len(texts) == 1, f"{len(texts)} programs lowered for one graph"
    missing = [op for op in _COLLECTIVES_HLO if op not in texts[0]]
    assert not missing, f"the compiled graph's HLO lacks {missing}"
    assert _graph_entries("funcol") == 1, torch.tpu._get_cache_stats()["per_entry_stats"]


def _pending(tensor: torch.Tensor) -> bool:
    from torch_tpu.runtime import deferred, storage

    if isinstance(tensor, funcol.AsyncCollectiveTensor):  # what eager functional collectives return
        tensor = tensor.elem
    return deferred.is_pending(storage.buffer_of(tensor)._array)


def _fused_clusters() -> int:
    stats = torch.tpu._get_cache_stats()["per_entry_stats"]
    return sum(entry["name"].startswith("fused cluster") for entry in stats)


def _eager_checks(rank: int, world: int) -> None:
    """The same functional collectives in eager: Strict, Fused (each collective ends the cluster), and Fused
    under `spmd_safe` (the collectives recorded into one cluster with the ops around them)."""
    group, shape = dist.group.WORLD, (2, 3)
    x = _input(rank, shape, torch.float64)
    expected = _expected_step(rank, world, shape)
    for name, got, want in zip(_NAMES, _step(x.to("tpu"), group), expected, strict=True):
        _equal(got, want, f"eager {name}")
    # uneven splits and coalesced collectives (eager runs torch's own kernels: a clone and the c10d collective)
    splits = [[(r + j) % 3 + 1 for j in range(world)] for r in range(world)]
    values = [_input(r, (sum(splits[r]), 2), torch.int64) for r in range(world)]
    outs = [splits[j][rank] for j in range(world)]
    got = funcol.all_to_all_single(values[rank].to("tpu"), outs, splits[rank], group)
    _equal(got, torch.cat([values[j].split(splits[j])[rank] for j in range(world)]), "eager uneven all_to_all_single")
    pair = (
        [_input(10 + r, (3,), torch.float32) for r in range(world)],
        [_input(20 + r, (2, 2), torch.int32) for r in range(world)],
    )
    got = funcol.all_reduce_coalesced([pair[0][rank].to("tpu"), pair[1][rank].to("tpu")], "sum", group)
    for tensor, inputs in zip(got, pair, strict=True):
        _equal(tensor, sum(inputs[1:], inputs[0]), "eager all_reduce_coalesced")

    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        results = _step(x.to("tpu"), group)
        for name, got, want in zip(_NAMES, results, expected, strict=True):
            _equal(got, want, f"fused {name}")
        doubled = x.to("tpu") * 2
        assert _pending(doubled), "an op was not recorded in Fused mode"
        summed = funcol.all_reduce(doubled, "sum", group)
        assert not _pending(doubled) and not _pending(summed), "a collective did not end the cluster"
        _equal(summed, expected[0], "fused all_reduce of a recorded value")
        doubled = x.to("tpu") * 2
        summed = torch.tpu.distributed.spmd_safe(funcol.all_reduce)(doubled, "sum", group)
        assert _pending(doubled) and _pending(summed), "spmd_safe: the collective was not recorded into the cluster"
        _equal(summed, expected[0], "fused spmd_safe all_reduce of a recorded value")

        safe_step = torch.tpu.distributed.spmd_safe(_step)
        # a second cluster over the same group, with a 0-d output, run between: each keeps its own outputs
        total = torch.tpu.distributed.spmd_safe(lambda t: funcol.all_reduce(t.sum(), "sum", group))
        counts = [_input(r, (5,), torch.int64) for r in range(world)]
        for turn in range(3):
            before = _fused_clusters()
            results = safe_step(x.to("tpu"), group)
            for name, got, want in zip(_NAMES, results, expected, strict=True):
                _equal(got, want, f"fused spmd_safe {name} (call {turn})")
            made = _fused_clusters() - before
            assert made == (1 if turn == 0 else 0), f"call {turn}: {made} new clusters, expected one cluster once"
            _equal(total(counts[rank].to("tpu")), sum(c.sum() for c in counts), f"fused spmd_safe 0-d (call {turn})")


def _group_checks(rank: int, world: int) -> None:
    """Graphs over a new group of every rank (another name, the same ranks: the same mesh), and over a one-rank
    group (no SPMD program: its collectives are the identity), compiled in every rank's process."""
    x = _input(rank, (4,), torch.float32)
    xs = [_input(r, (4,), torch.float32) for r in range(world)]
    everyone = dist.new_group(list(range(world)))
    fn = torch.compile(lambda t: funcol.all_reduce(t, "sum", everyone) + 1, backend="tpu", fullgraph=True)
    _equal(fn(x.to("tpu")), sum(xs[1:], xs[0]) + 1, "compiled all_reduce over a new group")
    alone = [dist.new_group([r]) for r in range(world)][rank]
    fn = torch.compile(
        lambda t: funcol.all_gather_tensor(funcol.all_reduce(t, "max", alone), 0, alone) * 2,
        backend="tpu",
        fullgraph=True,
    )
    _equal(fn(x.to("tpu")), x * 2, "compiled collectives over a one-rank group")


def _reused_name_checks(rank: int, world: int) -> None:
    """After `destroy_process_group()` and a new job, group names start again: the first new group is called
    what `_group_checks`' group of every rank was, and is now this rank's group of one (the ranks resolve anew)."""
    from torch_tpu.distributed import functional

    alone = [dist.new_group([r]) for r in range(world)][rank]
    assert functional.group_ranks(alone.group_name) == (rank,), (alone.group_name, functional.group_ranks)
    x = _input(rank, (4,), torch.float32)
    fn = torch.compile(lambda t: funcol.all_reduce(t, "sum", alone) * 3, backend="tpu", fullgraph=True)
    _equal(fn(x.to("tpu")), x * 3, "compiled all_reduce over a group of one under a reused name")


def functional() -> None:
    """Every check of this module that expects no error, in one launch. The second job starts while the first
    one's compiled graphs still hold its groups (their gloo contexts alive, listening): its rendezvous must not
    meet them."""
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    _compiled_checks(rank, world)
    _group_checks(rank, world)
    _eager_checks(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    _reused_name_checks(rank, world)
    dist.barrier()
    print("functional checks passed", os.environ["RANK"], flush=True)
    dist.destroy_process_group()


def _handshake_checks(rank: int) -> None:
    """Rank 1 compiles a graph with one more collective: every rank raises before running it, naming both sides'
    fingerprints and collective counts; a graph they agree on runs afterwards."""
    from torch_tpu.distributed.spmd import MismatchError

    def differs(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x, "sum", dist.group.WORLD)
        if rank == 1:
            y = funcol.all_reduce(y * 3, "max", dist.group.WORLD)
        return y + 1

    compiled_fn = torch.compile(differs, backend="tpu", fullgraph=True, options={"name": "differs"})
    try:
        compiled_fn(torch.ones(4, device="tpu"))
    except MismatchError as error:
        message = str(error)
    else:
        raise AssertionError("ranks compiled different graphs and no handshake error was raised")
    fingerprints = re.findall(r"fingerprint ([0-9a-f]{16})", message)
    assert len(set(fingerprints)) == 2, message
    assert "1 collectives" in message and "2 collectives" in message, message
    assert "all_reduce(float32[4], max)" in message and "graph 'differs:inference'" in message, message
    print("mismatch fingerprints", *sorted(fingerprints), flush=True)
    agreed = torch.compile(lambda x: funcol.all_reduce(x, "sum", dist.group.WORLD) * 2, backend="tpu")
    _equal(agreed(torch.ones(3, device="tpu")), torch.full((3,), 4.0), "a graph compiled after a mismatch")


def _fused_handshake_checks(rank: int) -> None:
    """Under spmd_safe, rank 1 records one more op into its cluster: both ranks raise when the cluster runs."""
    from torch_tpu.distributed.spmd import MismatchError

    @torch.tpu.distributed.spmd_safe
    def differs(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
        return y * 3 if rank == 1 else y

    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        try:
            differs(torch.ones(5, device="tpu")).cpu()
        except MismatchError as error:
            message = str(error)
        else:
            raise AssertionError("ranks recorded different clusters and no handshake error was raised")
    assert len(set(re.findall(r"fingerprint ([0-9a-f]{16})", message))) == 2, message
    assert "a fused cluster" in message and "stablehlo.all_reduce x1" in message, message


def _uneven_checks(rank: int) -> None:
    """A compiled uneven all_to_all_single (each rank its own splits, so its own graph) is a clear error on every
    rank before the handshake, which would otherwise report two fingerprints."""
    splits = [[1, 3], [2, 2]][rank]
    outputs = [[1, 2], [3, 2]][rank]
    fn = torch.compile(lambda t: funcol.all_to_all_single(t, outputs, splits, dist.group.WORLD), backend="tpu")
    try:
        fn(torch.ones(4, 2, device="tpu"))
    except Exception as error:  # Dynamo wraps the backend's error
        assert "only even splits over 2 ranks are supported" in str(error), error
        assert f"input splits {splits} and output splits {outputs}" in str(error), error
    else:
        raise AssertionError("a compiled uneven all_to_all_single did not raise")


def handshake() -> None:
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    _uneven_checks(dist.get_rank())
    _handshake_checks(dist.get_rank())
    _fused_handshake_checks(dist.get_rank())
    dist.barrier()
    dist.destroy_process_group()


def subgroups() -> None:
    """4 ranks in two pairs: each pair's compiled graph runs over its own mesh (groups resolve to their ranks);
    a graph with collectives over two different groups is a clear error."""
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    mine = pairs[rank // 2]
    step = torch.compile(
        lambda t: funcol.all_gather_tensor(funcol.all_reduce(t, "sum", mine) * 2, 0, mine),
        backend="tpu",
        fullgraph=True,
    )
    low, high = (_input(r, (3,), torch.float64) for r in (rank & ~1, rank | 1))
    for turn in range(2):
        _equal(step(_input(rank, (3,), torch.float64).to("tpu")), torch.cat([(low + high) * 2] * 2), f"pair {turn}")
    mixed = torch.compile(
        lambda t: funcol.all_reduce(t, "sum", mine) + funcol.all_reduce(t, "sum", dist.group.WORLD),
        backend="tpu",
        fullgraph=True,
    )
    try:
        mixed(torch.ones(2, device="tpu"))
    except Exception as error:  # Dynamo wraps the backend's error
        assert "not the dimensions of one DeviceMesh" in str(error), error
    else:
        raise AssertionError("a graph over two groups did not raise")
    dist.barrier()
    dist.destroy_process_group()


def persisted() -> None:
    """A compiled graph with collectives and a Fused spmd_safe cluster; prints where each executable came from
    (the test runs this twice over one persistent cache: the second job loads both from disk)."""
    from torch_tpu.runtime import persistent

    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    xs = [_input(r, (2, 3), torch.float64) for r in range(world)]
    step = torch.compile(
        lambda t: funcol.all_gather_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD) * 2, 0, dist.group.WORLD),
        backend="tpu",
        fullgraph=True,
        options={"name": "persisted"},
    )
    _equal(step(xs[rank].to("tpu")), torch.cat([sum(xs[1:], xs[0]) * 2] * world), "compiled graph")
    (graph,) = [
        e["source"] for e in torch.tpu._get_cache_stats()["per_entry_stats"] if e["name"].startswith("persisted:")
    ]
    x = xs[rank].to("tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        total = torch.tpu.distributed.spmd_safe(lambda t: funcol.all_reduce(t * 3, "max", dist.group.WORLD))
        hits, misses = persistent.stats.hits, persistent.stats.misses
        result = total(x).cpu()
        loaded = persistent.stats.hits > hits and persistent.stats.misses == misses
    _equal(result, torch.stack(xs).amax(0) * 3, "fused cluster")
    print(f"spmd graph {graph} cluster {'disk' if loaded else 'compiled'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
