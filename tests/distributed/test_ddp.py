"""DistributedDataParallel on tpu trains equal to one CPU process on the full batch (`workers_ddp.py`): several
buckets, gradient_as_bucket_view, no_sync accumulation, find_unused_parameters, static_graph, Fused eager."""

import launch
from workers_ddp import CONFIGS, FOUR_RANKS


def _check_every_config(results, names):
    launch.check(results, *(f"ddp {name}: parameters match" for name in names))


@launch.in_shared_launch
def test_ddp_on_two_ranks_every_configuration():
    _check_every_config(launch.shared("workers_ddp.train"), list(CONFIGS))


@launch.in_shared_launch(4)
def test_ddp_on_four_ranks():
    _check_every_config(launch.shared("workers_ddp.train_four", nprocs=4), FOUR_RANKS)
