"""Multi-process benchmark jobs on loopback: each bench script re-runs itself as every rank of a job."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(script: str, arguments: list[str], nprocs: int, timeout: float) -> dict:
    """Run `script --rank-of-job ARGUMENTS` on `nprocs` ranks, each in a session of its own killed (by PID) at
    `timeout`; rank 0's result, the JSON object on its last output line."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(nprocs)}
    command = [sys.executable, script, "--rank-of-job", *arguments]
    ranks = [
        subprocess.Popen(
            command,
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        for r in range(nprocs)
    ]
    deadline = time.monotonic() + timeout
    try:
        output, _ = ranks[0].communicate(timeout=timeout)
        for process in ranks[1:]:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for process in ranks:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if any(process.returncode for process in ranks):
        raise RuntimeError(f"the {nprocs}-rank job failed: exit codes {[p.returncode for p in ranks]}")
    return json.loads(output.strip().splitlines()[-1])


def summary(samples: list[float]) -> str:
    """Median and range of step times, in ms."""
    return f"{statistics.median(samples) * 1e3:8.2f} ms ({min(samples) * 1e3:.2f}-{max(samples) * 1e3:.2f})"
