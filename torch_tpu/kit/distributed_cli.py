"""The command-line flags of the distributed evaluation (`evaluate --nproc-per-node N --strategy S [--drill]`) and
of `torch-tpu drill`, kept apart from cli.py so the commands' parsers stay small; argparse only at import time.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

DRILL_EXIT_CODES = """exit status:
  0  pass: the killed job failed fast, resumed from the last complete checkpoint, reproduced the uninterrupted
     loss curve step for step, and RPO/RTO are within --rpo-steps/--rto-seconds
  1  fail: one of those did not hold (drill.json "problems" says which)
  2  bad input: the workload could not be loaded or the options cannot describe a drill
drill.json and drill.html are written under --out (with the runs' rank logs and the checkpoints)."""


def add_arguments(parser: argparse.ArgumentParser, drill_only: bool) -> None:
    """The flags `drill` and `evaluate` share (evaluate also takes --drill)."""
    parser.add_argument("--nproc-per-node", type=int, default=2 if drill_only else 1, help="processes (loopback)")
    parser.add_argument("--strategy", choices=("ddp", "fsdp2", "tp"), default="ddp")
    if not drill_only:
        parser.add_argument("--drill", action="store_true", help="also run the recovery drill (operations gate)")
    parser.add_argument("--kill-rank", type=int, default=1, help="drill: the rank whose process is SIGKILLed")
    parser.add_argument("--at-step", type=int, default=12, help="drill: kill once that rank finished this step")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="drill: checkpoint every K steps")
    parser.add_argument("--checkpoint-dir", help="drill: checkpoint directory (default OUT/checkpoints)")
    parser.add_argument("--rpo-steps", type=int, default=10, help="drill gate: most steps of work lost")
    parser.add_argument("--rto-seconds", type=float, default=120.0, help="drill gate: most seconds to resume")
    parser.add_argument("--corrupt-latest", action="store_true", help="drill: damage the newest checkpoint first")


def drill_options(args: argparse.Namespace) -> object:
    from torch_tpu.kit import arguments, drill

    return arguments.options(
        drill.DrillOptions,
        args,
        out=pathlib.Path(args.out),
        nprocs=args.nproc_per_node,
        checkpoint_dir=pathlib.Path(args.checkpoint_dir) if args.checkpoint_dir else None,
    )


def evaluate_options(args: argparse.Namespace) -> dict:
    """The evaluate.Options fields these flags set."""
    drill = drill_options(args) if args.drill else None
    return {"nprocs": args.nproc_per_node, "strategy": args.strategy, "drill": drill}


def _drill(args: argparse.Namespace) -> int:
    """`torch-tpu drill`: run it, write drill.json and drill.html, print the verdict; the exit status."""
    from torch_tpu.kit import drill, report
    from torch_tpu.kit.workload import WorkloadError

    options = drill_options(args)
    try:
        result = drill.run(options)
    except (WorkloadError, drill.DrillError) as exc:
        print(f"torch-tpu drill: {exc}", file=sys.stderr)
        return drill.EXIT_BAD_INPUT
    report.write_drill(result, pathlib.Path(args.out))
    code = drill.EXIT_PASS if result["passed"] else drill.EXIT_FAIL
    print(f"drill: {'PASS' if result['passed'] else 'FAIL'} (exit status {code}): {result['reason']}")
    print(f"report: {pathlib.Path(args.out) / 'drill.html'}")
    return code


def add_drill(sub: argparse._SubParsersAction) -> None:
    drill = sub.add_parser(
        "drill",
        help="recovery drill: kill a worker mid-run, resume from the last complete checkpoint, RPO/RTO gate",
        epilog=DRILL_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    drill.add_argument("workload", help="module:callable returning a torch_tpu.kit.workload.Workload")
    drill.add_argument("--out", default="drill", help="output directory")
    drill.add_argument("--steps", type=int, help="training steps (default: the workload's)")
    add_arguments(drill, drill_only=True)
    drill.set_defaults(func=_drill)
