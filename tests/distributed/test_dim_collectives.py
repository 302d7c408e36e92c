"""`torch.tpu.ops.all_gather_dim` / `reduce_scatter_dim` on 2 processes on loopback: one launch, eager values and
gradients, compiled, and argument errors, exact against a local computation (`workers_dim_collectives.py`)."""

import launch


@launch.in_shared_launch
def test_dim_collectives_eager_gradients_compiled_and_errors_against_a_local_computation():
    launch.check(launch.shared("workers_dim_collectives.dim_collectives"), "dim collectives checks passed")
