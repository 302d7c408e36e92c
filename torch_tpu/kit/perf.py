"""One performance run in its own process: `python -m torch_tpu.kit.perf --workload SPEC --mode M`.

A fresh process per (mode, cold|warm) is the only honest way to measure a cold start: in-process caches would
make every run after the first look warm. The parent chooses the persistent cache directory (empty for cold,
the one the cold run filled for warm) through TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT. The process reports the
time from its start to the first result, the first call (compile included), warm-up until stable and the
steady-state latency distribution of an inference batch of the workload's first catalogue shape.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from torch_tpu.kit import child


def run(spec: str, mode: str, iterations: int, progress: bool = False) -> dict[str, Any]:
    import torch

    from torch_tpu.kit import measure, runinfo, workload

    # The parent stamps the launch time: in-process clocks start after `import torch` already happened.
    imported = time.time() - float(os.environ.get("TORCH_TPU_KIT_LAUNCHED_AT", time.time()))
    before = dict(torch.tpu._get_cache_stats()["persistent"])
    work = workload.load(spec)
    shape = work.shapes[0]
    model = work.make_model(0).to(device="tpu", dtype=shape.torch_dtype).eval()
    if mode == "compiled":
        model = torch.compile(model, backend="tpu", dynamic=False)
    inputs, _ = work.make_batch(shape, 7)
    inputs = workload.to_device(inputs, "tpu", shape.torch_dtype)
    out: dict[str, Any] = {}

    def call() -> None:
        out["y"] = model(inputs)

    bar = measure.Progress(f"perf {mode}", iterations, enabled=progress)
    with torch.inference_mode():
        timing = measure.measure(call, batch_size=shape.batch, iterations=iterations, progress=bar)
        finite = bool(torch.isfinite(out["y"].float()).all().cpu())
    bar.close()
    summary = timing.summary()
    summary["compile_seconds"] = max(summary["first_call_seconds"] - summary["p50_ms"] / 1e3, 0.0)
    return {
        "mode": mode,
        "shape": shape.as_dict(),
        "import_seconds": imported,
        "process_to_first_result_seconds": imported + summary["first_call_seconds"],
        "finite": finite,
        "compile_cache": runinfo.cache_state(before),
        **summary,
    }


def run_in_process(
    spec: str, mode: str, cache_root: str, iterations: int, run_id: str, timeout: float = 600
) -> dict[str, Any]:
    """Run `run` in a child process with the given persistent cache; failures come back as `error`."""
    env = child.environment(
        TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=cache_root,
        TORCH_TPU_RUN_ID=run_id,
        TORCH_TPU_KIT_LAUNCHED_AT=repr(time.time()),
    )
    arguments = ["--workload", spec, "--mode", mode, "--iterations", str(iterations)]
    if sys.stderr.isatty():
        arguments.append("--progress")
    return {"mode": mode, **child.run_json("torch_tpu.kit.perf", arguments, env, timeout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one performance measurement process")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--mode", choices=("eager", "compiled"), required=True)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.workload, args.mode, args.iterations, args.progress)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
