"""torch.compile(backend="tpu") of parallel models on 2 processes (`workers_compiled_parallel.py`): tensor parallel
(DTensor parameters) and SimpleFSDP (Shard(0) parameters all-gathered by a parametrization) with their collectives
inside the XLA programs and no graph break, and FSDP2 (hooks eager), all training equal to eager and to one
process."""

import launch


def test_tensor_parallel_simple_fsdp_and_fsdp2_compiled_train_equal_to_eager_and_one_process():
    results = launch.launch("workers_compiled_parallel.compiled_parallel", timeout=150)
    launch.check(results)
    for result in results:
        for name in ("tensor parallel", "simple fsdp", "fsdp2"):
            assert f"{name}: compiled and eager equal to one process" in result.output, result.output[-3000:]
