"""Launch a worker of `tests/distributed/workers.py` in N processes on loopback, under a hard timeout.

Each rank is a fresh Python process (torch's env:// rendezvous: MASTER_ADDR/PORT, RANK, WORLD_SIZE) in a
session of its own, so that on timeout the whole process group it started is killed by its PID and nothing
outlives the test. The port is chosen free at run time; the persistent compile cache is a private directory.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping

import pytest
import run_shared
import torch

from torch_tpu.distributed import launch_env
from torch_tpu.runtime import compat

HERE = pathlib.Path(__file__).resolve().parent
# FSDP2 frees and regrows unsharded parameters with UntypedStorage.resize_, which a tpu storage supports from
# torch 2.12 (docs/compatibility.md).
needs_storage_resize = pytest.mark.skipif(
    not compat.STORAGE_SWAPS_DATA_POINTER, reason=f"torch {torch.__version__}: no tpu storage resize, so no FSDP2"
)
ROOT = HERE.parents[1]
# Tests that read a shared launch (`shared`). The conftest starts the launches in a thread at the session's start
# and runs these tests last: meanwhile the tests that launch their own processes run (the fault drills mostly
# wait for a timeout), so the suite takes the longer of the two, not their sum.
in_shared_launch = pytest.mark.shared_launch  # `in_shared_launch(4)`: a test whose world size is not a parameter


def shared_world_size(item: pytest.Item) -> int | None:
    """The world size whose shared launch `item` reads (its `nprocs` parameter, else its mark's), None if none:
    1 process is never a shared launch."""
    mark = item.get_closest_marker("shared_launch")
    if mark is None:
        return None
    params = getattr(item, "callspec", None)
    nprocs = params.params.get("nprocs") if params is not None else None
    nprocs = nprocs or (mark.args[0] if mark.args else 2)
    return nprocs if nprocs in SHARED else None


@dataclasses.dataclass
class Rank:
    rank: int
    returncode: int | None
    output: str


def free_port() -> int:
    return launch_env.free_port()


def _distinct_ports(count: int) -> list[int]:
    """`count` different free ports below the ephemeral range (`launch_env.free_port`)."""
    ports: list[int] = []
    while len(ports) < count:
        port = launch_env.free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the session this launch started, by its leader's PID
    except ProcessLookupError:
        pass
    process.wait()


def _call(worker: str) -> str:
    """Python source that runs `worker`: a function of workers.py, or `module.function` of another worker module."""
    module, _, function = worker.rpartition(".")
    module = module or "workers"
    return f"import {module}; {module}.{function}()"


def launch(worker: str, nprocs: int = 2, timeout: float = 150, env: dict[str, str] | None = None) -> list[Rank]:
    """Run `worker` (see `_call`) on `nprocs` ranks; every rank's exit status and output (None: killed at timeout)."""
    return _ranks(["-c", _call(worker)], nprocs, timeout, env)


def _ranks(
    arguments: list[str],
    nprocs: int,
    timeout: float,
    env: dict[str, str] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> list[Rank]:
    """`python ARGUMENTS` on `nprocs` ranks of one job on loopback, in `environ` updated by `env`."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as scratch:
        base = {
            **environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
            "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(scratch, "cache"),
            "TPU_DIST_SCRATCH": scratch,
            **(env or {}),
        }
        processes, logs = [], []
        for rank in range(nprocs):
            log = open(os.path.join(scratch, f"rank{rank}.log"), "w+")  # closed below
            environment = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            command = [sys.executable, *arguments]
            process = subprocess.Popen(
                command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
            processes.append(process)
            logs.append(log)
            with _SHARED_LOCK:
                _LIVE.add(process)
                if _STOPPED.is_set():  # the session ended while this launch began
                    _kill(process)
        try:
            return _collect(processes, logs, timeout)
        finally:
            with _SHARED_LOCK:
                _LIVE.difference_update(processes)


# Workers that need nothing but the default environment share one launch per world size, in the order given:
# `run_shared.py` runs them in turn in the same processes, each with its own process group. A fresh rank costs ~3 s
# of CPU before its first collective (importing torch, torch_tpu and JAX) and compiles again every program the last
# launch compiled; paid per worker, that was half of the suite's time. Each worker's seconds bound it alone.
# `workers_parallel.two_ranks` is first: it checks that no tensor exists before its mesh.
SHARED: dict[int, dict[str, float]] = {
    2: {
        "workers_parallel.two_ranks": 480,
        "regroup": 90,
        "collectives": 150,
        "ddp": 150,
        "workers_c10d.run": 150,
        "workers_data_path.exact": 150,
        "workers_dim_collectives.dim_collectives": 100,
        "workers_functional.functional": 90,
        "workers_kernels.mesh_ops": 150,
        "workers_pipelining.pipelining": 150,
        "workers_ddp.train": 240,
        "workers_profiler.ranks": 120,
        **(
            {"workers_compiled_parallel.compiled_parallel": 150, "workers_fsdp.two_ranks": 420}
            if compat.STORAGE_SWAPS_DATA_POINTER  # both train FSDP2 (`needs_storage_resize`)
            else {}
        ),
        "workers_data_path.mismatches": 150,
        "workers_functional.handshake": 90,
    },
    4: {
        "workers_parallel.four_ranks": 400,
        "workers_data_path.exact": 150,
        "workers_ddp.train_four": 240,
        "workers_functional.subgroups": 120,
        "workers_kernels.submeshes": 120,
        "workers_compiled_parallel.mesh_2d": 240,
        **({"workers_fsdp.four_ranks": 420} if compat.STORAGE_SWAPS_DATA_POINTER else {}),
        "workers_data_path.mismatches": 150,
    },
}


def shared(worker: str, nprocs: int = 2) -> list[Rank]:
    """`worker`'s part of its world size's shared launch (`SHARED`): each rank's output between the worker's
    markers, with 0 if it returned, 1 if it raised, else the status the process ended with there (None: killed)."""
    assert worker in SHARED[nprocs], f"{worker} is not among SHARED[{nprocs}]"
    return [Rank(rank.rank, *_section(rank, worker)) for rank in _shared_launch_future(nprocs).result()]


# One launch at a time (each already keeps the 2 cores busy), each world size's once per pytest process.
_SESSION_ENVIRON = dict(os.environ)
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared_launch")
_SHARED_LAUNCHES: dict[int, concurrent.futures.Future] = {}
_SHARED_LOCK = threading.Lock()
_LIVE: set[subprocess.Popen] = set()  # every rank of a launch still running, for `stop_shared_launches`
_STOPPED = threading.Event()  # set by `stop_shared_launches`: a launch beginning after it is killed at once


def start_shared_launches(sizes: set[int]) -> None:
    """Begin these world sizes' shared launches in the background, smaller first (`shared` waits for its own)."""
    for nprocs in sorted(sizes):
        _shared_launch_future(nprocs)


def _shared_launch_future(nprocs: int) -> concurrent.futures.Future:
    with _SHARED_LOCK:
        if nprocs not in _SHARED_LAUNCHES:
            _SHARED_LAUNCHES[nprocs] = _LAUNCHER.submit(_shared_launch, nprocs)
        return _SHARED_LAUNCHES[nprocs]


def stop_shared_launches() -> None:
    """End the session's launches: those not begun are cancelled, a running one's ranks killed by their PIDs."""
    with _SHARED_LOCK:
        _STOPPED.set()
        for future in _SHARED_LAUNCHES.values():
            future.cancel()
        live = list(_LIVE)
    for process in live:
        _kill(process)
    _LAUNCHER.shutdown(wait=True)


def _shared_launch(nprocs: int) -> tuple[Rank, ...]:
    workers = SHARED[nprocs]
    ports = _distinct_ports(len(workers))
    arguments = ["-u", str(HERE / "run_shared.py")]
    arguments += [f"{name}:{seconds}:{port}" for (name, seconds), port in zip(workers.items(), ports, strict=True)]
    # The environment the session began with: this thread starts a launch while some test runs, and what that
    # test's monkeypatch set for itself (launch variables, a drill's victim) must not reach the shared ranks.
    return tuple(_ranks(arguments, nprocs, timeout=sum(workers.values()) + 60, environ=_SESSION_ENVIRON))


def _section(rank: Rank, worker: str) -> tuple[int | None, str]:
    begin, end = run_shared.BEGIN + worker + "\n", run_shared.END + worker + " "
    ended = 1 if rank.returncode == 0 else rank.returncode  # a process that ended inside a worker failed it
    start = rank.output.find(begin)
    if start < 0:
        return ended, f"{worker} never started:\n{rank.output[-3000:]}"
    start += len(begin)
    stop = rank.output.find(end, start)
    if stop < 0:
        return ended, rank.output[start:]
    return int(rank.output[stop + len(end)]), rank.output[start:stop]


def torchrun(worker: str, nprocs: int = 2, timeout: float = 150, monitor_interval: float = 0.1) -> Rank:
    """Run `workers.<worker>()` under `torchrun --nproc-per-node nprocs` (its own rendezvous and agent), whose agent
    looks at its workers every `monitor_interval` seconds (torchrun's default 0.1) and ends the others once one
    has failed."""
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as scratch:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
            "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(scratch, "cache"),
        }
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nprocs}",
            f"--monitor-interval={monitor_interval}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(HERE / "run_worker.py"),
            worker,
        ]
        with open(os.path.join(scratch, "torchrun.log"), "w+") as log:
            process = subprocess.Popen(
                command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            _kill(process)
            log.seek(0)
            return Rank(0, code, log.read())


def torchrun_nodes(worker: str, nnodes: int = 2, timeout: float = 150) -> list[Rank]:
    """Run `worker` as a job of `nnodes` nodes on loopback: one `torchrun --nnodes N --node-rank R
    --nproc-per-node 1` agent per node, all meeting at one master address and port (static rendezvous)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as scratch:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
            "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": os.path.join(scratch, "cache"),
        }
        processes, logs = [], []
        for node in range(nnodes):
            command = [
                *(sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node}"),
                *("--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"),
                *(str(HERE / "run_worker.py"), worker),
            ]
            log = open(os.path.join(scratch, f"node{node}.log"), "w+")  # closed below
            processes.append(
                subprocess.Popen(
                    command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
                )
            )
            logs.append(log)
        return _collect(processes, logs, timeout)


def _collect(processes: list[subprocess.Popen], logs: list, timeout: float) -> list[Rank]:
    """Wait for every process until the shared deadline, kill what is left, read every log."""
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    try:
        for process in processes:
            try:
                codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:  # also when the wait itself is interrupted: nothing may outlive the launch or write into its scratch
        for process in processes:
            _kill(process)  # a process that exited may have left children behind
    results = []
    for rank, (log, code) in enumerate(zip(logs, codes, strict=True)):
        log.seek(0)
        results.append(Rank(rank, code, log.read()))
        log.close()
    return results


def check(results: list[Rank], *lines: str) -> None:
    """Assert that every rank exited 0, showing the output of those that did not, and that every rank's output
    holds each of `lines` (what the worker prints when a check passed)."""
    failed = [r for r in results if r.returncode != 0]
    report = "\n".join(f"--- rank {r.rank} exited {r.returncode} ---\n{r.output[-4000:]}" for r in failed)
    assert not failed, report
    for result in results:
        missing = [line for line in lines if line not in result.output]
        assert not missing, f"rank {result.rank} lacks {missing}:\n{result.output[-3000:]}"
