"""Our compiled training step's programs beside plain JAX's, op by op: where a compiled step does more work.

bench/tpu_step.py's GPT step at one size, in two child processes that dump XLA's HLO (`--xla_dump_to`): plain JAX's
one jitted step, and ours as `torch.compile` of the whole step (zero_grad, forward, backward, optimizer.step), whose
programs are one per graph (Dynamo ends a graph at `loss.backward()`: forward, backward, the optimizer's). For each
program the count of every HLO opcode, before XLA's optimizations (what the lowering emitted) or after (what XLA
made of it on this platform), in a table: JAX's step, ours per graph, ours in all. On the chip the same command
shows the TPU compiler's view (`--stage after`).

    python bench/hlo_compare.py [--size tiny|small|large|mid] [--stage before|after] [--top 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent)  # bench/: tpu_step's model and steps

# `%name = type opcode(`, the type a shape (`bf16[4,128]{1,0}`), a scalar (`f32[]`) or a tuple
_INSTRUCTION = re.compile(r"=\s+(?:\([^=]*?\)|\w+\[[^\]]*\](?:\{[^}]*\})?)\s+([\w\-]+)\(")
# bench/tpu_step.py's sizes and one between small and large: large's bfloat16 at small's shape
MID = (dict(layers=2, d_model=256, heads=4, seq=128, batch=4, vocab=2048), "bfloat16")


def opcodes(text: str) -> collections.Counter:
    """How many instructions of each opcode an HLO module's text holds (all its computations)."""
    return collections.Counter(match.group(1) for match in _INSTRUCTION.finditer(text))


def child(impl: str, size: str, steps: int) -> None:
    """Runs `steps` steps of `impl` (XLA_FLAGS, set by the parent, dumps every program)."""
    import tpu_step

    tpu_step.SIZES["mid"] = MID
    run = tpu_step._jax_step(size) if impl == "jax" else tpu_step._torch_step("whole_step", size)
    for _ in range(steps):
        run()


def programs(folder: Path, stage: str) -> dict[str, collections.Counter]:
    """The step's programs in a dump folder by name (the largest module of each name: the step itself, not the
    small programs set-up runs), each as opcode counts."""
    found: dict[str, tuple[int, collections.Counter]] = {}
    for path in folder.glob(f"module_*.{stage}_optimizations.txt"):
        name = path.name.split(".")[1].removeprefix("jit_")
        text = path.read_text()
        if len(text) > found.get(name, (0, None))[0]:
            found[name] = (len(text), opcodes(text))
    return {name: counts for name, (_, counts) in found.items()}


def _dump(impl: str, args: argparse.Namespace, folder: Path) -> dict[str, collections.Counter]:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={folder} --xla_dump_hlo_as_text"
    env = dict(os.environ, XLA_FLAGS=flags, TORCH_TPU_PERSISTENT_CACHE="0")  # compiled here, not loaded: dumped
    command = [sys.executable, __file__, "--child", impl, "--size", args.size, "--steps", str(args.steps)]
    subprocess.run(command, env=env, check=True, timeout=args.timeout)
    return programs(folder, args.stage)


def table(jax_step: collections.Counter, ours: dict[str, collections.Counter], top: int) -> list[dict]:
    """Rows of the opcodes with the most instructions: JAX's count, ours per graph and in all."""
    graphs = sorted(ours, key=lambda name: ("forward" not in name, "backward" not in name, name))
    total = sum(ours.values(), collections.Counter())
    names = sorted(set(jax_step) | set(total), key=lambda op: -(jax_step[op] + total[op]))
    rows = [{"op": op, "jax": jax_step[op], **{g: ours[g][op] for g in graphs}, "ours": total[op]} for op in names]
    rows.append({"op": "all", "jax": sum(jax_step.values()), **{g: sum(ours[g].values()) for g in graphs}})
    rows[-1]["ours"] = sum(total.values())
    header = ["op", "jax", *graphs, "ours"]
    print("  ".join(f"{h.removeprefix('compiled_graph_'):>12s}" for h in header))
    for row in rows[:top] + rows[-1:]:
        print("  ".join(f"{row[h]!s:>12s}" for h in header))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mid", choices=["tiny", "small", "mid", "large"])
    parser.add_argument("--stage", default="before", choices=["before", "after"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, args.steps)
        return
    with tempfile.TemporaryDirectory() as scratch:
        jax_programs = _dump("jax", args, Path(scratch, "jax"))
        ours = {name: c for name, c in _dump("ours", args, Path(scratch, "ours")).items() if "compiled_graph" in name}
    jax_step = jax_programs.get("step", collections.Counter())
    print(f"{args.size} step, HLO {args.stage} optimizations: instructions per opcode, plain JAX's jitted step and")
    print(f"ours ({len(ours)} programs: the whole step compiled)")
    rows = table(jax_step, ours, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, "stage": args.stage, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
