"""Distributed evaluation: the workload trained under DDP, FSDP2 or TP on N processes against one process on the
same global batch, with the comparison, per-rank throughput, scaling, collective share and peak memory.

Both runs are `torch_tpu.kit.disttrain` processes launched by `torch_tpu.kit.launch` (loopback, free port, hard
timeout), eager mode, the same data stream and the same seed. The N-process loss of a step is the mean of the
ranks' slice losses (DDP/FSDP2: equal slices of a mean loss, so it is the global batch's loss) or the replicated
loss (TP). The comparison uses the declared precision policy's loss tolerance for the curve; the final parameters
get the same rtol and an atol tied to the optimizer: AdamW moves a parameter by about the learning rate per step
whatever its gradient's size, so a near-zero gradient whose sign differs only by the order of a sum (N partial
sums against one) may move a parameter by up to 2 x lr once. `PARAMETER_ATOL_LR_STEPS` x lr x steps bounds that,
with a margin of ~10x over what 2-rank float32 runs show (see docs/kit.md), and far below a wrong gradient.
"""

from __future__ import annotations

import pathlib
import shutil
import statistics
from typing import Any

from torch_tpu.kit import launch

PARAMETER_ATOL_LR_STEPS = 0.05
WARMUP_STEPS = 2  # first steps build and cache the eager kernels: excluded from the throughput figures
DEFAULT_TIMEOUT_S = 300.0


def arguments(spec: str, strategy: str, steps: int) -> list[str]:
    return ["--workload", spec, "--strategy", strategy, "--steps", str(steps)]


def global_losses(run: dict[str, Any]) -> list[float]:
    """Per step, the mean over ranks of the ranks' losses (only steps every rank finished)."""
    curves = [[s["loss"] for s in rank["steps"]] for rank in run["ranks"]]
    steps = min(len(curve) for curve in curves)
    return [statistics.fmean(curve[i] for curve in curves) for i in range(steps)]


def _timing(rank: dict[str, Any], global_batch: int) -> dict[str, Any]:
    steady = rank["steps"][WARMUP_STEPS:] or rank["steps"]
    step_s = statistics.median(s["seconds"] for s in steady)
    total = sum(s["seconds"] for s in steady)
    return {
        "rank": rank["rank"],
        "median_step_seconds": step_s,
        "samples_per_second": rank.get("local_batch", global_batch) / step_s if step_s > 0 else 0.0,
        "global_samples_per_second": global_batch / step_s if step_s > 0 else 0.0,
        "collective_seconds": sum(s["collective_seconds"] for s in steady),
        "collective_share": sum(s["collective_seconds"] for s in steady) / total if total > 0 else 0.0,
        "peak_memory_bytes": rank.get("peak_memory_bytes"),
        "quality": rank.get("quality"),
    }


def evaluate(
    spec: str,
    strategy: str,
    nprocs: int,
    steps: int,
    out: pathlib.Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the single-process reference and the N-process run: the report's `distributed` section, and the
    N-process run itself (a recovery drill reuses it as its uninterrupted run)."""
    import torch

    from torch_tpu.kit import checks
    from torch_tpu.kit import workload as workload_mod

    work = workload_mod.load(spec)
    shape = work.shapes[0]
    section: dict[str, Any] = {"strategy": strategy, "nproc_per_node": nprocs, "steps": steps, "mode": "eager"}
    single_dir, multi_dir = out / "single", out / f"{strategy}-{nprocs}"
    for directory in (single_dir, multi_dir):
        shutil.rmtree(directory, ignore_errors=True)
    single = launch.run(arguments(spec, "single", steps), 1, single_dir, timeout_s)
    multi = launch.run(arguments(spec, strategy, steps), nprocs, multi_dir, timeout_s)
    section["single_wall_seconds"], section["wall_seconds"] = single["wall_seconds"], multi["wall_seconds"]
    for name, run in (("single-process", single), (f"{nprocs}-process {strategy}", multi)):
        if "error" in run:
            section.update(passed=False, error=f"the {name} run failed: {run['error']}")
            return section, multi
    tolerance = checks.policy(shape.dtype)["loss"]
    reference, losses = global_losses(single), global_losses(multi)
    section["losses"] = {"single": reference, "distributed": losses}
    section["per_rank_losses"] = [[s["loss"] for s in rank["steps"]] for rank in multi["ranks"]]
    section["loss_curve"] = checks.compare(torch.tensor(losses), torch.tensor(reference), tolerance)
    expected = torch.load(single_dir / "parameters.pt", weights_only=True)
    got = torch.load(multi_dir / "parameters.pt", weights_only=True)
    atol = PARAMETER_ATOL_LR_STEPS * work.learning_rate * steps
    names = sorted(expected)
    section["parameters"] = checks.compare([got[n] for n in names], [expected[n] for n in names], (tolerance[0], atol))
    section["parameters"]["why"] = f"atol = {PARAMETER_ATOL_LR_STEPS} x lr {work.learning_rate} x {steps} steps"
    quality = {"single": single["ranks"][0]["quality"], "distributed": multi["ranks"][0]["quality"]}
    section["quality"] = {**quality, "metric": work.metric_name, "target": work.quality_target}
    section["meets_contract"] = work.meets_contract(quality["distributed"])
    one = _timing(single["ranks"][0], shape.batch)
    ranks = [_timing(rank, shape.batch) for rank in multi["ranks"]]
    slowest = max(rank["median_step_seconds"] for rank in ranks)
    throughput = shape.batch / slowest if slowest > 0 else 0.0
    section["single"] = one
    section["ranks"] = ranks
    section["global_samples_per_second"] = throughput
    section["scaling_efficiency"] = throughput / (nprocs * one["global_samples_per_second"])
    section["collective_share"] = statistics.fmean(rank["collective_share"] for rank in ranks)
    problems = []
    if not section["loss_curve"]["passed"]:
        problems.append(
            f"{strategy} loss curve differs from one process beyond rtol {tolerance[0]} "
            f"(max rel error {section['loss_curve']['max_rel_error']:.3g})"
        )
    if not section["parameters"]["passed"]:
        problems.append(
            f"{strategy} final parameters differ from one process beyond atol {atol:.3g} "
            f"(max abs error {section['parameters']['max_abs_error']:.3g})"
        )
    if not section["meets_contract"]:
        problems.append(f"{work.metric_name} {quality['distributed']:.4f} under {strategy} misses the contract")
    section["passed"] = not problems
    section["problems"] = problems
    return section, multi


def summary(section: dict[str, Any]) -> str:
    """One line for a gate's reason."""
    if "error" in section:
        return section["error"]
    if section["problems"]:
        return "; ".join(section["problems"])
    return (
        f"{section['nproc_per_node']}-process {section['strategy']} matches one process "
        f"(loss max rel error {section['loss_curve']['max_rel_error']:.2g}, parameters max abs error "
        f"{section['parameters']['max_abs_error']:.2g}); scaling efficiency {section['scaling_efficiency']:.0%}, "
        f"collective share {section['collective_share']:.0%}"
    )
