"""Where a step's host time goes: cProfile over a few more steps of a bench child (bench/tpu_step.py --host-profile).

A small step on the chip is bound by its host (the small GPT step's device is busy 1.5 ms of ours' 8): the device
profile (bench/step_profile.py) shows the gaps, this shows what the Python thread that issues the step does in them,
per step: the functions that take the most time themselves (tottime) and with what they call (cumtime). Time in a
call that waits for the device (a loss's `.item()`) is in that call's own time, so waiting and working read apart.
Only the calling thread is profiled: work the autograd engine runs on its device thread shows as the time
`run_backward` spends waiting for it.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

TOP = 15


def _where(key: tuple[str, int, str]) -> str:
    filename, line, function = key
    for marker in ("site-packages/", "/torch_tpu/", "/bench/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{line}({function})" if line else function


def capture(run: Callable[[], Any], steps: int) -> dict:
    """Runs `run` `steps` times under cProfile: the wall ms a step, and the TOP functions by own and by cumulative
    time, each as [where, own ms a step, cumulative ms a step, calls a step]."""
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for _ in range(steps):
        run()
    profiler.disable()
    wall = (time.perf_counter() - began) / steps
    stats = pstats.Stats(profiler).stats
    rows = [
        [_where(key), own / steps * 1e3, cumulative / steps * 1e3, calls / steps]
        for key, (_, calls, own, cumulative, _) in stats.items()
    ]

    def top(column: int) -> list:
        return [[row[0], *(round(value, 3) for value in row[1:])] for row in sorted(rows, key=lambda r: -r[column])]

    return {"wall_ms": round(wall * 1e3, 3), "own": top(1)[:TOP], "cumulative": top(2)[:TOP]}


def report(label: str, profile: dict) -> None:
    print(
        f"host profile, {label}: {profile['wall_ms']:.2f} ms a step under cProfile (ms a step: own, cumulative, calls)"
    )
    for title, column in (("own time", "own"), ("cumulative", "cumulative")):
        print(f"  by {title}:")
        for where, own, cumulative, calls in profile[column]:
            print(f"    {own:8.3f} {cumulative:8.3f} {calls:7.1f}  {where}")
