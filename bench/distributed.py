"""all_reduce on `tpu` (tpu_dist: an XLA program) beside torch gloo on CPU tensors, in the same job.

One invocation launches N ranks on loopback (this script again, as each rank), each timing all_reduce(SUM) of
float32 tensors from 4 B to 64 MiB: the median latency and the bus bandwidth (2 (N-1) / N x bytes / time, the
NCCL-tests convention). Targets (issue 13): tpu >= 0.8x gloo's bus bandwidth at 64 MiB, <= 2x its 4 B latency.
Usage: python bench/distributed.py [--nprocs N] [--repeats R]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

SIZES = (4, 1 << 10, 1 << 16, 1 << 20, 16 << 20, 64 << 20)


def _median_seconds(tensor: torch.Tensor, repeats: int) -> float:
    dist.all_reduce(tensor)  # compile (tpu) and connect (gloo) outside the timing
    if tensor.device.type == "tpu":
        torch.tpu.synchronize()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if tensor.device.type == "tpu":
            torch.tpu.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rank_main(repeats: int) -> None:
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=120))
    world = dist.get_world_size()
    rows = []
    for nbytes in SIZES:
        row = {"bytes": nbytes}
        for name, device in (("tpu", "tpu"), ("gloo", "cpu")):
            tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            seconds = _median_seconds(tensor, repeats if nbytes < (16 << 20) else max(3, repeats // 4))
            row[f"{name}_us"] = seconds * 1e6
            row[f"{name}_busbw_GBps"] = 2 * (world - 1) / world * nbytes / seconds / 1e9
        rows.append(row)
    if dist.get_rank() == 0:
        print(json.dumps({"ranks": world, "all_reduce": rows}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(nprocs: int, repeats: int, timeout: float = 580) -> int:
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(nprocs)}
    command = [sys.executable, __file__, "--rank-of-job", "--repeats", str(repeats)]
    ranks = [
        subprocess.Popen(command, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, start_new_session=True)
        for r in range(nprocs)
    ]
    deadline = time.monotonic() + timeout
    status = 0
    for process in ranks:
        try:
            status = status or process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            status = 124
    for process in ranks:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rank-of-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of_job:
        rank_main(args.repeats)
    else:
        sys.exit(launch(args.nprocs, args.repeats))


if __name__ == "__main__":
    main()
