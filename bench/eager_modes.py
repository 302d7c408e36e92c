"""Strict vs Fused eager vs torch.compile on three workloads, all in one run.

(a) dispatch-bound: MLP 4x256 + head, batch 64, AdamW (its many small ops included), float32 and bfloat16;
(b) compute-bound: MLP 4x1024 + head, batch 256, SGD;
(c) a chain of 200 small elementwise ops on a 64x64 tensor (µs per op).
Each step ends with `loss.item()` (a materialisation point, as in a real loop). The runners of a workload take
turns in rounds; medians per runner.
Usage: python bench/eager_modes.py [--rounds N] [--steps N] [--warmup N]
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


def setup(width: int, batch: int, optimizer: str, dtype: torch.dtype) -> tuple:
    """The model, its optimizer and one batch, on `tpu`, seeded the same for every mode."""
    torch.manual_seed(0)
    model = mlp(width).to("tpu", dtype)
    opt = (
        torch.optim.AdamW(model.parameters(), lr=1e-3)
        if optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=1e-2)
    )
    x = torch.randn(batch, width, device="tpu", dtype=dtype)
    return model, opt, x, torch.randint(0, 10, (batch,), device="tpu")


def training_step(width: int, batch: int, optimizer: str, dtype: torch.dtype) -> Callable[[], Callable[[], float]]:
    def build() -> Callable[[], float]:
        model, opt, x, y = setup(width, batch, optimizer, dtype)

        def step() -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.item()

        return step

    return build


def compiled_step(width: int, batch: int, optimizer: str, dtype: torch.dtype) -> Callable[[], Callable[[], float]]:
    def build() -> Callable[[], float]:
        model, opt, x, y = setup(width, batch, optimizer, dtype)

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


def measure(
    runners: dict[str, tuple[Callable[[], Callable[[], float]], torch.tpu.EagerMode]],
    rounds: int,
    steps: int,
    warmup: int,
) -> dict[str, float | None]:
    """Median seconds per step of each runner (built and warmed up in its mode; None for one that raised there,
    as Google's TorchTPU's compiled AdamW step does). The runners take turns, `steps` steps each per round, so a
    change in the machine's load touches them alike."""
    built = {}
    failed: dict[str, None] = {}
    for name, (build, mode) in runners.items():
        with torch.tpu.set_eager_mode(mode):
            try:
                step = build()
                for _ in range(warmup):
                    step()
            except Exception as error:  # reported, not measured: the other runners still are
                print(f"  {name}: fails: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
                failed[name] = None
                continue
        built[name] = (step, mode, [])
    for _ in range(rounds):
        for step, mode, times in built.values():
            with torch.tpu.set_eager_mode(mode):
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                times.append((time.perf_counter() - start) / steps)
    return {**failed, **{name: statistics.median(times) for name, (_, _, times) in built.items()}}


def _cell(seconds: float | None, scale: float, width: int = 10) -> str:
    return f"{'fails':>{width}}" if seconds is None else f"{seconds * scale:>{width}.2f}"


def _ratio(a: float | None, b: float | None, width: int) -> str:
    return f"{'-':>{width}}" if a is None or b is None else f"{a / b:>{width - 1}.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="steps per runner per round")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    print(
        f"device: {torch.tpu.get_device_name()}; per runner, median of {args.rounds} rounds of {args.steps} steps "
        f"after {args.warmup} warm-up steps, the runners taking turns"
    )
    print(f"{'workload':<44}{'strict':>10}{'fused':>10}{'compiled':>10}{'strict/fused':>14}{'fused/compiled':>16}")
    for name, width, batch, optimizer, dtype in (
        ("(a) MLP 4x256, batch 64, AdamW [ms/step]", 256, 64, "adamw", torch.float32),
        ("(a) the same in bfloat16 [ms/step]", 256, 64, "adamw", torch.bfloat16),
        ("(b) MLP 4x1024, batch 256, SGD [ms/step]", 1024, 256, "sgd", torch.float32),
    ):
        eager = training_step(width, batch, optimizer, dtype)
        t = measure(
            {
                "strict": (eager, STRICT),
                "fused": (eager, FUSED),
                "compiled": (compiled_step(width, batch, optimizer, dtype), STRICT),
            },
            args.rounds,
            args.steps,
            args.warmup,
        )
        print(
            f"{name:<44}{_cell(t['strict'], 1e3)}{_cell(t['fused'], 1e3)}{_cell(t['compiled'], 1e3)}"
            f"{_ratio(t['strict'], t['fused'], 14)}{_ratio(t['fused'], t['compiled'], 16)}"
        )
    ops = 200
    t = measure(
        {"strict": (chain_step(ops), STRICT), "fused": (chain_step(ops), FUSED)}, args.rounds, args.steps, args.warmup
    )
    print(
        f"{'(c) 200 elementwise ops, 64x64 [us/op]':<44}{_cell(t['strict'], 1e6 / ops)}"
        f"{_cell(t['fused'], 1e6 / ops)}{'-':>10}{_ratio(t['strict'], t['fused'], 14)}{'-':>16}"
    )
    stats = torch.tpu._get_cache_stats() if hasattr(torch.tpu, "_get_cache_stats") else None  # ours only
    fused_entries = [e for e in stats["per_entry_stats"] if e["source"] == "fused"] if stats else []
    if fused_entries:
        print(
            f"fused clusters compiled: {len(fused_entries)}; "
            f"largest replayed {max(e['read_count'] for e in fused_entries)} times"
        )


if __name__ == "__main__":
    main()
