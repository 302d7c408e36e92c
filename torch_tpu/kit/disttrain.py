"""One rank of a distributed training run of a workload: `python -m torch_tpu.kit.disttrain --workload SPEC ...`.

The kit launches this on loopback (`torch_tpu.kit.launch`); on several hosts the same module runs under
`torchrun` (it reads RANK, WORLD_SIZE and LOCAL_RANK from the environment, as torchrun sets them). Strategy
`single` is the one-process reference: no process group, the whole global batch. `ddp` and `fsdp2` split every
global batch into equal row slices, one per rank; `tp` gives every rank the whole batch and splits the modules the
workload's `tp_plan` names. Every rank writes one JSON line per finished step to `OUT/rank{R}.jsonl` (loss of its
slice, step and collective seconds, RNG digests, data position), which is how the kit watches progress and kills
a rank at a given step, and `OUT/rank{R}.json` at the end (peak memory, quality; rank 0 also the final parameters).

Checkpoints (`--checkpoint-dir D --checkpoint-every K`) hold the complete training state through
`torch.distributed.checkpoint`: model and optimizer (`get_state_dict`, which sees through DDP and FSDP2), the LR
scheduler, each rank's CPU and device RNG and the data position. A checkpoint directory is trusted only when its
`COMPLETE.json` marker — written last, by rank 0, after every rank's files — lists a SHA-256 per file that still
matches (`checkpoint_problem`); `--resume DIR` restores one.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import sys
import time
from typing import Any

import torch

from torch_tpu.kit import workload as workload_mod

STRATEGIES = ("single", "ddp", "fsdp2", "tp")
MARKER = "COMPLETE.json"
HELD_OUT_SEED = 10_000
PROCESS_GROUP_TIMEOUT_S = 60  # a collective with a live but stuck peer fails after this, not never
HOLD_LIMIT_S = 300.0  # a rank held for a drill's kill gives up after this rather than never


class BatchStream:
    """The data loader: each step's batch seed is drawn from the global CPU RNG (as torch's RandomSampler draws
    its order), so a resumed run sees the same data only if both the RNG and the position were restored."""

    def __init__(self, work: workload_mod.Workload, rank: int, world: int, split: bool, device: str = "tpu") -> None:
        self.work, self.shape, self.device = work, work.shapes[0], device
        self.rank, self.world, self.split = rank, world, split
        self.position = 0
        if split and self.shape.batch % world:
            raise ValueError(f"global batch {self.shape.batch} of {work.name} does not split evenly over {world} ranks")

    def next(self) -> tuple[Any, torch.Tensor]:
        seed = int(torch.randint(0, 2**31 - 1, ()))
        inputs, target = self.work.make_batch(self.shape, seed)
        if self.split:
            rows = self.shape.batch // self.world
            pick = slice(self.rank * rows, (self.rank + 1) * rows)
            inputs = torch.utils._pytree.tree_map(lambda t: t[pick] if isinstance(t, torch.Tensor) else t, inputs)
            target = target[pick]
        self.position += 1
        return workload_mod.to_device(inputs, self.device, self.shape.torch_dtype), target.to(self.device)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()[:16]


def _wrap(model: torch.nn.Module, strategy: str, work: workload_mod.Workload, world: int) -> torch.nn.Module:
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for child in getattr(model, "blocks", []):
            fully_shard(child)
        return fully_shard(model)
    if strategy == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        if not work.tp_plan:
            raise ValueError(f"workload {work.name} declares no tp_plan, so it cannot run under --strategy tp")
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        unknown = sorted({style for style in work.tp_plan.values() if style not in styles})
        if unknown:
            raise ValueError(f"tp_plan of {work.name}: unknown style(s) {unknown}; use 'colwise' or 'rowwise'")
        mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
        return parallelize_module(model, mesh, {path: styles[style]() for path, style in work.tp_plan.items()})
    return model


def _full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on CPU (a DTensor is gathered: a collective, so every rank calls this)."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    full = {}
    for name, parameter in inner.named_parameters():
        value = parameter.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        full[name] = value.cpu()
    return full


def _state(model: Any, optimizer: Any, scheduler: Any, stream: BatchStream, rank: int) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "data": stream.state_dict(),
        f"rng_rank{rank}": {"cpu": torch.get_rng_state(), "device": torch.tpu.get_rng_state()},
    }


def file_digests(directory: pathlib.Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != MARKER
    }


def checkpoint_problem(directory: pathlib.Path) -> str | None:
    """Why `directory` is not a complete checkpoint (None when it is): no marker (a save that never finished),
    an unreadable marker, or a file missing or changed since the marker was written."""
    marker = directory / MARKER
    if not marker.is_file():
        return f"{MARKER} is missing (the save did not finish)"
    try:
        listed = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"{MARKER} is unreadable: {exc}"
    for name, digest in listed.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return f"{name} does not match its SHA-256 in {MARKER} (corrupt or partly written)"
    return None


def _save(directory: pathlib.Path, state: dict[str, Any], step: int, rank: int, distributed: bool) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(directory))
    if distributed:
        dist.barrier()  # every rank's files are written before the marker says so
    if rank == 0:
        marker = {"step": step, "time": time.time(), "files": file_digests(directory)}
        partial = directory / (MARKER + ".partial")
        partial.write_text(json.dumps(marker))
        partial.replace(directory / MARKER)  # atomic: a marker is whole or absent
    if distributed:
        dist.barrier()


def _load(directory: pathlib.Path, model: Any, optimizer: Any, scheduler: Any, stream: BatchStream, rank: int) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer, scheduler, stream, rank)
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["data"])
    rng = state[f"rng_rank{rank}"]
    torch.set_rng_state(rng["cpu"])
    torch.tpu.set_rng_state(rng["device"])
    return json.loads((directory / MARKER).read_text())["step"]


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train `args.steps` steps (from a checkpoint with --resume), writing progress and the final result."""
    import torch.distributed as dist

    from torch_tpu.distributed import watchdog

    distributed = args.strategy != "single"
    rank = int(os.environ.get("RANK", 0)) if distributed else 0
    world = int(os.environ.get("WORLD_SIZE", 1)) if distributed else 1
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = workload_mod.load(args.workload)
    shape = work.shapes[0]
    if distributed:
        torch.tpu.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))
    clock = watchdog.clock  # the collectives' time (none without a group)
    model = _wrap(work.make_model(0).to(device="tpu", dtype=shape.torch_dtype), args.strategy, work, world)
    optimizer = work.optimizer(model)
    scheduler = work.scheduler(optimizer)
    stream = BatchStream(work, rank, world, split=args.strategy in ("ddp", "fsdp2"))
    start_step = 0
    if args.resume:
        start_step = _load(pathlib.Path(args.resume), model, optimizer, scheduler, stream, rank)
    torch.tpu.reset_peak_memory_stats()
    progress = open(out / f"rank{rank}.jsonl", "a")  # closed below; lines are flushed as written
    checkpoints = []
    for step in range(start_step + 1, args.steps + 1):
        started, in_collectives = time.perf_counter(), clock.seconds
        inputs, target = stream.next()
        optimizer.zero_grad()
        loss = work.loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        value = float(loss.detach().cpu())
        torch.accelerator.synchronize()
        record = {
            "step": step,
            "loss": value,
            "seconds": time.perf_counter() - started,
            "collective_seconds": clock.seconds - in_collectives,
            "time": time.time(),
            "position": stream.position,
            "lr": scheduler.get_last_lr()[0],
            "rng_cpu": _digest(torch.get_rng_state()),
            "rng_device": _digest(torch.tpu.get_rng_state()),
            "pid": os.getpid(),
        }
        progress.write(json.dumps(record) + "\n")
        progress.flush()
        if args.checkpoint_dir and args.checkpoint_every and step % args.checkpoint_every == 0:
            directory = pathlib.Path(args.checkpoint_dir) / f"step-{step:06d}"
            save_started = time.perf_counter()
            _save(directory, _state(model, optimizer, scheduler, stream, rank), step, rank, distributed)
            checkpoints.append({"step": step, "seconds": time.perf_counter() - save_started, "path": str(directory)})
        if step == args.hold_at_step and rank == args.hold_rank:
            _hold(step, rank)
    progress.close()
    parameters = _full_parameters(model)
    with torch.no_grad():
        inputs, target = workload_mod.to_device(work.make_batch(shape, HELD_OUT_SEED), "tpu", shape.torch_dtype)
        quality = work.metric(model(inputs), target)
    result = {
        "rank": rank,
        "world_size": world,
        "strategy": args.strategy,
        "local_batch": shape.batch // world if stream.split else shape.batch,
        "peak_memory_bytes": torch.tpu.max_memory_allocated(),
        "quality": quality,
        "meets_contract": work.meets_contract(quality),
        "collective_calls": clock.calls,
        "checkpoints": checkpoints,
        "resumed_from_step": start_step if args.resume else None,
    }
    if rank == 0:
        torch.save(parameters, out / "parameters.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return result


def _hold(step: int, rank: int) -> None:
    """Wait here for the drill's SIGKILL, so which checkpoints exist when it lands does not depend on how fast
    the rank would have run on; a rank nobody kills fails after `HOLD_LIMIT_S`."""
    time.sleep(HOLD_LIMIT_S)
    raise RuntimeError(f"rank {rank} was held after step {step} for a kill that did not come in {HOLD_LIMIT_S:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of a kit training run")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--resume", help="a complete checkpoint directory to restore before training")
    parser.add_argument("--hold-rank", type=int, default=0, help="the rank --hold-at-step stops")
    parser.add_argument(
        "--hold-at-step", type=int, default=0, help="after this step (and its checkpoint) wait to be killed"
    )
    train(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
