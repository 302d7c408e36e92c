"""The evaluation's device stages in a process of their own: `python -m torch_tpu.kit.device_stages --workload S`.

Platform, forward/backward against the reference (compatibility and correctness), training with checkpoint and
resume, and the shape catalogue all use the device. `torch-tpu evaluate` runs them here, in a child, so that it
never holds the device itself: on a TPU host the performance runs and the distributed ranks that follow need the
chip, and libtpu lets one process at a time hold it. Prints one JSON object: the evidence for evaluate.py's gates.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
from typing import Any


def run(spec: str, reference: str, modes: list[str], steps: int | None) -> dict[str, Any]:
    """The device stages' evidence; training and shapes only when forward and backward ran in every mode."""
    from torch_tpu import metrics
    from torch_tpu.kit import checks, runinfo, workload

    work = workload.load(spec, **({"train_steps": steps} if steps else {}))
    result: dict[str, Any] = {"platform": runinfo.platform_info()}
    metrics.reset()
    result["forward_backward"] = checks.correctness(work, reference, modes)
    result["cpu_fallbacks"] = sorted(metrics.cpu_fallbacks)
    result["metrics"] = metrics.summary()
    if any("error" in c for c in result["forward_backward"]):
        return result
    train_mode = "compiled" if "compiled" in modes else modes[0]
    total = work.train_steps
    with tempfile.TemporaryDirectory(prefix="torch_tpu_kit_ckpt_") as checkpoints:
        tpu_run = checks.train(work, "tpu", train_mode, total, pathlib.Path(checkpoints), max(1, total // 2))
    reference_run = checks.train(work, reference, "eager", total)
    result["training"] = {"mode": train_mode, "steps": total, "tpu": tpu_run, "reference": reference_run}
    result["shapes"] = checks.shape_catalogue(work)
    return result


def run_in_process(
    run_id: str, spec: str, reference: str, modes: list[str], steps: int | None, metrics: tuple[int, str] | None
) -> dict[str, Any]:
    """`run` in a child process; a child that failed (no device, a crash) comes back as `error`. The child
    serves the training run's metrics on `metrics` (port, host) when given: this process has none to serve."""
    from torch_tpu.kit import child

    arguments = ["--workload", spec, "--reference", reference, "--modes", ",".join(modes)]
    arguments += ["--steps", str(steps)] if steps else []
    if metrics is not None:
        arguments += ["--metrics-port", str(metrics[0]), "--metrics-host", metrics[1]]
    return child.run_json("torch_tpu.kit.device_stages", arguments, child.environment(TORCH_TPU_RUN_ID=run_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the evaluation's device stages, in one process")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--reference", default="cpu")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--metrics-host", default="0.0.0.0")
    args = parser.parse_args(argv)
    if args.metrics_port is not None:  # Prometheus endpoint of the training run (torch_tpu.kit.metrics)
        from torch_tpu.kit import metrics

        metrics.serve_http(args.metrics_port, args.metrics_host)
        print(f"metrics: http://{args.metrics_host}:{args.metrics_port}/metrics", file=sys.stderr)
    print(json.dumps(run(args.workload, args.reference, args.modes.split(","), args.steps), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
