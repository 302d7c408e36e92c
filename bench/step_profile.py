"""Where a training step's time goes on the device: a JAX profiler capture of a few steps, read back as programs and
HLO ops (torch_tpu.profiler.xspace), per step.

bench/tpu_step.py's `--profile DIR` captures each child's last steps with `capture` and prints `summarize`'s
figures: programs a step, the device's busy milliseconds a step against the wall's (the rest is the host: dispatch,
tracing, waits), and the programs, HLO op kinds (fusion, convolution, copy, scatter, ...) and single ops that take
the most device time. The same capture of plain JAX's step and ours says where ours does more work.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_NUMBERED = re.compile(r"\.\d+$")


def capture(run: Callable[[], Any], steps: int, folder: str | Path, settle: Callable[[], Any] = lambda: None) -> float:
    """Runs `run` `steps` times inside a JAX profiler trace written under `folder`; the wall seconds a step.

    `settle` waits for every program already dispatched; it runs before the trace starts and before it stops, so
    that the capture holds whole steps. A step that ends in `loss.item()` returns once the loss is computed, while
    its backward and optimizer programs still run: without it a capture counted the tail of the step before as a
    program run (the compiled model's backward as 27 ms a step where it takes 49) and cut its own last step."""
    import jax

    settle()
    with jax.profiler.trace(str(folder)):
        began = time.perf_counter()
        for _ in range(steps):
            run()
        settle()
        return (time.perf_counter() - began) / steps


def op_kind(name: str) -> str:
    """An HLO op's kind from its instruction name: `fusion.123` -> fusion, `%copy-start.4` -> copy-start."""
    return _NUMBERED.sub("", name.lstrip("%"))


def summarize(executions: list, steps: int, wall_s: float, top: int = 8) -> dict:
    """Per-step figures of `executions` (xspace.Execution, the capture's programs) over `steps` steps."""
    programs: collections.Counter = collections.Counter()
    program_ns: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    busy_ns = 0
    for execution in executions:
        programs[execution.name] += 1
        busy_ns += execution.end_ns - execution.start_ns
        program_ns[execution.name] += execution.end_ns - execution.start_ns
        for op in execution.ops:
            kinds[op_kind(op.name)] += op.end_ns - op.start_ns
            ops[f"{execution.name}/{op.name}"] += op.end_ns - op.start_ns
    per_step_ms = lambda ns: round(ns / steps / 1e6, 3)
    return {
        "programs_per_step": round(sum(programs.values()) / steps, 2),
        "distinct_programs": len(programs),
        "wall_ms": round(wall_s * 1e3, 3),
        "device_busy_ms": per_step_ms(busy_ns),
        "top_programs_ms": {name: per_step_ms(ns) for name, ns in program_ns.most_common(top)},
        "top_kinds_ms": {kind: per_step_ms(ns) for kind, ns in kinds.most_common(top)},
        "top_ops_ms": {name: per_step_ms(ns) for name, ns in ops.most_common(top)},
    }


def read(folder: str | Path, steps: int, wall_s: float) -> dict:
    """`summarize` of the capture under `folder` (the newest `.xplane.pb` there)."""
    from torch_tpu.profiler import xspace

    files = sorted(Path(folder).rglob("*.xplane.pb"), key=lambda path: path.stat().st_mtime)
    if not files:
        return {"error": f"no .xplane.pb under {folder}"}
    return summarize(xspace.read(files[-1]), steps, wall_s)


def report(name: str, summary: dict) -> None:
    """`summary` as a few printed lines."""
    if "error" in summary:
        print(f"{name}: profile {summary['error']}")
        return
    print(f"{name}: {summary['programs_per_step']} programs a step ({summary['distinct_programs']} distinct), device "
          f"busy {summary['device_busy_ms']} of {summary['wall_ms']} ms a step")  # fmt: skip
    print("  programs (ms a step): " + ", ".join(f"{k} {v}" for k, v in summary["top_programs_ms"].items()))
    print("  kinds (ms a step): " + ", ".join(f"{k} {v}" for k, v in summary["top_kinds_ms"].items()))
    for op, ms in summary["top_ops_ms"].items():
        print(f"  {ms:9.3f} ms  {op}")
