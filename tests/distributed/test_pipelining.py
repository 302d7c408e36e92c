"""MPMD on tpu (`workers_pipelining.py`, 2 processes): the ranks run different programs, the two stages of a
`torch.distributed.pipelining` schedule (GPipe; 1F1B with compiled stages) over send/recv, equal to one process;
and ranks whose sends/recvs, collectives or compiled graphs diverge raise at once on both ranks, naming both."""

import launch

_CHECKS = (
    "pipeline ScheduleGPipe: equal to one process",
    "pipeline Schedule1F1B compiled: equal to one process",
    "divergence both send",
    "divergence shapes",
    "divergence collectives",
    "divergence compiled graphs",
    "pipelining checks passed",
)


@launch.in_shared_launch
def test_pipeline_stages_on_two_ranks_equal_one_process_and_divergence_is_an_error_on_both():
    results = launch.shared("workers_pipelining.pipelining")
    launch.check(results)
    for result in results:
        missing = [check for check in _CHECKS if check not in result.output]
        assert not missing, f"rank {result.rank} lacks {missing}:\n{result.output[-3000:]}"
