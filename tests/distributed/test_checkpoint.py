"""Distributed checkpoints of an FSDP2 model and its optimizer (`workers_fsdp.check_checkpoints`): `dcp.save`,
`dcp.async_save` and full state dicts (cpu_offload to rank 0, broadcast_from_rank0 back) resume bit-exactly; the
checkpoints go to the launch's scratch directory, which the launch removes."""

import launch
import pytest
from workers_fsdp import HOWS

pytestmark = launch.needs_storage_resize


@launch.in_shared_launch
@pytest.mark.parametrize(
    ("worker", "nprocs"),
    [("workers_fsdp.two_ranks", 2), ("workers_fsdp.four_ranks", 4)],
    ids=["fsdp2", "fsdp2_times_tensor_parallel"],
)
def test_checkpoints_resume_the_uninterrupted_run(worker, nprocs):
    lines = [f"checkpoint {how}: the resumed step equals the uninterrupted one" for how in HOWS]
    launch.check(launch.shared(worker, nprocs), *lines)
