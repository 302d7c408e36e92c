"""A cold process's start: seconds to `import torch`, to a first op on `tpu` and to an AdamW over a `tpu`
parameter, with the device opened on the calling thread (TORCH_TPU_OPEN_ON_THREAD=0) and on a thread while Dynamo
imports (=1; the default on a TPU host), each in fresh processes taking turns, and the ratio of their totals.

On a v5e the opening is libtpu's 6-8 s; on the XLA CPU platform it takes milliseconds, so there the two differ by
the thread's cost alone (docs/performance.md holds the chip's figures).
Usage: python bench/cold_start.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, time
began = time.perf_counter()
import torch
imported = time.perf_counter()
(torch.ones(4, device="tpu") * 2).cpu()
first_op = time.perf_counter()
torch.optim.AdamW([torch.nn.Parameter(torch.ones(4, device="tpu"))])
built = time.perf_counter()
print(json.dumps({"import": imported - began, "first_op": first_op - imported, "optimizer": built - first_op,
                  "total": built - began}))
"""
SETTINGS = {"calling thread": "0", "thread": "1"}


def one_process(setting: str) -> dict[str, float]:
    env = {**os.environ, "TORCH_TPU_OPEN_ON_THREAD": setting}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for _ in range(rounds):
        for name, setting in SETTINGS.items():
            runs[name].append(one_process(setting))
    print(f"cold start, s (median of {rounds} fresh processes each)")
    print(f"{'device opened on':<16} {'import':>7} {'first op':>9} {'optimizer':>10} {'total':>7}")
    totals = {}
    for name, samples in runs.items():
        medians = {key: statistics.median(run[key] for run in samples) for key in samples[0]}
        totals[name] = medians["total"]
        print(
            f"{name:<16} {medians['import']:7.2f} {medians['first_op']:9.2f} {medians['optimizer']:10.2f}"
            f" {medians['total']:7.2f}"
        )
    print(f"thread / calling thread: {totals['thread'] / totals['calling thread']:.2f}")


if __name__ == "__main__":
    main()
