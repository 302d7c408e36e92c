"""Launch a worker of `tests/distributed/workers.py` in N processes on loopback, under a hard timeout.

Each rank is a fresh Python process (torch's env:// rendezvous: MASTER_ADDR/PORT, RANK, WORLD_SIZE) in a
session of its own, so that on timeout the whole process group it started is killed by its PID and nothing
outlives the test. The port is chosen free at run time; the persistent compile cache is a private directory.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from torch_tpu.runtime import compat

HERE = pathlib.Path(__file__).resolve().parent
# FSDP2 frees and regrows unsharded parameters with UntypedStorage.resize_, which a tpu storage supports from
# torch 2.12 (docs/compatibility.md).
needs_storage_resize = pytest.mark.skipif(
    not compat.STORAGE_SWAPS_DATA_POINTER, reason=f"torch {torch.__version__}: no tpu storage resize, so no FSDP2"
)
ROOT = HERE.parents[1]


@dataclasses.dataclass
class Rank:
    rank: int
    returncode: int | None
    output: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tpu_dist_test_") as scratch:
        base = {
            **os.environ,
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
            log = open(os.path.join(scratch, f"rank{rank}.log"), "w+")  # noqa: SIM115  (closed below)
            environment = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            command = [sys.executable, "-c", _call(worker)]
            processes.append(
                subprocess.Popen(
                    command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
                )
            )
            logs.append(log)
        return _collect(processes, logs, timeout)


@functools.cache
def launch_once(worker: str, nprocs: int = 2, timeout: float = 150) -> tuple[Rank, ...]:
    """`launch`, run once per test session: test files that check different parts of one worker's output share it."""
    return tuple(launch(worker, nprocs, timeout))


def torchrun(worker: str, nprocs: int = 2, timeout: float = 150) -> Rank:
    """Run `workers.<worker>()` under `torchrun --nproc-per-node nprocs` (its own rendezvous and agent)."""
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
            log = open(os.path.join(scratch, f"node{node}.log"), "w+")  # noqa: SIM115  (closed below)
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
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for process in processes:
        _kill(process)  # a process that exited may have left children behind
    results = []
    for rank, (log, code) in enumerate(zip(logs, codes, strict=True)):
        log.seek(0)
        results.append(Rank(rank, code, log.read()))
        log.close()
    return results


def check(results: list[Rank]) -> None:
    """Assert that every rank exited 0, showing the output of those that did not."""
    failed = [r for r in results if r.returncode != 0]
    report = "\n".join(f"--- rank {r.rank} exited {r.returncode} ---\n{r.output[-4000:]}" for r in failed)
    assert not failed, report
