"""Entry point of `launch.shared`: `python run_shared.py NAME:SECONDS:PORT ...` runs each worker (`workers.NAME()`
or `module.NAME()`) in turn in this process, between markers that `launch.shared` splits the output at.

Each worker meets its peers on a MASTER_PORT of its own: torch's own caches (DTensor's lru_caches of meshes and
specs) keep a finished worker's groups, so its store's server, alive, and a later group on that port would read
its stale keys.

A worker that raises is reported and the next one runs, after its process group (if it left one) is destroyed. A
worker still running after its SECONDS ends the process: faulthandler's watchdog thread prints every thread's stack
and exits, so a hang costs its own timeout, not the sum of the launch's; the peers then see a lost rank."""

import faulthandler
import importlib
import os
import sys
import time
import traceback

import torch.distributed as dist

BEGIN, END = "=== shared worker begins: ", "=== shared worker ended: "


def run(worker: str, seconds: float) -> int:
    """0 if `worker` returned, 1 if it raised."""
    module, _, function = worker.rpartition(".")
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        getattr(importlib.import_module(module or "workers"), function)()
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        worker, seconds, port = argument.split(":")
        os.environ["MASTER_PORT"] = port
        print(BEGIN + worker, flush=True)
        started = time.monotonic()
        status = run(worker, float(seconds))
        print(f"{END}{worker} {status} after {time.monotonic() - started:.1f} s", flush=True)
