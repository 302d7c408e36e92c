"""Example workloads for `torch-tpu evaluate`: an MLP classifier and a small transformer LM, both on synthetic data.

    torch-tpu evaluate examples.workloads:mlp --reference cpu --out report/
    torch-tpu evaluate examples.workloads:tiny_lm --reference cpu --out report/

The data is synthetic but learnable (a fixed random "teacher" for the MLP, a counting sequence for the LM), so the
quality contract is a real one: a model that did not train does not meet it. Everything is small enough for
`make demo` to run the whole protocol on two CPU cores in a few minutes.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from torch_tpu.kit.workload import Shape, Workload


def _accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    return float((output.argmax(-1) == target).float().mean().cpu())


def mlp(features: int = 32, classes: int = 8, train_steps: int = 20) -> Workload:
    """A 2-layer MLP learning labels from a fixed random linear teacher; contract: held-out accuracy >= 0.6."""
    teacher = torch.Generator().manual_seed(1234)
    weights = torch.randn(features, classes, generator=teacher)

    def make_model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(features, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, classes))

    def make_batch(shape: Shape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(shape.batch, features, generator=generator)
        return inputs, (inputs @ weights).argmax(-1)

    return Workload(
        name="mlp",
        description=f"MLP {features}->64->{classes}, synthetic teacher labels",
        make_model=make_model,
        make_batch=make_batch,
        loss=F.cross_entropy,
        metric=_accuracy,
        metric_name="accuracy",
        quality_target=0.6,
        train_steps=train_steps,
        learning_rate=1e-2,
        shapes=[Shape(128), Shape(32), Shape(128, dtype="bfloat16")],
        latency_slo_ms=250.0,
    )


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width // self.heads)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        attention = scores.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A decoder-only transformer: token + position embeddings, causal blocks, tied-free output head."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, max_seq: int) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(max_seq, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def tiny_lm(vocab: int = 32, width: int = 32, heads: int = 2, layers: int = 1, train_steps: int = 40) -> Workload:
    """A small causal LM on counting sequences (next = token + step mod vocab); contract: accuracy >= 0.5."""

    def make_model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return TinyLM(vocab, width, heads, layers, max_seq=64)

    def make_batch(shape: Shape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        seq = shape.seq or 16
        start = torch.randint(0, vocab, (shape.batch, 1), generator=generator)
        stride = torch.randint(1, 3, (shape.batch, 1), generator=generator)
        tokens = (start + stride * torch.arange(seq + 1)) % vocab
        return tokens[:, :-1], tokens[:, 1:]

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.float().reshape(-1, output.shape[-1]), target.reshape(-1))

    return Workload(
        name="tiny_lm",
        description=f"decoder-only LM: vocab {vocab}, width {width}, {layers} layer(s), synthetic",
        make_model=make_model,
        make_batch=make_batch,
        loss=loss,
        metric=_accuracy,
        metric_name="next-token accuracy",
        quality_target=0.5,
        train_steps=train_steps,
        learning_rate=3e-3,
        shapes=[Shape(16, 16), Shape(16, 32), Shape(16, 16, "bfloat16")],
        latency_slo_ms=500.0,
        # Megatron's MLP split: the first linear by columns, the second by rows (one all-reduce per block).
        tp_plan={
            **{f"blocks.{i}.mlp.0": "colwise" for i in range(layers)},
            **{f"blocks.{i}.mlp.2": "rowwise" for i in range(layers)},
        },
    )
