"""MPMD on tpu (`workers_pipelining.py`, 2 processes): the ranks run different programs, the two stages of a
`torch.distributed.pipelining` schedule (GPipe; 1F1B with compiled stages) over send/recv, equal to one process;
and ranks whose sends/recvs, collectives or compiled graphs diverge raise at once on both ranks, naming both."""

import launch
import torch

from torch_tpu.distributed import torch_patches

_CHECKS = (
    "pipeline ScheduleGPipe: equal to one process",
    "pipeline Schedule1F1B compiled: equal to one process",
    "divergence both send",
    "divergence shapes",
    "divergence collectives",
    "divergence compiled graphs",
    "pipelining checks passed",
)


@launch.in_shared_launch
def test_pipeline_stages_on_two_ranks_equal_one_process_and_divergence_is_an_error_on_both():
    launch.check(launch.shared("workers_pipelining.pipelining"), *_CHECKS)


def test_a_fork_of_tpu_devices_under_the_cuda_default_forks_the_tpu_rng():
    """torch 2.12's schedule calls `fork_rng(devices=[tpu device])`, whose device_type defaulted to "cuda" there: the
    patch (installed on such a release) forks the tpu's RNG instead, and leaves every other call as it was."""
    fork = torch_patches._fork_rng_of_the_devices_given(torch.random.fork_rng)
    before = torch.tpu.get_rng_state()
    with fork(devices=[torch.device("tpu", 0)], device_type="cuda"):
        inside = torch.rand(4, device="tpu").cpu()
    assert torch.equal(torch.tpu.get_rng_state(), before)  # the draw inside was undone
    assert torch.equal(torch.rand(4, device="tpu").cpu(), inside)
    with fork(devices=[], device_type="cuda"):  # no device: CPU's RNG only, as torch does
        torch.rand(4)
