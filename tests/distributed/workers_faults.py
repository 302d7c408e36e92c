"""Fault drills (launched by test_faults.py): one rank is killed, raises or hangs in an all_reduce loop.

`TPU_DIST_DRILL_VICTIM` is the rank that fails at step 5, `TPU_DIST_DRILL_TIMEOUT` the group's timeout in
seconds, `TPU_DIST_DRILL_OP` what the loop runs: `tpu` (all_reduce of a tpu tensor, the default), `cpu` (of a
CPU tensor: gloo directly) or `barrier`. The victim prints "drill: fault at <time.time()>" just before its
fault, so that the test can measure how long the job took to end after it.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

_STEPS = 10**6  # the survivors never finish by themselves: only the fault ends the loop


def _all_reduce_loop(fault: Callable[[], None]) -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("TPU_DIST_DRILL_TIMEOUT", "60")))
    dist.init_process_group("tpu_dist", timeout=timeout)
    rank, victim = dist.get_rank(), int(os.environ.get("TPU_DIST_DRILL_VICTIM", "1"))
    kind = os.environ.get("TPU_DIST_DRILL_OP", "tpu")
    tensor = torch.ones(4, device="cpu" if kind == "cpu" else "tpu")
    for step in range(_STEPS):
        if rank == victim and step == 5:
            print(f"drill: fault at {time.time():.3f}", flush=True)
            fault()
        if kind == "barrier":
            dist.barrier()
            continue
        dist.all_reduce(tensor)
        if tensor.cpu().tolist() != [float(dist.get_world_size())] * 4:
            raise AssertionError(f"all_reduce gave {tensor.cpu()}")
        tensor.fill_(1.0)


def killed() -> None:
    _all_reduce_loop(lambda: os.kill(os.getpid(), signal.SIGKILL))


def _fork_then_die() -> None:
    """A forked child (a DataLoader or multiprocessing worker) holds copies of the parent's sockets; the parent's
    death must still end its connections. The child sleeps until the launcher kills its session."""
    if os.fork() == 0:
        time.sleep(10**6)
    os.kill(os.getpid(), signal.SIGKILL)


def killed_with_a_forked_child() -> None:
    _all_reduce_loop(_fork_then_die)


def _raise() -> None:
    raise RuntimeError("drill: this rank fails")


def raising() -> None:
    _all_reduce_loop(_raise)


def exiting() -> None:
    """`sys.exit(3)` takes the clean way out (no exception reaches the excepthook) while its peer waits for it."""
    _all_reduce_loop(lambda: sys.exit(3))


def hung() -> None:
    _all_reduce_loop(lambda: time.sleep(10**6))
