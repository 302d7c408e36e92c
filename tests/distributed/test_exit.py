"""An orderly exit never aborts a peer, whatever its way out (as with NCCL or gloo), while a rank that dies mid-job
still ends it (test_faults.py).

Each launch: on a 2x2 DeviceMesh of 4 ranks, ranks 0 and 2 leave first, each by its own path, while ranks 1 and 3
work alone for a few seconds, run their first collective over their mesh column, and finish normally.
"""

from __future__ import annotations

import re

import launch
import pytest
import torch.distributed as dist

from torch_tpu.distributed import process_group, watchdog

_LAG_S = 5
_HARD_TIMEOUT_S = 90


def _times(output: str, pattern: str) -> float:
    found = re.search(pattern + r" at ([0-9.]+)", output)
    assert found, output[-3000:]
    return float(found.group(1))


# Two launches, every path: each launch's early leavers (ranks 0, 2) and late ones (ranks 1, 3).
@pytest.mark.parametrize(
    "paths",
    [("os._exit", "return", "os._exit", "os._exit"), ("sys.exit", "undestroyed", "handled", "return")],
    ids=["os._exit-first", "sys.exit-handled-first"],
)
def test_ranks_that_finish_first_never_abort_the_ranks_still_working(paths: tuple[str, ...]):
    env = {f"TPU_DIST_EXIT_PATH_{rank}": path for rank, path in enumerate(paths)}
    results = launch.launch(
        "workers_exit.finish_unevenly", nprocs=4, timeout=_HARD_TIMEOUT_S, env={**env, "TPU_DIST_EXIT_LAG": str(_LAG_S)}
    )
    report = "\n".join(f"--- rank {r.rank} exited {r.returncode} ---\n{r.output[-3000:]}" for r in results)
    launch.check(results)
    done = [_times(results[rank].output, f"exit: rank {rank} done") for rank in range(4)]
    assert min(done[1], done[3]) - max(done[0], done[2]) >= _LAG_S - 1, report  # 1 and 3 worked on alone
    for rank, result in enumerate(results):
        assert "Terminating process" not in result.output and "was lost" not in result.output, report
        assert f"exit: rank {rank} leaves by {paths[rank]}" in result.output, report
    assert "finished alone" in results[1].output and "finished alone" in results[3].output, report
    if paths[0] == "os._exit":  # no atexit handler: rank 0's destroy kept JAX's service until 1 and 3 were gone
        assert _times(results[0].output, "exit: rank 0 leaves by os._exit") > max(done[1], done[3]), report


# In-process checks of the leaving protocol (no sockets: a Watchdog whose peers' news is filled in by hand).


@pytest.fixture
def dog(monkeypatch: pytest.MonkeyPatch) -> watchdog.Watchdog:
    instance = watchdog.Watchdog(rank=0, world_size=4, timeout_s=10, job=2)
    monkeypatch.setattr(watchdog, "_watchdog", instance)
    return instance


def test_a_rank_that_left_a_job_deserts_that_jobs_collectives_only_until_it_joins_the_next(dog: watchdog.Watchdog):
    dog.peer_exited(1, {"0,1": 3}, job=2)
    assert dog.deserted((0, 1), 4) == ["rank 1 left the job after 3 collectives over these ranks"]
    assert dog.deserted((0, 1), 3) == [] and dog.deserted((0, 2), 1) == []
    dog.generation = 3  # this process has begun job 3: what rank 1 left in job 2 says nothing about it
    assert dog.deserted((0, 1), 4) == []
    dog.peer_joined(1, 3)
    assert 1 not in dog.exited  # its stream's end would now be a loss
    dog.peer_exited(2, {"0,2": 1})  # a goodbye at exit holds in every job
    assert dog.deserted((0, 2), 2) == ["rank 2 exited after 1 collectives over these ranks"]


def test_rank_0s_destroy_names_the_ranks_still_running_after_the_timeout(dog, monkeypatch: pytest.MonkeyPatch):
    dog.ended.add(1)  # rank 1's process has ended; rank 2 has begun job 3; rank 3 left job 2 but still runs
    dog.peer_joined(2, 3)
    dog.peer_exited(3, {}, job=2)
    monkeypatch.setattr(process_group, "_job_timeout_s", 0.2)
    monkeypatch.setattr(process_group, "_generation", 2)
    with pytest.raises(
        dist.DistBackendError, match=re.escape("rank 0 waited 0 s in destroy_process_group for ranks [3]")
    ):
        process_group._leave()
    assert process_group._job_timeout_s is None  # left all the same
    dog.ended.add(3)
    assert dog.wait_for_peers(2, timeout_s=10) == []
