"""Functional collectives (`torch.distributed._functional_collectives`) on tpu with 2 processes on loopback:
in eager (Strict and Fused, `spmd_safe`) and inside torch.compile, exact against a local computation, and the
compiled graphs' handshake (`workers_functional.py` holds what each rank runs)."""

import launch


@launch.in_shared_launch
def test_functional_collectives_compiled_and_eager_exact_against_a_local_computation():
    launch.check(launch.shared("workers_functional.functional"), "functional checks passed")


@launch.in_shared_launch
def test_ranks_compiling_different_graphs_or_clusters_fail_on_every_rank_naming_both_fingerprints():
    results = launch.shared("workers_functional.handshake")
    launch.check(results)
    named = [line for r in results for line in r.output.splitlines() if line.startswith("mismatch fingerprints")]
    assert len(named) == 2 and named[0] == named[1], named


@launch.in_shared_launch(4)
def test_compiled_collectives_over_subgroups_of_four_ranks_run_on_each_groups_mesh():
    launch.check(launch.shared("workers_functional.subgroups", nprocs=4))


def test_compiled_spmd_programs_persist_and_a_second_job_loads_them(tmp_path):
    cache = {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path)}
    runs = [launch.launch("workers_functional.persisted", timeout=90, env=cache) for _ in range(2)]
    for results, expected in zip(
        runs, ("spmd graph compiled cluster compiled", "spmd graph disk cluster disk"), strict=True
    ):
        launch.check(results)
        for result in results:
            assert expected in result.output.splitlines(), result.output[-3000:]
