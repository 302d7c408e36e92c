"""A torchrun-style loopback launcher for the kit's distributed runs, with a hard timeout and kill by PID.

Each rank is a fresh `python -m torch_tpu.kit.disttrain` process on 127.0.0.1 with torch's env:// variables
(MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and a port found free at launch time, in a
session of its own, so that the kit can SIGKILL one worker by its PID (the recovery drill) and, at the deadline,
everything a rank started by its session leader's PID. Nothing outlives a `Job`.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

from torch_tpu.distributed import launch_env


class Job:
    """`nprocs` ranks of `python -m torch_tpu.kit.disttrain ARGUMENTS --out OUT`, logs in OUT/rank{R}.log."""

    def __init__(self, arguments: list[str], nprocs: int, out: pathlib.Path, timeout_s: float) -> None:
        self.out, self.nprocs = out, nprocs
        out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        base = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(launch_env.free_port()),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "torch_tpu.kit.disttrain", *arguments, "--out", str(out)]
        self.processes: list[subprocess.Popen] = []
        for rank in range(nprocs):
            with open(out / f"rank{rank}.log", "w") as log:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def progress(self, rank: int) -> list[dict[str, Any]]:
        """The steps rank `rank` has finished so far (its JSON lines; a line being written is skipped)."""
        path = self.out / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                break
        return records

    def kill(self, rank: int) -> float:
        """SIGKILL rank `rank`'s process (only that PID: its peers must notice by themselves); the time it died."""
        os.kill(self.processes[rank].pid, signal.SIGKILL)
        self.processes[rank].wait()
        return time.time()

    def running(self) -> bool:
        return any(process.poll() is None for process in self.processes)

    def wait(self, timeout_s: float | None = None) -> list[int | None]:
        """Every rank's exit status (None: still running at the deadline, then killed with its session)."""
        limit = self.deadline if timeout_s is None else min(self.deadline, time.monotonic() + timeout_s)
        codes: list[int | None] = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(0.0, limit - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        self.stop()
        return codes

    def stop(self) -> None:
        """Kill what is left of every rank's session (a rank that exited may have left children behind)."""
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()

    def log_tail(self, rank: int, lines: int = 15) -> str:
        path = self.out / f"rank{rank}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def run(arguments: list[str], nprocs: int, out: pathlib.Path, timeout_s: float) -> dict[str, Any]:
    """Launch, wait (hard timeout), collect each rank's progress and result; `error` says why a run failed."""
    job = Job(arguments, nprocs, out, timeout_s)
    started = time.time()
    codes = job.wait()
    collected = collect(out, nprocs)
    collected.update(exit_codes=codes, wall_seconds=time.time() - started)
    failed = [rank for rank, code in enumerate(codes) if code != 0]
    if failed:
        rank = failed[0]
        why = f"ran past the {timeout_s:.0f} s limit and was killed" if codes[rank] is None else "failed"
        collected["error"] = f"rank {rank} {why} (exit status {codes[rank]}): {job.log_tail(rank, 6)}"
    return collected


def collect(out: pathlib.Path, nprocs: int) -> dict[str, Any]:
    ranks = []
    for rank in range(nprocs):
        path = out / f"rank{rank}.json"
        result = json.loads(path.read_text()) if path.exists() else {"rank": rank}
        progress = out / f"rank{rank}.jsonl"
        lines = progress.read_text().splitlines() if progress.exists() else []
        result["steps"] = [json.loads(line) for line in lines if line.strip()]
        ranks.append(result)
    return {"ranks": ranks}
