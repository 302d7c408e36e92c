"""Distributed checkpoints of an FSDP2 model and its optimizer (`workers_fsdp.check_checkpoints`): `dcp.save`,
`dcp.async_save` and full state dicts (cpu_offload to rank 0, broadcast_from_rank0 back) resume bit-exactly; the
checkpoints go to the launch's scratch directory, which the launch removes."""

import launch
from workers_fsdp import HOWS


def test_checkpoints_of_fsdp2_resume_the_uninterrupted_run():
    results = launch.launch_once("workers_fsdp.two_ranks", nprocs=2, timeout=420)
    launch.check(results)
    for result in results:
        for how in HOWS:
            assert f"checkpoint {how}: the resumed step equals the uninterrupted one" in result.output, result.output


def test_checkpoints_of_fsdp2_times_tensor_parallel_resume_the_uninterrupted_run():
    results = launch.launch_once("workers_fsdp.four_ranks", nprocs=4, timeout=420)
    launch.check(results)
    for result in results:
        for how in HOWS:
            assert f"checkpoint {how}: the resumed step equals the uninterrupted one" in result.output, result.output
