"""Orderly exit (launched by test_exit.py): on a 2x2 DeviceMesh of 4 ranks, ranks 0 and 2 finish first and leave
while ranks 1 and 3, no longer talking to them, do local tpu work for `TPU_DIST_EXIT_LAG` seconds, then their
first collective over their own mesh column (a new XLA communicator: its rendezvous needs JAX's coordination
service, which lives in rank 0's process), and leave too. Rank r leaves by the path `TPU_DIST_EXIT_PATH_<r>`.

Paths: `return` (destroy_process_group, then return), `sys.exit` (destroy, then sys.exit(0)), `os._exit`
(destroy, then os._exit(0), as launchers and some frameworks do: no atexit handler runs), `undestroyed` (return
without destroy_process_group), `handled` (an exception caught and handled, then destroy and return).
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def _row_sum(mesh: DeviceMesh, rank: int) -> torch.Tensor:
    """All-reduce over the "tp" mesh dimension (groups [0, 1], [2, 3]), every rank together: r holds r + 1."""
    tensor = torch.full((4,), float(rank + 1), device="tpu")
    dist.all_reduce(tensor, group=mesh.get_group("tp"))
    return tensor


def _column_sum(mesh: DeviceMesh, rank: int, tensor: torch.Tensor) -> None:
    """All-reduce of a row sum over the "dp" mesh dimension (groups [0, 2], [1, 3]): every element is 1+2+3+4."""
    dist.all_reduce(tensor, group=mesh.get_group("dp"))
    assert tensor.cpu().tolist() == [10.0] * 4, f"rank {rank}: the mesh's all_reduce gave {tensor.cpu()}"


def _leave(rank: int) -> None:
    """Leave by this rank's path; prints when it was done and when it left, so the test can order the ranks' ends."""
    path = os.environ[f"TPU_DIST_EXIT_PATH_{rank}"]
    print(f"exit: rank {rank} done at {time.time():.3f}", flush=True)
    if path == "handled":
        try:
            raise RuntimeError("exit drill: a handled error")
        except RuntimeError as error:
            print(f"exit: rank {rank} handled {error}", flush=True)
    if path != "undestroyed":
        dist.destroy_process_group()
    print(f"exit: rank {rank} leaves by {path} at {time.time():.3f}", flush=True)
    if path == "sys.exit":
        sys.exit(0)
    if path == "os._exit":
        os._exit(0)


def _work_alone(rank: int, seconds: float) -> float:
    """Local tpu work for `seconds` after the finishing ranks have gone; returns the checked result."""
    deadline = time.monotonic() + seconds
    x = torch.arange(16.0, device="tpu").reshape(4, 4)
    steps = 0
    while time.monotonic() < deadline:
        x = (x @ torch.eye(4, device="tpu")) + 1.0
        steps += 1
        time.sleep(0.05)
    expected = torch.arange(16.0).reshape(4, 4) + steps
    torch.testing.assert_close(x.cpu(), expected, msg=lambda m: f"rank {rank}: local work: {m}")
    return float(x.sum().item())


def finish_unevenly() -> None:
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))  # dp groups [0, 2], [1, 3]
    row_sum = _row_sum(mesh, rank)
    if rank in (0, 2):
        _column_sum(mesh, rank, row_sum)
    else:
        total = _work_alone(rank, float(os.environ.get("TPU_DIST_EXIT_LAG", "5")))
        _column_sum(mesh, rank, row_sum)
        print(f"exit: rank {rank} finished alone (checksum {total:.0f})", flush=True)
    _leave(rank)
