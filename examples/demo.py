"""Train a small MLP for a few AdamW steps on `tpu` and on CPU side by side; print where it ran and how close.

Run with `make demo`. Pick the PJRT platform with TORCH_TPU_PLATFORM=auto|tpu|gpu|cpu.
"""

from __future__ import annotations

import copy
import time

import torch


def build(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)
    )
    inputs = torch.randn(128, 32)
    labels = torch.randint(0, 10, (128,))
    return model, inputs, labels


def train(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, steps: int) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    model, inputs, labels = build()
    reference = copy.deepcopy(model)
    device = torch.device("tpu")
    print(f"torch {torch.__version__}; device {device}: {torch.tpu.get_device_name()}")
    start = time.perf_counter()
    tpu_losses = train(model.to(device), inputs.to(device), labels.to(device), steps=10)
    torch.accelerator.synchronize()
    tpu_seconds = time.perf_counter() - start
    cpu_losses = train(reference, inputs, labels, steps=10)
    for step, (ours, theirs) in enumerate(zip(tpu_losses, cpu_losses, strict=True)):
        print(f"step {step:2d}  loss tpu {ours:.6f}  cpu {theirs:.6f}  |diff| {abs(ours - theirs):.2e}")
    stats = torch.tpu._get_cache_stats()
    print(
        f"10 AdamW steps on tpu in {tpu_seconds:.2f} s (compiles included); executable cache: "
        f"{stats['num_entries']} executables, {stats['num_cache_hits']}/{stats['num_cache_reqs']} hits"
    )
    print(
        f"parameters live on {next(model.parameters()).device}; memory allocated "
        f"{torch.accelerator.memory_allocated() / 1024:.0f} KiB"
    )


if __name__ == "__main__":
    main()
