"""Parallelism on `tpu`: per-rank memory of DDP against FSDP2, and the step time of FSDP2, tensor parallel and DDP
against one process, on 2 ranks on loopback.

One invocation launches one 2-rank job (this script again, as each rank) under a hard timeout. Each rank builds the
same model (blocks of `up` and `down` Linear layers, float32) four ways: alone (no collectives: one process's step,
run on both ranks at once so that the machine is as loaded as in the parallel runs), DDP, FSDP2 (`fully_shard` per
block and the root) and tensor parallel (`up` column-wise, `down` row-wise over both ranks; the ranks share one
batch). Memory: the bytes each of DDP and FSDP2 holds between steps (parameters, gradients, AdamW's state) and its
peak during a step, from `torch.tpu.memory_allocated()`. Time: rounds of every way interleaved; the median step
time with its spread (min-max over rounds) and its ratio to the one-process step.
Usage: python bench/parallel.py [--rounds R] [--steps S] [--width W] [--blocks N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import jobs
import torch
import torch.distributed as dist
from torch import nn

BATCH = 32


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def _model(width: int, blocks: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(blocks)))


def _build(way: str, width: int, blocks: int, mesh) -> nn.Module:
    model = _model(width, blocks).to("tpu")
    if way == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if way == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if way == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for block in model:
            parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


class _Trainer:
    def __init__(self, way: str, width: int, blocks: int, mesh) -> None:
        self.model = _build(way, width, blocks, mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        seed = 0 if way == "tp" else dist.get_rank()  # tensor parallel ranks share a batch
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(BATCH, width, generator=generator).to("tpu")
        self.targets = torch.randn(BATCH, width, generator=generator).to("tpu")

    def step(self) -> None:
        self.optimizer.zero_grad()
        nn.functional.mse_loss(self.model(self.inputs), self.targets).backward()
        self.optimizer.step()

    def time(self, steps: int) -> float:
        """Seconds per step over `steps` steps, every rank starting together."""
        torch.tpu.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        torch.tpu.synchronize()
        return (time.perf_counter() - start) / steps


WAYS = ("alone", "ddp", "fsdp2", "tp")


def rank_main(rounds: int, steps: int, width: int, blocks: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=300))
    mesh = init_device_mesh("tpu", (dist.get_world_size(),))
    trainers, memory = {}, {}
    for way in WAYS:
        before = torch.tpu.memory_allocated()
        trainers[way] = trainer = _Trainer(way, width, blocks, mesh)
        trainer.time(3)  # compile, connect, AdamW's state, DDP's bucket rebuild outside the measurements
        torch.tpu.reset_peak_memory_stats()
        trainer.step()
        torch.tpu.synchronize()
        memory[way] = {
            "held": torch.tpu.memory_allocated() - before,
            "peak": torch.tpu.max_memory_allocated() - before,
        }
    samples: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way, trainer in trainers.items():
            samples[way].append(trainer.time(steps))
    if dist.get_rank() == 0:
        print(json.dumps({"samples": samples, "memory": memory}), flush=True)
    dist.destroy_process_group()


def launch(arguments: list[str], nprocs: int = 2, timeout: float = 900) -> dict:
    """Run the job on `nprocs` ranks; rank 0's result."""
    return jobs.launch(__file__, arguments, nprocs, timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--rank-of-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of_job:
        rank_main(args.rounds, args.steps, args.width, args.blocks)
        return
    shape = ["--rounds", str(args.rounds), "--steps", str(args.steps), "--width", str(args.width)]
    result = launch([*shape, "--blocks", str(args.blocks)], timeout=args.timeout)
    parameters = sum(p.numel() for p in _model(args.width, args.blocks).parameters())
    print(
        f"{args.blocks} blocks of Linear({args.width}, {2 * args.width}) + Linear({2 * args.width}, {args.width}), "
        f"{parameters * 4 / 2**20:.2f} MiB of float32 parameters, AdamW, batch {BATCH} per rank, 2 ranks"
    )
    memory = result["memory"]
    print(f"{'per rank':>10}  {'held between steps':>20}  {'peak in a step':>16}")
    for way in ("ddp", "fsdp2"):
        print(f"{way:>10}  {memory[way]['held'] / 2**20:16.2f} MiB  {memory[way]['peak'] / 2**20:12.2f} MiB")
    held = memory["fsdp2"]["held"] / memory["ddp"]["held"]
    peak = memory["fsdp2"]["peak"] / memory["ddp"]["peak"]
    print(f"{'fsdp2/ddp':>10}  {held:20.2f}  {peak:16.2f}")
    state = parameters * 4 * 4  # parameters, gradients and AdamW's two moments, float32, of the whole model
    print(
        f"FSDP2 holds {memory['fsdp2']['held'] / state:.2f} of the model's parameter + gradient + AdamW bytes "
        f"({state / 2**20:.2f} MiB); DDP {memory['ddp']['held'] / state:.2f} (its buckets copy the gradients)"
    )
    samples = result["samples"]
    alone = statistics.median(samples["alone"])
    print(f"step time, median (min-max) of {args.rounds} rounds of {args.steps} steps; ratio to one process")
    for way in WAYS:
        print(f"{way:>10}  {jobs.summary(samples[way]):>28}  {statistics.median(samples[way]) / alone:6.2f}")


if __name__ == "__main__":
    main()
