"""Kernels: `F.scaled_dot_product_attention` on tpu by the kernel path (splash, `sdpa.force("splash")`) and by the XLA
(math) path, beside CPU PyTorch's SDPA, causal, forward and forward+backward, eager (Strict), in one process.

On the XLA CPU platform the splash kernel runs in Pallas interpret mode (plain HLO emulating the TPU kernel's
blocks), so it is expected to be much slower there: the figure that matters comes from a TPU run.
Usage: python bench/kernels.py [--batch 2] [--heads 8] [--length 1024] [--dim 64] [--repeats 3] [--sections ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from torch_tpu.kernels.prebuilt import sdpa
from torch_tpu.runtime import platform


def median_s(run: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    """Median wall time of `run()` (after one warm-up call that compiles), synchronised after each call while its
    result is alive (synchronize waits for live arrays: a dropped result's work would still be running)."""
    result = run()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        sync()
        samples.append(time.perf_counter() - start)
    del result
    return statistics.median(samples)


def _attention_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, path: str | None) -> dict[str, Callable]:
    """Forward, and forward+backward, of causal SDPA on `q, k, v` (`path`: the tpu path forced)."""

    def forward() -> torch.Tensor:
        with sdpa.force(path):  # None: CPU tensors, which never reach the tpu routing
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def backward() -> list[torch.Tensor]:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa.force(path):  # None: CPU tensors, which never reach the tpu routing
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        out.sum().backward()
        return [leaf.grad for leaf in leaves]

    return {"forward": forward, "forward+backward": backward}


def attention(args: argparse.Namespace) -> None:
    """Kernel path vs XLA path vs CPU PyTorch SDPA at (B, H, T, D), causal, float32."""
    shape = (args.batch, args.heads, args.length, args.dim)
    cpu = [torch.randn(shape) for _ in range(3)]
    tpu = [t.to("tpu") for t in cpu]
    where = platform.platform()
    print(f"attention (B, H, T, D) = {shape}, causal, float32, eager, tpu platform: {where}")
    if where != "tpu":
        print("  note: off TPU the splash kernel runs in Pallas interpret mode, expected to be far slower; the")
        print("  kernel figure that matters is a TPU run's (not run here)")
    paths = {
        "kernel (splash)": (lambda: _attention_runs(*tpu, "splash"), torch.tpu.synchronize),
        "xla (math)": (lambda: _attention_runs(*tpu, "xla"), torch.tpu.synchronize),
        "cpu pytorch": (lambda: _attention_runs(*cpu, None), lambda: None),
    }
    for phase in ("forward", "forward+backward"):
        times = {}
        for name, (runs, sync) in paths.items():
            times[name] = median_s(runs()[phase], sync, args.repeats)
        base = times["cpu pytorch"]
        line = ", ".join(
            f"{name} {seconds * 1e3:.1f} ms ({seconds / base:.2f}x cpu)" for name, seconds in times.items()
        )
        print(f"  {phase}: {line}")
        print(f"  {phase}: kernel / xla = {times['kernel (splash)'] / times['xla (math)']:.2f}")


# The sections this script runs, by name. The jax_op per-call overhead (bench/jax_op_overhead.py, `jax_op` against
# the same computation as ATen ops, eager, 8 elements) joins here as a "jax_op" section.
SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {"attention": attention}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024, help="sequence length, a multiple of 128 (splash)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=sorted(SECTIONS))
    args = parser.parse_args()
    for name in args.sections:
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
