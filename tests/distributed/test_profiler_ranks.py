"""torch.profiler with ProfilerActivity.TPU on every rank of a 2-process job (`launch.py`): per-rank XSpace files
in one run_dir, device times and merged traces on each rank."""

import launch


@launch.in_shared_launch
def test_every_rank_writes_its_own_xspace_and_merged_trace():
    launch.check(launch.shared("workers_profiler.ranks"))
