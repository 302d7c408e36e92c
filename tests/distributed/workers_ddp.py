"""DDP workers (launched by `launch.py`): each rank trains a DDP model on tpu on its part of a batch, and checks
the parameters against the same training done in one process on CPU PyTorch on the whole batch.

DDP averages the ranks' gradients, so the single-process reference minimises the mean of the ranks' losses (with
equal local batches: the loss of the full batch). Everything is float64; the two sides differ only by the order
of float64 sums (the mean of the ranks' means against one mean), so after a few steps they agree to ~1e-15
relative (SGD with momentum, AdamW) — the tolerance below leaves three orders of magnitude for that and nothing
for a wrong gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os

import torch
import torch.distributed as dist
from torch import nn

_TIMEOUT = datetime.timedelta(seconds=60)
_BATCH = 3  # rows per rank per micro-batch
_STEPS = 3


class Net(nn.Module):
    """A trunk and head always used; with `extras`, a branch some ranks use in some steps and a layer no forward
    ever uses (only DDP with find_unused_parameters or static_graph accepts parameters without gradients)."""

    def __init__(self, extras: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        if extras:
            self.branch = nn.Linear(8, 2)
            self.never = nn.Linear(8, 2)
        self.double()

    def forward(self, x: torch.Tensor, use_branch: bool = False) -> torch.Tensor:
        hidden = torch.tanh(self.trunk(x))
        out = self.head(hidden)
        return out + self.branch(hidden) if use_branch else out


@dataclasses.dataclass
class Config:
    name: str
    ddp: dict
    optimizer: str = "sgd"
    accumulate: int = 1  # micro-batches per step: all but the last under no_sync()
    branches: bool = False  # rank r uses `branch` in step s when (r + s) is even
    fused: bool = False

    @property
    def extras(self) -> bool:
        return bool(self.ddp.get("find_unused_parameters") or self.ddp.get("static_graph"))


CONFIGS = {
    config.name: config
    for config in (
        Config("buckets, device_ids=[0], AdamW", {"bucket_cap_mb": 1e-4, "device_ids": [0]}, "adamw"),
        Config("bucket views, no_sync", {"bucket_cap_mb": 1e-4, "gradient_as_bucket_view": True}, accumulate=2),
        Config("find_unused_parameters, no_sync", {"find_unused_parameters": True}, accumulate=2, branches=True),
        Config("static_graph, AdamW", {"static_graph": True}, "adamw"),
        Config(
            "fused eager, find_unused_parameters, bucket views",
            {"find_unused_parameters": True, "bucket_cap_mb": 1e-4, "gradient_as_bucket_view": True},
            branches=True,
            fused=True,
        ),
    )
}
# The 4-rank run: the local-used-map reduction with no_sync, and Fused eager.
FOUR_RANKS = ["find_unused_parameters, no_sync", "fused eager, find_unused_parameters, bucket views"]


def _data(world: int, accumulate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[step][micro-batch][rank] blocks of inputs and targets, the same on every rank."""
    generator = torch.Generator().manual_seed(7)
    shape = (_STEPS, accumulate, world, _BATCH)
    return (
        torch.randn(*shape, 4, generator=generator, dtype=torch.float64),
        torch.randn(*shape, 2, generator=generator, dtype=torch.float64),
    )


def _optimizer(kind: str, parameters) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=0.05, weight_decay=0.1)
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def _reference(config: Config, world: int) -> Net:
    """One process, CPU: each step minimises the mean over ranks and micro-batches of the local losses."""
    model = Net(config.extras)
    optimizer = _optimizer(config.optimizer, model.parameters())
    inputs, targets = _data(world, config.accumulate)
    for step in range(_STEPS):
        optimizer.zero_grad()
        losses = [
            nn.functional.mse_loss(
                model(inputs[step, m, r], config.branches and (r + step) % 2 == 0), targets[step, m, r]
            )
            for m in range(config.accumulate)
            for r in range(world)
        ]
        (sum(losses) / len(losses)).backward()
        optimizer.step()
    return model


def _train(config: Config, rank: int, world: int) -> nn.Module:
    model = nn.parallel.DistributedDataParallel(Net(config.extras).to("tpu"), **config.ddp)
    optimizer = _optimizer(config.optimizer, model.parameters())
    inputs, targets = (t[:, :, rank].to("tpu") for t in _data(world, config.accumulate))
    for step in range(_STEPS):
        use_branch = config.branches and (rank + step) % 2 == 0
        optimizer.zero_grad()
        for m in range(config.accumulate):
            last = m == config.accumulate - 1
            with contextlib.nullcontext() if last else model.no_sync():
                loss = nn.functional.mse_loss(model(inputs[step, m], use_branch), targets[step, m])
                (loss / config.accumulate).backward()
        optimizer.step()
    return model


def _check(config: Config, rank: int, world: int) -> None:
    from torch_tpu.distributed import torch_patches

    expected = _reference(config, world)
    mode = torch.tpu.EagerMode.DEFER_AND_FUSE if config.fused else torch.tpu.eager_mode
    with torch.tpu.set_eager_mode(mode):
        model = _train(config, rank, world)
        got = {name: p.detach().cpu() for name, p in model.module.named_parameters()}
    for name, parameter in expected.named_parameters():
        torch.testing.assert_close(got[name], parameter.detach(), rtol=1e-12, atol=1e-14, msg=f"{config.name}: {name}")
    if config.extras:
        untouched = Net(extras=True).never.weight.detach()
        torch.testing.assert_close(got["never.weight"], untouched, rtol=0, atol=0, msg=f"{config.name}: never")
        assert model.module.never.weight.grad is None, f"{config.name}: a never-used parameter got a gradient"
    if "bucket_cap_mb" in config.ddp:
        buckets = len(model.reducer._get_zeros_like_grad_buckets())  # after the first step's rebuild
        assert buckets > 1, f"{config.name}: expected several buckets, got {buckets}"
    assert not torch_patches.pinning_window.installed, "the pinning kernels outlived the backward pass"
    print(f"ddp {config.name}: parameters match", flush=True)


def _run(names: list[str]) -> None:
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in names:
        _check(CONFIGS[name], rank, world)
    dist.destroy_process_group()


def train() -> None:
    """Every configuration (the 2-rank test)."""
    _run(list(CONFIGS))


def train_four() -> None:
    """The configurations whose reductions differ most with more ranks (the 4-rank test, kept short)."""
    _run(FOUR_RANKS)


def multi_node() -> None:
    """One process per node under `torchrun --nnodes N`: its rank, its device, collectives and DDP."""
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(local_rank)
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["GROUP_RANK"]) * int(os.environ["LOCAL_WORLD_SIZE"]) + local_rank
    assert torch.tpu.current_device() == 0 and torch.tpu.device_count() == 1
    import jax

    assert jax.process_count() == world and jax.process_index() == rank, (jax.process_count(), jax.process_index())
    values = [torch.arange(5, dtype=torch.int64) * (r + 1) + r for r in range(world)]
    tensor = values[rank].to("tpu")
    dist.all_reduce(tensor)
    assert torch.equal(tensor.cpu(), sum(values)), tensor.cpu()
    gathered = torch.empty(world * 5, dtype=torch.int64, device="tpu")
    dist.all_gather_into_tensor(gathered, values[rank].to("tpu"))
    assert torch.equal(gathered.cpu(), torch.cat(values)), gathered.cpu()
    _check(CONFIGS["find_unused_parameters, no_sync"], rank, world)
    print(f"multi-node rank {rank} of {world} ok", flush=True)
    dist.destroy_process_group()
