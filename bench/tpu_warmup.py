"""Warm-up per op: what the first call of an op costs in Strict eager, against plain JAX's first call of the same
function, each variant in a fresh process of its own (python3 bench/tpu_warmup.py; on the chip
`bench/device_run.sh perf` runs it).

Variants:
  jax           `jax.jit(f)(x)` per op: trace, compile, run (the baseline)
  jax_effort    the same compiled with `exec_time_optimization_effort=-1` (XLA's quicker compile), where this XLA
                takes the option
  ours          torch_tpu Strict eager, a fresh persistent cache (the cold first call, with the disk write)
  ours_nocache  the same without the persistent cache (TORCH_TPU_PERSISTENT_CACHE=0)
  ours_xla      `ours_nocache` with the per-op executables at XLA's own effort (TORCH_TPU_EAGER_COMPILE_EFFORT=default;
                these small programs otherwise compile at its quickest)
  ours_warm     a second process on `ours`'s cache (executables from disk)
Per variant: the sum of the ops' first calls, the median op, the compile part (ours: the executables' recorded
compile time), and the ratio to `jax`. Where the time of a cold Strict step goes starts here (issue: warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

SHAPE = (256, 256)
VARIANTS = ("jax", "jax_effort", "ours", "ours_nocache", "ours_xla", "ours_warm")


def _ops() -> dict[str, tuple[Callable, Callable, int]]:
    """name -> (torch function, jnp function, arity): small programs a training step's eager ops compile."""
    import jax.numpy as jnp
    import torch

    return {
        "sin": (torch.sin, jnp.sin, 1),
        "exp": (torch.exp, jnp.exp, 1),
        "log": (lambda x: torch.log(x.abs() + 1), lambda x: jnp.log(jnp.abs(x) + 1), 1),
        "tanh": (torch.tanh, jnp.tanh, 1),
        "sigmoid": (torch.sigmoid, lambda x: 1 / (1 + jnp.exp(-x)), 1),
        "relu": (torch.relu, lambda x: jnp.maximum(x, 0), 1),
        "neg": (torch.neg, jnp.negative, 1),
        "add": (torch.add, jnp.add, 2),
        "mul": (torch.mul, jnp.multiply, 2),
        "div": (torch.div, jnp.divide, 2),
        "matmul": (torch.matmul, jnp.matmul, 2),
        "sum": (torch.sum, jnp.sum, 1),
        "mean_dim": (lambda x: x.mean(1), lambda x: x.mean(1), 1),
        "amax": (lambda x: x.amax(0), lambda x: x.max(0), 1),
        "softmax": (lambda x: torch.softmax(x, -1), lambda x: jnp.exp(x) / jnp.exp(x).sum(-1, keepdims=True), 1),
        "where": (lambda x: torch.where(x > 0, x, 0.1 * x), lambda x: jnp.where(x > 0, x, 0.1 * x), 1),
        "clamp": (lambda x: x.clamp(-1, 1), lambda x: jnp.clip(x, -1, 1), 1),
        "cumsum": (lambda x: x.cumsum(0), lambda x: jnp.cumsum(x, 0), 1),
        "transpose": (lambda x: x.t().contiguous(), lambda x: x.T, 1),
        "square": (lambda x: x * x, lambda x: x * x, 1),
        # 64-bit integer division, which XLA emulates on a TPU: 15-20 s to compile a program of it there (the sixth
        # device run's ops suite); index arithmetic (`i // 2`) on PyTorch's default integer dtype meets it
        "floor_divide_int64": (lambda x: (x * 100).long() // 7, lambda x: (x * 100).astype(jnp.int64) // 7, 1),
    }


def _time_jax(effort: bool) -> dict[str, float]:
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)  # int64 as torch_tpu computes it (float32 ops are unchanged)
    options = {"exec_time_optimization_effort": -1.0} if effort else None
    inputs = [jax.device_put(np.random.default_rng(i).standard_normal(SHAPE, dtype=np.float32)) for i in range(2)]
    jax.block_until_ready(inputs)
    seconds = {}
    for name, (_, fn, arity) in _ops().items():
        start = time.perf_counter()
        jitted = jax.jit(lambda *a, fn=fn: fn(*a), compiler_options=options)
        jax.block_until_ready(jitted(*inputs[:arity]))
        seconds[name] = time.perf_counter() - start
    return seconds


def _time_ours() -> tuple[dict[str, float], float]:
    import torch

    import torch_tpu  # noqa: F401  (the tpu device)

    inputs = [torch.randn(SHAPE, generator=torch.Generator().manual_seed(i)).to("tpu") for i in range(2)]
    torch.tpu.synchronize()
    before = {e["name"]: e["compilation_duration"] for e in torch.tpu._get_cache_stats()["per_entry_stats"]}
    seconds = {}
    for name, (fn, _, arity) in _ops().items():
        start = time.perf_counter()
        fn(*inputs[:arity])
        torch.tpu.synchronize()
        seconds[name] = time.perf_counter() - start
    after = torch.tpu._get_cache_stats()["per_entry_stats"]
    compile_part = sum(e["compilation_duration"] for e in after if e["name"] not in before)
    return seconds, compile_part


def measure(variant: str) -> dict:
    """One variant, in this process: each op's first-call seconds and (ours) the compile part."""
    if variant.startswith("jax"):
        try:
            return {"seconds": _time_jax(variant == "jax_effort"), "compile": None}
        except Exception as error:  # an XLA without the option: the finding
            return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
    seconds, compile_part = _time_ours()
    return {"seconds": seconds, "compile": compile_part}


def _child(variant: str, cache: str) -> dict:
    from torch_tpu.kit.child import run_json_command

    env = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=cache, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if variant in ("ours_nocache", "ours_xla"):
        env["TORCH_TPU_PERSISTENT_CACHE"] = "0"
    if variant == "ours_xla":
        env["TORCH_TPU_EAGER_COMPILE_EFFORT"] = "default"
    return run_json_command([sys.executable, __file__, "--child", variant], env, timeout=900)


def _report(results: dict[str, dict]) -> None:
    base = results.get("jax", {}).get("seconds")
    base_total = sum(base.values()) if base else None
    print(f"first call of {len(_ops())} ops on {SHAPE} float32, each variant in a fresh process")
    print(f"{'variant':<14}{'total s':>9}{'median ms':>11}{'compile s':>11}{'/jax':>7}")
    for variant, result in results.items():
        if "error" in result:
            print(f"{variant:<14} failed: {result['error']}")
            continue
        total, median = sum(result["seconds"].values()), statistics.median(result["seconds"].values()) * 1e3
        compile_part = "" if result["compile"] is None else f"{result['compile']:.2f}"
        ratio = f"{total / base_total:.2f}" if base_total else ""
        print(f"{variant:<14}{total:>9.2f}{median:>11.1f}{compile_part:>11}{ratio:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="tpu_warmup_") as cache:  # ours then ours_warm share it
        for variant in args.variants.split(","):
            results[variant] = _child(variant, cache)
            if args.json:  # after each variant: a run cut short by its step's timeout keeps what it measured
                with open(args.json, "w") as out:
                    json.dump(results, out, indent=1)
    _report(results)
    sys.exit(1 if any("error" in r for v, r in results.items() if v != "jax_effort") else 0)


if __name__ == "__main__":
    main()
