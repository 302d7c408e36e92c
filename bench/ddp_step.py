"""DDP training-step time on `tpu` (tpu_dist) beside DDP on CPU tensors (gloo), weak scaling over 1, 2 (and 4) ranks.

One invocation launches a job per rank count on loopback (this script again, as each rank). Every rank trains the
same MLP on the same per-rank batch twice, interleaved round by round: DDP(model.to("tpu")) and DDP(model) on CPU
(whose collectives run on gloo, in the same process group). Printed per rank count: the median step time with its
spread (min-max over rounds), tpu / gloo, and the weak-scaling efficiency t(1 rank) / t(N ranks) of each.
Usage: python bench/ddp_step.py [--ranks 1,2,4] [--rounds R] [--steps S]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import jobs
import torch
import torch.distributed as dist
from torch import nn

BATCH, WIDTH = 64, 512


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))


class _Trainer:
    def __init__(self, device: str) -> None:
        self.device = device
        self.model = nn.parallel.DistributedDataParallel(_model().to(device))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(dist.get_rank())
        self.inputs = torch.randn(BATCH, WIDTH, generator=generator).to(device)
        self.targets = torch.randint(0, 10, (BATCH,), generator=generator).to(device)

    def _sync(self) -> None:
        if self.device == "tpu":
            torch.tpu.synchronize()

    def step(self) -> None:
        self.optimizer.zero_grad()
        nn.functional.cross_entropy(self.model(self.inputs), self.targets).backward()
        self.optimizer.step()

    def time(self, steps: int) -> float:
        """Seconds per step over `steps` steps, every rank starting together."""
        self._sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        self._sync()
        return (time.perf_counter() - start) / steps


def rank_main(rounds: int, steps: int) -> None:
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=300))
    trainers = {"tpu": _Trainer("tpu"), "gloo": _Trainer("cpu")}
    for trainer in trainers.values():
        trainer.time(3)  # compile (tpu), connect and bucket rebuild (both) outside the timing
    samples: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(rounds):
        for name, trainer in trainers.items():
            samples[name].append(trainer.time(steps))
    if dist.get_rank() == 0:
        print(json.dumps({"ranks": dist.get_world_size(), "samples": samples}), flush=True)
    dist.destroy_process_group()


def launch(nprocs: int, rounds: int, steps: int, timeout: float = 300) -> dict:
    """Run one job of `nprocs` ranks; rank 0's samples."""
    return jobs.launch(__file__, ["--rounds", str(rounds), "--steps", str(steps)], nprocs, timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4" if (os.cpu_count() or 1) >= 4 else "1,2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rank-of-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of_job:
        rank_main(args.rounds, args.steps)
        return
    results = [launch(int(n), args.rounds, args.steps) for n in args.ranks.split(",")]
    base = {name: statistics.median(results[0]["samples"][name]) for name in ("tpu", "gloo")}
    print(f"DDP step, MLP {WIDTH}x{WIDTH}x2 + 10, batch {BATCH} per rank, float32; median (min-max) of {args.rounds}")
    print(f"{'ranks':>5}  {'tpu (tpu_dist)':>28}  {'cpu (gloo)':>28}  tpu/gloo  efficiency tpu  gloo")
    for result in results:
        tpu, gloo = (statistics.median(result["samples"][name]) for name in ("tpu", "gloo"))
        print(
            f"{result['ranks']:>5}  {jobs.summary(result['samples']['tpu']):>28}"
            f"  {jobs.summary(result['samples']['gloo']):>28}"
            f"  {tpu / gloo:8.2f}  {base['tpu'] / tpu:14.2f}  {base['gloo'] / gloo:4.2f}"
        )


if __name__ == "__main__":
    main()
