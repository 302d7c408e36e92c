"""Kernels: `F.scaled_dot_product_attention` on tpu by the kernel path (the platform's float32 kernel: splash on TPU
and CPU, Pallas GPU flash attention on GPU; `sdpa.force(kernel)`, or `--kernel`) and by the XLA (math) path,
beside CPU PyTorch's SDPA, causal, forward and forward+backward, eager (Strict), in one process; and
`jax_op`'s per-call overhead against the same computation as ATen ops (section `jax_op`).

On the XLA CPU platform the kernel runs in Pallas interpret mode (plain HLO emulating the kernel's blocks), so it is
expected to be much slower there: the figure that matters comes from a TPU or GPU run (bench/device_run.sh).
Usage: python bench/kernels.py [--batch 2] [--heads 8] [--length 1024] [--dim 64] [--repeats 3] [--calls 2000]
       [--kernel splash|pallas_gpu|...] [--sections attention jax_op]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
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
    kernel = args.kernel or ("pallas_gpu" if where == "gpu" else "splash")
    print(f"attention (B, H, T, D) = {shape}, causal, float32, eager, tpu platform: {where}, kernel: {kernel}")
    if where == "cpu":
        print("  note: on the CPU platform the kernel runs in Pallas interpret mode, expected to be far slower; the")
        print("  kernel figure that matters is a TPU or GPU run's")
    paths = {
        "kernel": (lambda: _attention_runs(*tpu, kernel), torch.tpu.synchronize),
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
        print(f"  {phase}: kernel / xla = {times['kernel'] / times['xla (math)']:.2f}")


def scaled_gelu(x: jax.Array, y: jax.Array, alpha: float) -> jax.Array:
    return jax.nn.gelu(x) * y * alpha


def add(x: jax.Array, y: jax.Array) -> jax.Array:
    return x + y


def per_call_us(runners: dict[str, Callable[[], object]], calls: int, repeats: int) -> dict[str, float]:
    """Median over `repeats` of the µs per call of each runner (`calls` calls, then one synchronisation)."""
    for run in runners.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            for _ in range(calls):
                result = run()
            torch.tpu.synchronize()
            jax.block_until_ready(result) if isinstance(result, jax.Array) else None
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def jax_op_overhead(args: argparse.Namespace) -> None:
    """`jax_op` per-call overhead: µs per eager call of a JAX function made an op, against the same computation as
    ATen ops on `tpu` and as one jitted JAX call (the floor), at 8 elements (dispatch, not compute, dominates);
    the runners take turns within each repeat."""
    gelu_op = torch.tpu.pallas.jax_op("bench::scaled_gelu", scaled_gelu)
    add_op = torch.tpu.pallas.jax_op("bench::add", add)
    x, y = torch.randn(8, device="tpu"), torch.randn(8, device="tpu")
    jx, jy = torch_tpu_arrays(x, y)
    jitted = jax.jit(scaled_gelu, static_argnums=2)
    runners = {
        "jax_op scaled_gelu": lambda: gelu_op(x, y, 0.5),
        "aten gelu*y*alpha (3 ops)": lambda: F.gelu(x, approximate="tanh") * y * 0.5,
        "jax.jit scaled_gelu": lambda: jitted(jx, jy, 0.5),
        "jax_op add": lambda: add_op(x, y),
        "aten add": lambda: torch.add(x, y),
    }
    us = per_call_us(runners, args.calls, max(args.repeats, 7))
    for name, value in us.items():
        print(f"{name:28s} {value:8.1f} us/call")
    ratios = {
        "jax_op / ATen, scaled_gelu (1 op vs 3)": ("jax_op scaled_gelu", "aten gelu*y*alpha (3 ops)"),
        "jax_op / ATen, add (1 op vs 1)": ("jax_op add", "aten add"),
        "jax_op / jax.jit, scaled_gelu": ("jax_op scaled_gelu", "jax.jit scaled_gelu"),
    }
    for label, (ours, baseline) in ratios.items():
        print(f"ratio {label:40s} {us[ours] / us[baseline]:.2f}")


def torch_tpu_arrays(*tensors: torch.Tensor) -> tuple[jax.Array, ...]:
    """The tensors' device arrays (what a jitted JAX call takes)."""
    from torch_tpu import to_jax

    return tuple(to_jax(t) for t in tensors)


# The sections this script runs, by name.
SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {"attention": attention, "jax_op": jax_op_overhead}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024, help="a multiple of 128 (the kernels' tiles)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="eager calls per repeat (jax_op section)")
    kernels = [name for name in sdpa.KERNELS if name != "xla"]
    parser.add_argument("--kernel", choices=kernels, help="the kernel path (default: the platform's)")
    parser.add_argument("--sections", nargs="+", choices=sorted(SECTIONS), default=sorted(SECTIONS))
    args = parser.parse_args()
    for name in args.sections:
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
