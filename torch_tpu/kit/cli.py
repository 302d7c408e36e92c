"""`torch-tpu`: the migration kit's command line (smoke, evaluate, drill, k8s).

Argument parsing only; each command lives in its own module so it can be imported and tested without a shell.
Exit status is 0 only when the command's result is a pass, so CI and Jobs can rely on it; `evaluate` tells a
failed evaluation (1) from bad input (2) and from inconclusive evidence (3), see EVALUATE_EXIT_CODES.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from torch_tpu.kit import distributed_cli


def _smoke(args: argparse.Namespace) -> int:
    from torch_tpu.kit import smoke

    modes = ["eager", "compiled"] if args.mode == "both" else [args.mode]
    records = smoke.run_in_processes(modes, iterations=args.iterations)
    for record in records:
        print(json.dumps(record))
    return 0 if all(r.get("finite") and "error" not in r for r in records) else 1


EVALUATE_EXIT_CODES = """exit status:
  0  pass: every gate passed
  1  fail: a gate failed (its reason says which measurement or check)
  2  bad input: the workload could not be loaded, the price file is missing or invalid, or a usage error
  3  inconclusive: no gate failed, but one could not judge (e.g. a latency that never reached a steady
     state); the guide's rule: keep the current path until a quieter run decides
report.json, report.html and logs.jsonl are written under --out in every case except a usage error."""


def _evaluate(args: argparse.Namespace) -> int:
    from torch_tpu.kit import evaluate

    modes = tuple(args.modes.split(","))
    options = evaluate.Options(
        workload=args.workload,
        out=pathlib.Path(args.out),
        reference=args.reference,
        prices=args.prices,
        modes=modes,
        iterations=args.iterations,
        train_steps=args.steps,
        performance=not args.no_performance,
        **distributed_cli.evaluate_options(args),
    )
    report = evaluate.run(options)
    code = evaluate.exit_code(report)
    bad = " (bad input)" if code == evaluate.EXIT_BAD_INPUT else ""
    print(f"\nverdict: {report['verdict'].upper()}{bad}  (run {report['run_id']}, exit status {code})")
    for name, g in report["gates"].items():
        print(f"  {name:<14} {g['status'].upper():<12} {g['reason']}")
    print(f"report: {pathlib.Path(args.out) / 'report.html'}")
    return code


def _k8s(args: argparse.Namespace) -> int:
    from torch_tpu.kit import k8s

    spec = k8s.JobSpec(
        image=args.image,
        accelerator=args.accelerator,
        topology=args.topology,
        mode=args.mode,
        chips=args.chips,
        name=args.name,
        namespace=args.namespace,
        deadline_seconds=args.deadline,
        ttl_seconds=args.ttl,
    )
    try:
        text = k8s.render(spec)
    except k8s.ManifestError as exc:
        print(f"torch-tpu k8s: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="torch-tpu", description="torch_tpu migration kit")
    sub = top.add_subparsers(dest="command", required=True)

    smoke = sub.add_parser("smoke", help="the guide's smoke test, one process per mode, JSON per mode")
    smoke.add_argument("--mode", choices=("eager", "compiled", "both"), default="both")
    smoke.add_argument("--iterations", type=int, default=50)
    smoke.set_defaults(func=_smoke)

    ev = sub.add_parser(
        "evaluate",
        help="the whole protocol on a workload: gates, report.json, report.html",
        description="Run the migration guide's protocol on a workload and write report.json and report.html.",
        epilog=EVALUATE_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("workload", help="module:callable returning a torch_tpu.kit.workload.Workload")
    ev.add_argument("--reference", default="cpu", help="reference device (default cpu)")
    ev.add_argument("--out", default="report", help="output directory")
    ev.add_argument("--prices", help="price file (JSON) for the cost gate")
    ev.add_argument("--modes", default="eager,compiled")
    ev.add_argument("--iterations", type=int, default=50, help="steady-state calls per performance run")
    ev.add_argument("--steps", type=int, help="training steps (default: the workload's)")
    ev.add_argument("--no-performance", action="store_true", help="skip performance (its gate then fails)")
    ev.set_defaults(func=_evaluate)
    distributed_cli.add_arguments(ev, drill_only=False)  # --nproc-per-node, --strategy, --drill and its options
    distributed_cli.add_drill(sub)

    k8s = sub.add_parser("k8s", help="a hardened Namespace/ServiceAccount/Job manifest for a GKE TPU node pool")
    k8s.add_argument("--image", required=True)
    k8s.add_argument("--accelerator", default="tpu-v6e-slice")
    k8s.add_argument("--topology", default="1x1")
    k8s.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    k8s.add_argument("--chips", type=int, help="cross-check: chips per node you expect")
    k8s.add_argument("--name", default="torchtpu-smoke")
    k8s.add_argument("--namespace", default="ml-evaluation")
    k8s.add_argument("--deadline", type=int, default=1800, help="activeDeadlineSeconds")
    k8s.add_argument("--ttl", type=int, default=86400, help="ttlSecondsAfterFinished")
    k8s.set_defaults(func=_k8s)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
