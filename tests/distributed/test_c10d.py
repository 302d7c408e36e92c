"""c10d beyond the plain collectives on 2 ranks (`workers_c10d.py`): meshes without a group (CPU-only code keeps
working), CPU tensors on gloo beside tpu ones, coalesced collectives, views, split_group, the program cache."""

import launch


@launch.in_shared_launch
def test_meshes_mixed_backends_coalescing_views_split_groups_and_the_program_cache():
    launch.check(launch.shared("workers_c10d.run"), "c10d checks passed")
