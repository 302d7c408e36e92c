"""What each rank runs in test_profiler_ranks.py: a profile with ProfilerActivity.TPU on every rank of a 2-process
job, one shared run_dir; each rank checks its own XSpace file, device times and merged trace, and rank 0 sees both
ranks' files."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import socket

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

_TIMEOUT = datetime.timedelta(seconds=60)


def ranks() -> None:
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    run_dir = pathlib.Path(os.environ["TPU_DIST_SCRATCH"]) / "run"
    x = torch.full((8, 8), float(rank + 1), device="tpu")
    w = torch.eye(8, device="tpu")

    def step() -> torch.Tensor:
        with record_function("step"):
            y = x @ w
            dist.all_reduce(y)
            return y

    step()
    torch.tpu.synchronize()
    cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir=run_dir)  # the rank in the file name: $RANK
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.TPU], experimental_config=cfg) as prof:
        y = step()
    expected = float(sum(range(1, world + 1)))
    assert torch.equal(y.cpu(), torch.full((8, 8), expected)), y.cpu()
    mine = prof.profiler._tpu_trace.path
    assert mine.name == f"{socket.gethostname()}_{rank}.xplane.pb", mine
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].self_device_time_total > 0, averages["aten::mm"]
    path = pathlib.Path(os.environ["TPU_DIST_SCRATCH"]) / f"trace{rank}.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    modules = [e for e in trace["traceEvents"] if e.get("cat") == "xla_module"]
    assert any(e["name"] == "jit_aten__mm" and e["args"].get("launched by") == "aten::mm" for e in modules), modules
    dist.barrier()
    if rank == 0:
        found = sorted(p.name for p in run_dir.glob("plugins/profile/*/*.xplane.pb"))
        assert found == sorted(f"{socket.gethostname()}_{r}.xplane.pb" for r in range(world)), found
    dist.destroy_process_group()
