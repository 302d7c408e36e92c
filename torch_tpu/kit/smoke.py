"""The guide's smoke test, made reproducible: one process per mode, the seed's JSON fields plus provenance.

The protocol is the seed's (bf16 MLP 128->256->32, batch 64, inference, synchronize around every timed region),
with two changes the guide itself asks for: warm-up runs until steady state is stable instead of a fixed 5, and
the JSON records platform, compile-cache state (cold/warm, hits) and a run id. Each mode runs in a fresh process
(`python -m torch_tpu.kit.smoke --mode M`) so one mode's compiled executables cannot flatter the other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

MODES = ("eager", "compiled")


def run(mode: str, iterations: int = 50, run_id: str | None = None) -> dict[str, Any]:
    """Run the smoke protocol in this process and return the result record (raises on non-finite output)."""
    if mode not in MODES:
        raise ValueError("mode must be eager or compiled")
    import torch

    from torch_tpu.kit import measure, runinfo

    before = dict(torch.tpu._get_cache_stats()["persistent"])
    torch.manual_seed(42)
    device = torch.device("tpu")
    model = (
        torch.nn.Sequential(
            torch.nn.Linear(128, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 32),
        )
        .eval()
        .to(device=device, dtype=torch.bfloat16)
    )
    x = torch.randn(64, 128).to(device=device, dtype=torch.bfloat16)
    if mode == "compiled":
        model = torch.compile(model, backend="tpu")
    out: dict[str, Any] = {}

    def call() -> None:
        out["y"] = model(x)

    with torch.inference_mode():
        timing = measure.measure(call, batch_size=x.shape[0], iterations=iterations)
        finite = bool(torch.isfinite(out["y"].float()).all().cpu().item())
    summary = timing.summary()
    record = {
        "torch": torch.__version__,
        "torch_tpu": runinfo.versions()["torch_tpu"],
        "mode": mode,
        "first_call_seconds": summary["first_call_seconds"],
        "mean_batch_seconds": summary["mean_batch_seconds"],
        "samples_per_second": summary["samples_per_second"],
        "finite": finite,
        "warmup_calls": summary["warmup_calls"],
        "steady_state_stable": summary["stable"],
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        **runinfo.platform_info(),
        "compile_cache": runinfo.cache_state(before),
        "run_id": run_id or runinfo.new_run_id(),
    }
    if not finite:
        raise RuntimeError(f"Non-finite output: {json.dumps(record)}")
    return record


def run_in_processes(modes: list[str], iterations: int = 50, run_id: str | None = None) -> list[dict[str, Any]]:
    """Run each mode in its own Python process; a failed child becomes a record with `error`, never a pass."""
    from torch_tpu.kit import runinfo

    run_id = run_id or runinfo.new_run_id()
    records = []
    for mode in modes:
        env = {**os.environ, "TORCH_TPU_RUN_ID": run_id}
        child = subprocess.run(
            [sys.executable, "-m", "torch_tpu.kit.smoke", "--mode", mode, "--iterations", str(iterations)],
            capture_output=True,
            text=True,
            env=env,
        )
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        if child.returncode == 0 and lines:
            records.append(json.loads(lines[-1]))
        else:
            records.append(
                {
                    "mode": mode,
                    "run_id": run_id,
                    "finite": False,
                    "error": (child.stderr.strip().splitlines() or ["no output"])[-1],
                    "returncode": child.returncode,
                }
            )
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one smoke-test process for one mode")
    parser.add_argument("--mode", choices=MODES, default=os.environ.get("EXECUTION_MODE", "eager"))
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.mode, args.iterations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
