"""torch.compile(backend="tpu") of parallel models on 2 processes (`workers_compiled_parallel.py`): tensor parallel
(DTensor parameters) and SimpleFSDP (Shard(0) parameters all-gathered by a parametrization) with their collectives
inside the XLA programs and no graph break, and FSDP2 (hooks eager), all training equal to eager and to one
process."""

import launch


@launch.in_shared_launch
@launch.needs_storage_resize
def test_tensor_parallel_simple_fsdp_and_fsdp2_compiled_train_equal_to_eager_and_one_process():
    lines = [f"{name}: compiled and eager equal to one process" for name in ("tensor parallel", "simple fsdp", "fsdp2")]
    launch.check(launch.shared("workers_compiled_parallel.compiled_parallel"), *lines)


@launch.in_shared_launch(4)
def test_compiled_graphs_over_both_dims_of_a_2x2_mesh_run_as_one_program_equal_to_a_local_computation():
    """4 ranks, a (dp, tp) DeviceMesh: funcol collectives over tp, dp and the world in one compiled graph; tensor
    parallel within SimpleFSDP trained compiled (one graph per direction) equal to one process; a graph differing
    on one rank fails the handshake on all four; groups that are not one mesh's dimensions a clear error."""
    launch.check(
        launch.shared("workers_compiled_parallel.mesh_2d", nprocs=4),
        "2-D funcol: one program",
        "2-D handshake: a graph differing on one rank fails on every rank",
        "tp in simple fsdp: compiled and eager",
        "not one mesh's dimensions",
    )
