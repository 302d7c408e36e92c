"""The eager collective data path on 2 and 4 processes (`launch.py`): gloo on the device buffers as host memory on
the CPU platform, exact against a local computation; PREMUL_SUM; the default mismatch check and DETAIL's fuller one;
XLA's collective programs, which other platforms run, on this one too."""

import launch
import pytest


@launch.in_shared_launch
@pytest.mark.parametrize("nprocs", [2, 4])
def test_values_exact_against_a_local_computation(nprocs):
    launch.check(launch.shared("workers_data_path.exact", nprocs))


@launch.in_shared_launch
@pytest.mark.parametrize("nprocs", [2, 4])
def test_mismatched_collectives_raise_on_every_rank_and_write_nothing(nprocs):
    launch.check(launch.shared("workers_data_path.mismatches", nprocs))


def test_detail_debug_level_compares_every_tensor():
    launch.check(launch.launch("workers_data_path.detail", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}))


def test_xla_collective_programs_exact_against_a_local_computation():
    """TORCH_TPU_DIST_HOST=0: the route of TPU and GPU platforms, where device memory is not host memory."""
    launch.check(launch.launch("collectives", env={"TORCH_TPU_DIST_HOST": "0"}))
