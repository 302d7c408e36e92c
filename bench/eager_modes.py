"""Strict vs Fused eager vs torch.compile on three workloads, all in one run.

(a) dispatch-bound: MLP 4x256 + head, batch 64, AdamW (its many small ops included);
(b) compute-bound: MLP 4x1024 + head, batch 256, SGD;
(c) a chain of 200 small elementwise ops on a 64x64 tensor (µs per op).
Each step ends with `loss.item()` (a materialisation point, as in a real loop). Medians of timed steps after warm-up.
Usage: python bench/eager_modes.py [--steps N] [--warmup N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

STRICT = torch.tpu.EagerMode.DEFER_NEVER
FUSED = torch.tpu.EagerMode.DEFER_AND_FUSE


def mlp(width: int, depth: int = 4, classes: int = 10) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(width, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def setup(width: int, batch: int, optimizer: str) -> tuple:
    """The model, its optimizer and one batch, on `tpu`, seeded the same for every mode."""
    torch.manual_seed(0)
    model = mlp(width).to("tpu")
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-2))
    return model, opt, torch.randn(batch, width, device="tpu"), torch.randint(0, 10, (batch,), device="tpu")


def training_step(width: int, batch: int, optimizer: str) -> Callable[[], Callable[[], float]]:
    def build() -> Callable[[], float]:
        model, opt, x, y = setup(width, batch, optimizer)

        def step() -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()

        return step

    return build


def compiled_step(width: int, batch: int, optimizer: str) -> Callable[[], Callable[[], float]]:
    def build() -> Callable[[], float]:
        model, opt, x, y = setup(width, batch, optimizer)

        @torch.compile(backend="tpu")
        def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return lambda: run(x, y).item()

    return build


def chain_step(ops: int) -> Callable[[], Callable[[], float]]:
    def build() -> Callable[[], float]:
        x = torch.rand(64, 64, device="tpu")

        def step() -> float:
            z = x
            for i in range(ops // 4):
                z = z * 0.5
                z = z + x
                z = torch.tanh(z)
                z = z - 0.1 if i % 2 else z + 0.1
            return z[0, 0].item()

        return step

    return build


def measure(build: Callable[[], Callable[[], float]], mode: torch.tpu.EagerMode, steps: int, warmup: int) -> float:
    """Median seconds per step after `warmup` steps, in `mode`."""
    with torch.tpu.set_eager_mode(mode):
        step = build()
        for _ in range(warmup):
            step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    print(f"device: {torch.tpu.get_device_name()}; median of {args.steps} steps after {args.warmup} warm-up steps")
    print(f"{'workload':<44}{'strict':>10}{'fused':>10}{'compiled':>10}{'strict/fused':>14}{'fused/compiled':>16}")
    for name, width, batch, optimizer in (("(a) MLP 4x256, batch 64, AdamW [ms/step]", 256, 64, "adamw"),
                                          ("(b) MLP 4x1024, batch 256, SGD [ms/step]", 1024, 256, "sgd")):
        strict = measure(training_step(width, batch, optimizer), STRICT, args.steps, args.warmup)
        fused = measure(training_step(width, batch, optimizer), FUSED, args.steps, args.warmup)
        compiled = measure(compiled_step(width, batch, optimizer), STRICT, args.steps, args.warmup)
        print(f"{name:<44}{strict * 1e3:>10.2f}{fused * 1e3:>10.2f}{compiled * 1e3:>10.2f}"
              f"{strict / fused:>13.2f}x{fused / compiled:>15.2f}x")
    ops = 200
    strict = measure(chain_step(ops), STRICT, args.steps, args.warmup) / ops
    fused = measure(chain_step(ops), FUSED, args.steps, args.warmup) / ops
    print(f"{'(c) 200 elementwise ops, 64x64 [us/op]':<44}{strict * 1e6:>10.2f}{fused * 1e6:>10.2f}{'-':>10}"
          f"{strict / fused:>13.2f}x{'-':>16}")
    stats = torch.tpu._get_cache_stats()
    fused_entries = [e for e in stats["per_entry_stats"] if e["source"] == "fused"]
    print(f"fused clusters compiled: {len(fused_entries)}; "
          f"largest replayed {max(e['read_count'] for e in fused_entries)} times")


if __name__ == "__main__":
    main()
