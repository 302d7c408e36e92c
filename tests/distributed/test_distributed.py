"""torch.distributed on tpu with 2 processes on loopback (`launch.py`): each worker compares with CPU PyTorch."""

import launch


def test_each_rank_owns_its_device_and_its_cache_entries():
    """Under torchrun (its agent, its store on MASTER_PORT: JAX's coordinator must take another port)."""
    launch.check([launch.torchrun("rank_devices")])


@launch.in_shared_launch
def test_collectives_exact_against_a_local_computation():
    launch.check(launch.shared("collectives"))


@launch.in_shared_launch
def test_ddp_trains_equal_to_one_process_on_the_full_batch():
    launch.check(launch.shared("ddp"), "ddp parameters match")


@launch.in_shared_launch
def test_groups_made_one_after_another_in_one_process_leave_nothing_behind():
    launch.check(launch.shared("regroup"), "regroup checks passed")


def test_init_after_a_tpu_tensor_raises():
    results = launch.launch("init_after_a_tensor", nprocs=1)
    launch.check(results)
    assert "raised" in results[0].output
