"""FSDP2 (`fully_shard`) on tpu trains equal to one CPU process on the full batch (`workers_fsdp.py`): default
resharding (its freed parameters' memory really released), no resharding, bfloat16 parameters with float32
reduction, CPU offload with pinned memory, gradient accumulation, Fused eager, with no whole-device synchronisation
per step; a Hugging Face Llama; and FSDP2 x tensor parallel on a (2, 2) mesh."""

import launch
from workers_fsdp import CONFIGS

pytestmark = launch.needs_storage_resize


@launch.in_shared_launch
def test_fsdp2_on_two_ranks_every_configuration_and_llama():
    launch.check(
        launch.shared("workers_fsdp.two_ranks"),
        *(f"fsdp {config.name}: losses and parameters match" for config in CONFIGS),
        "fsdp memory: resharding after forward frees",
        "fsdp llama: losses and parameters match",
    )


@launch.in_shared_launch(4)
def test_fsdp2_times_tensor_parallel_on_a_two_by_two_mesh():
    launch.check(
        launch.shared("workers_fsdp.four_ranks", nprocs=4), "fsdp 2-D (dp, tp) = (2, 2): losses and parameters match"
    )
