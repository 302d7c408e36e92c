"""`torch-tpu`: the migration kit's command line (smoke, evaluate, drill, k8s, doctor, serve).

Argument parsing only; each command lives in its own module so it can be imported and tested without a shell.
Exit status is 0 only when the command's result is a pass, so CI and Jobs can rely on it; `evaluate` tells a
failed evaluation (1) from bad input (2) and from inconclusive evidence (3), see EVALUATE_EXIT_CODES.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from torch_tpu.kit import arguments, distributed_cli


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

    options = arguments.options(
        evaluate.Options,
        args,
        out=pathlib.Path(args.out),
        modes=tuple(args.modes.split(",")),
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
    import shlex

    from torch_tpu.kit import k8s

    try:
        serve = None
        if args.serve:
            if not args.workload:
                raise k8s.ManifestError("--serve needs --workload MODULE:CALLABLE")
            warmup = args.warmup_seconds
            if args.warmup_from_report:
                warmup = k8s.startup_seconds_from_report(args.warmup_from_report, args.mode)
            serve = arguments.options(k8s.Serve, args, warmup_seconds=warmup)
        spec = arguments.options(
            k8s.JobSpec,
            args,
            name=args.name or ("torchtpu-serve" if serve else "torchtpu-smoke"),
            deadline_seconds=args.deadline,
            ttl_seconds=args.ttl,
            egress=tuple(args.egress),
            serve=serve,
            program=tuple(shlex.split(args.program)) if args.program else None,
        )
        text = k8s.render(spec)
    except k8s.ManifestError as exc:
        print(f"torch-tpu k8s: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from torch_tpu.kit import doctor

    report = doctor.gather(connect_timeout=args.connect_timeout)
    print(json.dumps(report, indent=2, default=str) if args.json else doctor.format_text(report))
    return doctor.exit_code(report)


def _serve(args: argparse.Namespace) -> int:
    try:
        from torch_tpu.kit import serve
    except ImportError as exc:
        print(f"torch-tpu serve needs the serve extra (pip install 'torch_tpu[serve]'): {exc}", file=sys.stderr)
        return 2
    from torch_tpu.kit.workload import WorkloadError

    options = arguments.options(serve.Options, args, drain_timeout_s=args.drain_timeout)
    try:
        return serve.run(options)
    except (WorkloadError, ValueError) as exc:
        print(f"torch-tpu serve: {exc}", file=sys.stderr)
        return 2


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="an HTTP inference server (KServe V1) for a workload's model, with probes and /metrics",
        description="Serve a workload's model on tpu: POST /v1/models/<name>:predict, /healthz, /readyz, /metrics.",
    )
    serve.add_argument("workload", help="module:callable returning a torch_tpu.kit.workload.Workload")
    serve.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    serve.add_argument("--host", default="0.0.0.0", help="listen address (default all)")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--dtype", help="serving dtype (default: the catalogue's first shape's)")
    serve.add_argument("--max-batch", type=int, help="instances per device batch (default: largest catalogued)")
    serve.add_argument("--max-wait-ms", type=float, default=5.0, help="longest wait for a batch to fill")
    serve.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to drain on SIGTERM")
    serve.set_defaults(func=_serve)


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
    ev.add_argument("--metrics-port", type=int, help="serve Prometheus metrics of the run on this port")
    ev.add_argument("--metrics-host", default="0.0.0.0", help="address for --metrics-port (default all)")
    ev.set_defaults(func=_evaluate)
    distributed_cli.add_arguments(ev, drill_only=False)  # --nproc-per-node, --strategy, --drill and its options
    distributed_cli.add_drill(sub)

    k8s = sub.add_parser(
        "k8s",
        help="hardened GKE TPU manifests: a Job (single- or multi-host) or, with --serve, a Deployment",
        description="Print hardened manifests for a GKE TPU node pool (docs/kit.md, Kubernetes). Exit 2 when refused.",
    )
    k8s.add_argument("--image", required=True)
    k8s.add_argument("--accelerator", default="tpu-v6e-slice", help="GKE label or v4, v5e/v5litepod, v5p, v6e")
    k8s.add_argument("--topology", default="1x1")
    k8s.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    k8s.add_argument("--chips", "--chips-per-host", dest="chips", type=int, help="chips per host (2x4: 8 or 4)")
    k8s.add_argument("--name", help="default torchtpu-smoke (a Job), torchtpu-serve (--serve)")
    k8s.add_argument("--namespace", default="ml-evaluation")
    k8s.add_argument("--service-account", default="torchtpu-runner", help="dedicated ServiceAccount (no RBAC)")
    k8s.add_argument("--gcp-service-account", help="Workload Identity: annotate the ServiceAccount with this GSA")
    k8s.add_argument("--egress", action="append", default=[], help="allowed egress CIDR or CIDR:PORT (repeat)")
    k8s.add_argument("--deadline", type=int, default=1800, help="activeDeadlineSeconds")
    k8s.add_argument("--ttl", type=int, default=86400, help="ttlSecondsAfterFinished")
    k8s.add_argument("--program", help="multi-host: what torchrun runs per rank (default: the smoke module)")
    k8s.add_argument("--max-restarts", type=int, default=0, help="multi-host: torchrun --max-restarts")
    k8s.add_argument("--checkpoint-claim", help="existing ReadWriteMany PVC for checkpoints and results")
    k8s.add_argument("--checkpoint-storage-class", default="standard-rwx", help="class of the PVC generated")
    k8s.add_argument("--checkpoint-size", default="100Gi")
    k8s.add_argument("--serve", action="store_true", help="a serving Deployment + Service + PDB instead of a Job")
    k8s.add_argument("--workload", help="serve: module:callable of the workload")
    k8s.add_argument("--replicas", type=int, default=2)
    k8s.add_argument("--port", type=int, default=8080)
    k8s.add_argument("--warmup-seconds", type=float, help="serve: measured warm-up that sizes the startupProbe")
    k8s.add_argument("--warmup-from-report", help="serve: take the warm-up from an evaluate report.json")
    k8s.add_argument("--spread-zones", action="store_true", help="serve: spread replicas across zones")
    k8s.set_defaults(func=_k8s)

    doc = sub.add_parser(
        "doctor",
        help="versions, platform, devices, switches, caches, distributed and Kubernetes facts; findings",
        description="Gather the evidence for troubleshooting. Exit 0: no finding; 1: at least one finding.",
    )
    doc.add_argument("--json", action="store_true", help="print the report as JSON (doctor.DOCTOR_SCHEMA)")
    doc.add_argument("--connect-timeout", type=float, default=2.0, help="seconds for the MASTER_ADDR TCP check")
    doc.set_defaults(func=_doctor)
    _serve_parser(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
