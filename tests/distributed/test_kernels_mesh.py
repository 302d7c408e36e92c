"""`torch.tpu.pallas.jax_op(..., mesh=DeviceMesh)` on 1 and 2 processes on loopback (`workers_kernels.py`)."""

import launch
import pytest


@launch.in_shared_launch
@pytest.mark.parametrize("nprocs", [1, 2])
def test_jax_op_over_a_one_rank_device_mesh_and_over_every_rank(nprocs):
    worker = "workers_kernels.mesh_ops"
    results = launch.shared(worker) if nprocs == 2 else launch.launch(worker, nprocs=nprocs, timeout=150)
    launch.check(results, "mesh jax_op checks passed")


@launch.in_shared_launch(4)
def test_jax_op_over_a_submesh_and_over_ranks_no_group_holds_checks_each_call():
    launch.check(launch.shared("workers_kernels.submeshes", nprocs=4), "mesh jax_op submesh checks passed")
