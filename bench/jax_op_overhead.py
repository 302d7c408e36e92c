"""`jax_op` per-call overhead: µs per eager call of a JAX function made an op, against the same computation as
ATen ops on `tpu` and as one jitted JAX call (the floor), at 8 elements (dispatch, not compute, dominates).

One run, one process; the runners take turns within each repeat. Prints the ratios the lead folds into
docs/performance.md. Usage: PYTHONPATH=. python bench/jax_op_overhead.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import torch
import torch.nn.functional as F


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
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
    us = per_call_us(runners, args.calls, args.repeats)
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


if __name__ == "__main__":
    main()
