"""The profiler's added cost per op: µs per small Strict-eager op with no profiler, with torch.profiler (CPU), and
with torch.profiler plus ProfilerActivity.TPU (JAX's profiler alongside), in one run, taking turns.

Each repeat times the chain inside an already-entered profile (start, stop and the merge are not per-op costs),
and the profiled runs' ratio to the unprofiled one is printed; the order rotates each repeat. The chain is
bench/eager_overhead.py's.
Usage: python bench/profiler.py [--ops N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from eager_overhead import torch_chain
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()

    x, y = torch.rand(64, 64, device="tpu"), torch.rand(64, 64, device="tpu") * 0.01
    run = torch_chain(x, y, args.ops)
    run()
    torch.tpu.synchronize()
    config = torch.tpu.profiler.TpuProfilerConfig()  # no run_dir: the XSpace is merged, then deleted
    settings = {
        "no profiler": None,
        "torch.profiler CPU": [ProfilerActivity.CPU],
        "torch.profiler CPU+TPU": [ProfilerActivity.CPU, ProfilerActivity.TPU],
    }
    samples: dict[str, list[float]] = {name: [] for name in settings}
    executions = 0
    order = list(settings)
    for repeat in range(args.repeats):
        for name in order[repeat % 3 :] + order[: repeat % 3]:  # each setting first as often: load hits all alike
            activities = settings[name]
            if activities is None:
                start = time.perf_counter()
                run()
                torch.tpu.synchronize()
                samples[name].append((time.perf_counter() - start) / args.ops * 1e6)
                continue
            with profile(activities=activities, experimental_config=config) as prof:
                start = time.perf_counter()
                run()
                torch.tpu.synchronize()
                samples[name].append((time.perf_counter() - start) / args.ops * 1e6)
            if ProfilerActivity.TPU in activities:
                executions = len(prof.profiler._tpu_trace.executions)
    print(
        f"device: {torch.tpu.get_device_name()}; chain of {args.ops} ops on 64x64 float32, {args.repeats} "
        f"interleaved runs; XLA executions in the last CPU+TPU profile: {executions}"
    )
    print(f"{'setting':<26}{'median us/op':>14}{'vs off':>9}{'min us/op':>11}{'vs off':>9}{'added (min)':>13}")
    median = {name: statistics.median(values) for name, values in samples.items()}
    least = {name: min(values) for name, values in samples.items()}  # the least disturbed run, on a loaded machine
    for name in samples:
        print(
            f"{name:<26}{median[name]:>14.1f}{median[name] / median['no profiler']:>8.2f}x{least[name]:>11.1f}"
            f"{least[name] / least['no profiler']:>8.2f}x{least[name] - least['no profiler']:>13.1f}"
        )


if __name__ == "__main__":
    main()
