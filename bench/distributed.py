"""all_reduce on `tpu` (tpu_dist) beside torch gloo on CPU tensors, in the same job, for 2 and 4 ranks.

One invocation launches N ranks on loopback for each N of --nprocs (this script again, as each rank). Each rank
times all_reduce(SUM) of float32 tensors from 4 B to 64 MiB, the variants interleaved sample by sample: tpu with
the default mismatch check, tpu with the check off (`handshake.enabled = False`), and gloo on CPU tensors. Shown:
medians [25th-75th percentile] of rank 0's samples, the bus bandwidth (2 (N-1) / N x bytes / time, the NCCL-tests
convention), the ratios to gloo and the check's cost. Targets (issue 13): tpu >= 0.8x gloo's bus bandwidth at
64 MiB and <= 2x its 4 B latency.
Usage: python bench/distributed.py [--nprocs 2 4] [--repeats R] [--sizes BYTES ...]
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
import tempfile
import time

import torch
import torch.distributed as dist

SIZES = (4, 1 << 10, 1 << 16, 1 << 20, 16 << 20, 64 << 20)
VARIANTS = ("tpu", "tpu_unchecked", "gloo")


def _sample(tensor: torch.Tensor) -> float:
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(tensor)
    if tensor.device.type == "tpu":
        torch.tpu.synchronize()
    return time.perf_counter() - start


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    low, median, high = statistics.quantiles(samples, n=4, method="inclusive")
    return low, median, high


def rank_main(repeats: int, sizes: list[int]) -> None:
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=300))
    from torch_tpu.distributed import handshake

    world = dist.get_world_size()
    rows = []
    for nbytes in sizes:
        tensors = {
            "tpu": torch.ones(nbytes // 4, dtype=torch.float32, device="tpu"),
            "gloo": torch.ones(nbytes // 4, dtype=torch.float32),
        }
        tensors["tpu_unchecked"] = tensors["tpu"]
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        count = repeats * (10 if nbytes < (1 << 20) else 2 if nbytes < (16 << 20) else 1)  # noise: samples are cheap
        for turn in range(count + 1):  # the first round compiles (tpu) and connects (gloo): not timed
            for name in VARIANTS:
                handshake.enabled = name != "tpu_unchecked"
                seconds = _sample(tensors[name])
                if turn:
                    samples[name].append(seconds)
        handshake.enabled = True
        row = {"bytes": nbytes}
        for name in VARIANTS:
            row[name] = [s * 1e6 for s in _quartiles(samples[name])]
        rows.append(row)
    if dist.get_rank() == 0:
        print(json.dumps({"ranks": world, "all_reduce": rows}), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(nprocs: int, repeats: int, sizes: list[int], timeout: float = 900) -> tuple[int, dict | None]:
    """Run the ranks; their exit status and rank 0's figures."""
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(nprocs)}
    command = [sys.executable, __file__, "--rank-of-job", "--repeats", str(repeats), "--sizes", *map(str, sizes)]
    with tempfile.TemporaryFile("w+") as output:
        ranks = [
            subprocess.Popen(
                command,
                env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                start_new_session=True,
                stdout=output if r == 0 else subprocess.DEVNULL,
            )
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
        output.seek(0)
        lines = [line for line in output.read().splitlines() if line.startswith("{")]
    return status, json.loads(lines[-1]) if lines else None


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def report(result: dict) -> list[str]:
    """The table of one job and whether it meets the targets."""
    world = result["ranks"]
    factor = 2 * (world - 1) / world
    print(f"\nall_reduce(SUM) float32, {world} ranks: median [25th-75th percentile] us of rank 0")
    print(f"{'size':>8} {'tpu':>26} {'tpu, check off':>26} {'gloo (CPU)':>26} {'tpu/gloo bw':>11} {'check cost':>16}")
    for row in result["all_reduce"]:
        cells = [f"{q[1]:9.0f} [{q[0]:.0f}-{q[2]:.0f}]" for q in (row[name] for name in VARIANTS)]
        ratio = row["gloo"][1] / row["tpu"][1]
        cost = row["tpu"][1] - row["tpu_unchecked"][1]
        share = cost / row["tpu_unchecked"][1] * 100
        size = _size(row["bytes"])
        print(f"{size:>8} {cells[0]:>26} {cells[1]:>26} {cells[2]:>26} {ratio:10.2f}x {cost:7.0f} us {share:4.0f}%")
    first, last = result["all_reduce"][0], result["all_reduce"][-1]
    bandwidth = {name: factor * last["bytes"] / (last[name][1] * 1e-6) / 1e9 for name in VARIANTS}
    bw_ratio = bandwidth["tpu"] / bandwidth["gloo"]
    latency_ratio = first["tpu"][1] / first["gloo"][1]
    verdicts = []
    if last["bytes"] == SIZES[-1]:
        verdicts.append(
            f"{world} ranks, {_size(last['bytes'])} bus bandwidth: tpu {bandwidth['tpu']:.2f} GB/s, gloo "
            f"{bandwidth['gloo']:.2f} GB/s: {bw_ratio:.2f}x (target >= 0.8x): {'met' if bw_ratio >= 0.8 else 'NOT met'}"
        )
    if first["bytes"] == SIZES[0]:
        verdicts.append(
            f"{world} ranks, {_size(first['bytes'])} latency: tpu {first['tpu'][1]:.0f} us, gloo "
            f"{first['gloo'][1]:.0f} us: {latency_ratio:.2f}x (target <= 2x): "
            f"{'met' if latency_ratio <= 2 else 'NOT met'}"
        )
    for line in verdicts:
        print(line)
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes per all_reduce")
    parser.add_argument("--rank-of-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of_job:
        rank_main(args.repeats, args.sizes)
        return
    status, verdicts = 0, []
    for nprocs in args.nprocs:
        code, result = launch(nprocs, args.repeats, args.sizes)
        status = status or code
        if result is None:
            print(f"{nprocs} ranks: no result (exit status {code})")
            continue
        print(json.dumps(result))
        verdicts += report(result)
    print("\nTargets:\n" + "\n".join(verdicts))
    sys.exit(status)


if __name__ == "__main__":
    main()
