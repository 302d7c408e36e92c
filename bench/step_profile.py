"""Where a training step's time goes on the device: a JAX profiler capture of a few steps, read back as programs and
HLO ops (torch_tpu.profiler.xspace), per step.

bench/tpu_step.py's `--profile DIR` captures each child's last steps with `capture` and prints `summarize`'s
figures: programs a step, the device's busy milliseconds a step against the wall's (the rest is the host: dispatch,
tracing, waits), and the programs, HLO op kinds (fusion, convolution, copy, scatter, ...) and single ops that take
the most device time. The same capture of plain JAX's step and ours says where ours does more work. With XLA's
optimized HLO of the programs (`--dump-hlo`: `hlo_classes`), the device time is also classed by what each fusion
computes (matrix products, exponentials, reductions, other elementwise work, copies, relayouts, slices, pads).
"""

from __future__ import annotations

import collections
import functools
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


def instruction(name: str) -> str:
    """An HLO op's instruction name from its profiler name, which on a TPU is the whole instruction's text
    (`fusion.96 = f32[...] fusion(...), kind=kOutput, ...`)."""
    return name.split(" = ", 1)[0].strip().lstrip("%")


def op_kind(name: str) -> str:
    """An HLO op's kind from its instruction name: `fusion.123` -> fusion, `%copy-start.4` -> copy-start."""
    return _NUMBERED.sub("", instruction(name))


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_LINE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
_CLASSES = (  # an op's class: the first whose opcodes its fused computations contain
    ("matmul", ("convolution", "dot")),
    ("exp", ("exponential",)),
    ("reduce", ("reduce", "reduce-window")),
    ("gather/scatter", ("gather", "scatter")),
    ("slice/pad/concatenate", ("slice", "dynamic-slice", "dynamic-update-slice", "pad", "concatenate")),
    ("transpose", ("transpose",)),
)


def _opcode(rest: str) -> str:
    """The opcode of an HLO instruction from the text after `=`: its result type (a tuple's in parentheses), then
    the opcode and its operands."""
    if rest.startswith("("):
        depth = 0
        for end, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                rest = rest[end + 1 :]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else rest
    return rest.strip().split("(", 1)[0]


def hlo_classes(text: str) -> dict[str, str]:
    """Each instruction's class in an optimized HLO module's text: a fusion's by the opcodes its computation (and
    those it calls) holds (`_CLASSES`, else "elementwise"), any other instruction's its kind (`op_kind`: copy,
    reshape, pad, slice-done, ...)."""
    computations: dict[str, list[tuple[str, str, str | None]]] = {}
    body: list | None = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            body = computations.setdefault(header.group(1), [])
            continue
        found = _LINE.match(line)
        if found and body is not None:
            callee = re.search(r"calls=%?([\w.\-]+)", found.group(2))
            body.append((found.group(1), _opcode(found.group(2)), callee.group(1) if callee else None))

    @functools.cache
    def opcodes(computation: str) -> frozenset[str]:
        held = set()
        for _, opcode, callee in computations.get(computation, []):
            held.add(opcode)
            if callee is not None:
                held |= opcodes(callee)
        return frozenset(held)

    classes = {}
    for instructions in computations.values():
        for name, opcode, callee in instructions:
            if opcode == "fusion" and callee:  # by what it computes
                held = opcodes(callee)
                classes[name] = next((kind for kind, codes in _CLASSES if held & set(codes)), "elementwise")
            elif opcode in ("dot", "convolution"):  # a product XLA left unfused
                classes[name] = "matmul"
            else:  # copy, reshape, pad, slice-done (an async-done), ...
                classes[name] = op_kind(name)
    return classes


def summarize(executions: list, steps: int, wall_s: float, top: int = 8, classes: dict | None = None) -> dict:
    """Per-step figures of `executions` (xspace.Execution, the capture's programs) over `steps` steps; with
    `classes` (program name -> `hlo_classes` of its HLO), the device time by class too."""
    programs: collections.Counter = collections.Counter()
    program_ns: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    by_class: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    busy_ns = 0
    for execution in executions:
        programs[execution.name] += 1
        busy_ns += execution.end_ns - execution.start_ns
        program_ns[execution.name] += execution.end_ns - execution.start_ns
        known = (classes or {}).get(execution.name, {})
        for op in execution.ops:
            took, name = op.end_ns - op.start_ns, instruction(op.name)
            kind = _NUMBERED.sub("", name)
            kinds[kind] += took
            by_class[known.get(name, kind)] += took
            ops[f"{execution.name}/{name}"] += took
    per_step_ms = lambda ns: round(ns / steps / 1e6, 3)
    return {
        "classes_ms": {kind: per_step_ms(ns) for kind, ns in by_class.most_common(top)} if classes else {},
        "programs_per_step": round(sum(programs.values()) / steps, 2),
        "distinct_programs": len(programs),
        "wall_ms": round(wall_s * 1e3, 3),
        "device_busy_ms": per_step_ms(busy_ns),
        "top_programs_ms": {name: per_step_ms(ns) for name, ns in program_ns.most_common(top)},
        "top_kinds_ms": {kind: per_step_ms(ns) for kind, ns in kinds.most_common(top)},
        "top_ops_ms": {name: per_step_ms(ns) for name, ns in ops.most_common(top)},
    }


def read(folder: str | Path, steps: int, wall_s: float, hlo: str | Path | None = None) -> dict:
    """`summarize` of the capture under `folder` (the newest `.xplane.pb` there), its ops classed by the optimized
    HLO XLA dumped under `hlo` (`module_N.PROGRAM....after_optimizations.txt`) where given."""
    from torch_tpu.profiler import xspace

    files = sorted(Path(folder).rglob("*.xplane.pb"), key=lambda path: path.stat().st_mtime)
    if not files:
        return {"error": f"no .xplane.pb under {folder}"}
    classes = {}
    for path in sorted(Path(hlo).glob("*after_optimizations.txt")) if hlo else []:
        classes.setdefault(path.name.split(".")[1], {}).update(hlo_classes(path.read_text()))
    return summarize(xspace.read(files[-1]), steps, wall_s, classes=classes or None)


def report(name: str, summary: dict) -> None:
    """`summary` as a few printed lines."""
    if "error" in summary:
        print(f"{name}: profile {summary['error']}")
        return
    print(f"{name}: {summary['programs_per_step']} programs a step ({summary['distinct_programs']} distinct), device "
          f"busy {summary['device_busy_ms']} of {summary['wall_ms']} ms a step")  # fmt: skip
    print("  programs (ms a step): " + ", ".join(f"{k} {v}" for k, v in summary["top_programs_ms"].items()))
    print("  kinds (ms a step): " + ", ".join(f"{k} {v}" for k, v in summary["top_kinds_ms"].items()))
    if summary.get("classes_ms"):
        print("  classes (ms a step): " + ", ".join(f"{k} {v}" for k, v in summary["classes_ms"].items()))
    for op, ms in summary["top_ops_ms"].items():
        print(f"  {ms:9.3f} ms  {op}")
