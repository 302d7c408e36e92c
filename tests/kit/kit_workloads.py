"""Tiny workloads for the kit's tests: a working one and one per failure the report must explain."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from torch_tpu.kit.workload import Shape, Workload


def tiny(train_steps: int = 4, **kwargs) -> Workload:
    """A linear classifier on 8 features: seconds to compile, learns in a few steps."""

    def make_model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def make_batch(shape: Shape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape.batch, 8, generator=g)
        return x, (x[:, :4]).argmax(-1)

    def accuracy(out: torch.Tensor, target: torch.Tensor) -> float:
        return float((out.argmax(-1) == target).float().mean().cpu())

    fields = dict(
        name="tiny",
        make_model=make_model,
        make_batch=make_batch,
        loss=F.cross_entropy,
        metric=accuracy,
        quality_target=0.0,
        train_steps=train_steps,
        learning_rate=5e-2,
        shapes=[Shape(16), Shape(8)],
        latency_slo_ms=10_000.0,
        tp_plan={"0": "colwise", "2": "rowwise"},
    )
    fields.update(kwargs)
    return Workload(**fields)


def nan_loss(train_steps: int = 4) -> Workload:
    return tiny(train_steps, name="nan_loss", loss=lambda out, target: F.cross_entropy(out, target) * float("nan"))


class _FailsOnTpu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "tpu":
            raise NotImplementedError("'aten::imaginary_op' is not implemented for TPU")
        return self.linear(x)


def fails_on_tpu(train_steps: int = 4) -> Workload:
    return tiny(train_steps, name="fails_on_tpu", make_model=lambda seed: _FailsOnTpu())


def not_a_workload(train_steps: int = 4) -> str:
    return "nope"


def tiny_tokens(train_steps: int = 4) -> Workload:
    """Token ids in, per-position logits out (an embedding and a linear head): the integer-input case for serve."""

    def make_model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 3))

    def make_batch(shape: Shape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, 10, (shape.batch, shape.seq or 6), generator=torch.Generator().manual_seed(seed))
        return tokens, tokens % 3

    return tiny(
        train_steps,
        name="tiny_tokens",
        make_model=make_model,
        make_batch=make_batch,
        loss=lambda out, target: F.cross_entropy(out.reshape(-1, 3), target.reshape(-1)),
        shapes=[Shape(4, 6)],
    )
