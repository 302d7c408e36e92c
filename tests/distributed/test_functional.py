"""Functional collectives (`torch.distributed._functional_collectives`) on tpu with 2 processes on loopback:
in eager (Strict and Fused, `spmd_safe`) and inside torch.compile, exact against a local computation, and the
compiled graphs' handshake (`workers_functional.py` holds what each rank runs)."""

import launch


def test_functional_collectives_compiled_and_eager_exact_against_a_local_computation():
    results = launch.launch("workers_functional.functional", timeout=90)
    launch.check(results)
    assert all("functional checks passed" in r.output for r in results)


def test_ranks_compiling_different_graphs_or_clusters_fail_on_every_rank_naming_both_fingerprints():
    results = launch.launch("workers_functional.handshake", timeout=90)
    launch.check(results)
    named = [line for r in results for line in r.output.splitlines() if line.startswith("mismatch fingerprints")]
    assert len(named) == 2 and named[0] == named[1], named


def test_compiled_collectives_over_subgroups_of_four_ranks_run_on_each_groups_mesh():
    launch.check(launch.launch("workers_functional.subgroups", nprocs=4, timeout=120))
