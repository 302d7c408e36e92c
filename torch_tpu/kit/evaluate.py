"""`torch-tpu evaluate`: the guide's whole protocol on one workload, ending in five gates and a verdict.

Order matters and follows the guide: compatibility, then correctness, then performance, then operations and cost.
A stage whose prerequisite failed is not run and its gate fails with "not run because ...": the report never
shows a pass that was not earned by a measurement of this run. Every exception is caught at the stage boundary
and written into the report, so a broken workload still produces a report that says which gate failed and why.

A gate is `pass`, `fail` or `inconclusive`: evidence that cannot judge the contract (a latency that never settled)
is inconclusive, and the guide's rule for that is to keep the current path. The verdict is `fail` if any gate
failed, else `inconclusive` if any gate was, else `pass`; `exit_code` maps it to the command's exit status.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from torch_tpu.kit import cost as cost_mod
from torch_tpu.kit import runinfo
from torch_tpu.kit.workload import Workload, WorkloadError

SCHEMA_VERSION = 1
GATES = ("compatibility", "correctness", "performance", "operations", "cost")
# The exit status of `torch-tpu evaluate` (documented in its --help and docs/kit.md). Bad input (an unloadable
# workload, a missing or invalid price file, a usage error) is 2, as argparse's own usage errors are.
EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
BAD_INPUT_ERRORS = ("WorkloadError", "PriceError", "DrillError")


@dataclasses.dataclass
class Options:
    workload: str
    out: pathlib.Path
    reference: str = "cpu"
    prices: str | None = None
    modes: tuple[str, ...] = ("eager", "compiled")
    iterations: int = 50
    train_steps: int | None = None
    performance: bool = True
    nprocs: int = 1  # > 1: also the distributed evaluation (distributed_eval.py) on this many processes
    strategy: str = "ddp"
    drill: Any = None  # a drill.DrillOptions: also the recovery drill, as part of the operations gate
    metrics_port: int | None = None  # Prometheus endpoint of the training run (in the device stages' process)
    metrics_host: str = "0.0.0.0"


def gate(passed: bool, reason: str, **evidence: Any) -> dict[str, Any]:
    return {"status": "pass" if passed else "fail", "reason": reason, "evidence": evidence}


def problems_gate(problems: list[str], passed: Callable[[], str], **evidence: Any) -> dict[str, Any]:
    """A gate that fails naming every problem, else passes with the reason `passed()` gives (called only then: it
    may read what a problem would have left missing)."""
    return gate(not problems, "; ".join(problems) if problems else passed(), **evidence)


def inconclusive(reason: str, **evidence: Any) -> dict[str, Any]:
    return {"status": "inconclusive", "reason": reason, "evidence": evidence}


def not_run(why: str) -> dict[str, Any]:
    return {"status": "fail", "reason": f"not run: {why}", "evidence": {}}


def verdict(gates: dict[str, dict[str, Any]]) -> str:
    """`fail` if any gate failed, else `inconclusive` if any gate could not judge, else `pass`."""
    statuses = {g["status"] for g in gates.values()}
    return "fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"


def exit_code(report: dict[str, Any]) -> int:
    """The command's exit status for a finished report: bad input first, then the verdict."""
    if any(e.get("type") in BAD_INPUT_ERRORS for e in report["errors"]):
        return EXIT_BAD_INPUT
    return {"pass": EXIT_PASS, "inconclusive": EXIT_INCONCLUSIVE}.get(report["verdict"], EXIT_FAIL)


def run(options: Options) -> dict[str, Any]:
    """Run the protocol, write report.json, report.html and logs.jsonl under options.out; return the report."""
    started = time.time()
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    run_id = runinfo.new_run_id()
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "workload_spec": options.workload,
        "reference_device": options.reference,
        "modes": list(options.modes),
        "started_at": started,
        "versions": runinfo.versions(),
        "gates": {},
        "errors": [],
    }
    log = runinfo.Log(run_id, out / "logs.jsonl", stream=sys.stderr, versions=report["versions"])
    try:
        _run(options, report, log)
    except Exception as exc:  # the kit's own bug must still leave a failing report behind
        report["errors"].append({"stage": "kit", "type": type(exc).__name__, "message": str(exc)})
        log.event("kit_error", level="error", error=str(exc))
    for name in GATES:
        report["gates"].setdefault(name, not_run("an earlier stage stopped the evaluation"))
    report["verdict"] = verdict(report["gates"])
    report["finished_at"] = time.time()
    report["wall_seconds"] = report["finished_at"] - started
    from torch_tpu.kit import report as report_mod

    report_mod.write(report, out)
    log.event(
        "verdict",
        verdict=report["verdict"],
        failed=[n for n, g in report["gates"].items() if g["status"] == "fail"],
        inconclusive=[n for n, g in report["gates"].items() if g["status"] == "inconclusive"],
    )
    log.close()
    return report


def _run(options: Options, report: dict[str, Any], log: runinfo.Log) -> None:
    """The stages in order. Every one that uses the device runs in a child process, one at a time, and this
    process never initialises the backend: on a TPU host one process at a time can hold the chip."""
    work = _load(options, report, log)
    if work is None:
        return
    stage_start = time.perf_counter()
    training = _device_stages(options, report, log)
    checks_seconds = time.perf_counter() - stage_start
    if training is None:
        return
    tpu_run = training["tpu"]
    _correctness_gate(report, work, tpu_run, training["reference"], report["correctness"]["forward_backward"])
    perf_seconds = 0.0
    if options.performance:
        perf_start = time.perf_counter()
        report["performance"] = _performance(options, report["run_id"], log)
        perf_seconds = time.perf_counter() - perf_start
        report["gates"]["performance"] = performance_gate(
            report["performance"], work.latency_slo_ms, work.min_samples_per_second
        )
    else:
        report["gates"]["performance"] = not_run("performance measurement was disabled (--no-performance)")
    _operations_gate(report, tpu_run)
    distributed_seconds = _distributed(options, report, log)
    _cost(options, report, log, tpu_run, checks_seconds + perf_seconds + distributed_seconds)


def _load(options: Options, report: dict[str, Any], log: runinfo.Log) -> Workload | None:
    """The workload (its factory must not touch the device: this process never does), or None: bad input."""
    from torch_tpu.kit import workload as workload_mod

    if options.drill is not None and options.nprocs < 2:
        message = "--drill needs --nproc-per-node 2 or more (a drill kills one rank of a group)"
        report["errors"].append({"stage": "load", "type": "DrillError", "message": message})
        return None
    overrides = {"train_steps": options.train_steps} if options.train_steps else {}
    try:
        work = workload_mod.load(options.workload, **overrides)
    except WorkloadError as exc:
        report["errors"].append({"stage": "load", "type": "WorkloadError", "message": str(exc)})
        report["gates"]["compatibility"] = gate(False, f"workload could not be loaded: {exc}")
        log.event("workload_error", level="error", error=str(exc))
        return None
    report["workload"] = work.summary()
    log.context.update(dtype=work.shapes[0].dtype, workload=work.name)
    log.event("start", spec=options.workload)
    return work


def _device_stages(options: Options, report: dict[str, Any], log: runinfo.Log) -> dict[str, Any] | None:
    """Platform, compatibility, correctness evidence and shapes from device_stages' child process; its training
    runs, or None when there are none (the child failed, or a mode failed on tpu)."""
    from torch_tpu.kit import checks, device_stages

    report["precision_policy"] = {d: dict(p) for d, p in checks.PRECISION_POLICY.items()}
    metrics = None if options.metrics_port is None else (options.metrics_port, options.metrics_host)
    found = device_stages.run_in_process(
        report["run_id"], options.workload, options.reference, list(options.modes), options.train_steps, metrics
    )
    if "error" in found:
        report["errors"].append({"stage": "device", "type": "DeviceProcessError", "message": found["error"]})
        report["gates"]["compatibility"] = gate(False, f"the device stages' process failed: {found['error']}")
        log.event("device_error", level="error", error=found["error"])
        return None
    report["platform"] = found["platform"]
    log.context.update(platform=found["platform"]["platform"], topology=found["platform"]["topology"])
    report["correctness"] = {"forward_backward": found["forward_backward"]}
    log.event("correctness_forward_backward", passed=[c["passed"] for c in found["forward_backward"]])
    _compatibility_gate(report, found)
    training = found.get("training")
    if training is None:
        return None
    tpu_run = training["tpu"]
    report["correctness"]["training"] = {"tpu": tpu_run, "reference": training["reference"]}
    log.event(
        "training",
        mode=training["mode"],
        steps=training["steps"],
        losses=tpu_run["losses"],
        quality=tpu_run["quality"],
        failed_step=tpu_run["failed_step"],
    )
    report["shapes"] = found["shapes"]
    shapes = [{k: s.get(k) for k in ("label", "compiles", "compile_seconds")} for s in found["shapes"]]
    log.event("shapes", shapes=shapes)
    return training


def _compatibility_gate(report: dict[str, Any], found: dict[str, Any]) -> None:
    crashed = [c for c in found["forward_backward"] if "error" in c]
    fallbacks = found["cpu_fallbacks"]
    if crashed:
        first = crashed[0]
        reason = f"{first['mode']} failed on tpu: {first['error']['type']}: {first['error']['message']}"
    elif fallbacks:
        reason = f"ops fell back to CPU: {fallbacks}"
    else:
        reason = "every mode ran forward and backward on tpu without CPU fallback"
    report["gates"]["compatibility"] = gate(
        not crashed and not fallbacks,
        reason,
        errors=[{"mode": c["mode"], "shape": c["shape"], **c["error"]} for c in crashed],
        metrics=found["metrics"],
    )


def _cost(options: Options, report: dict[str, Any], log: runinfo.Log, tpu_run: dict[str, Any], seconds: float) -> None:
    """The cost section and gate: `seconds` of machine time against one trained model meeting the contract."""
    report["cost"] = {"machine_seconds": seconds}
    try:
        prices = cost_mod.load_prices(options.prices)
    except cost_mod.PriceError as exc:
        report["gates"]["cost"] = gate(False, str(exc))
        report["errors"].append({"stage": "cost", "type": "PriceError", "message": str(exc)})
        log.event("price_error", level="error", error=str(exc))
        return
    useful = 1 if tpu_run["meets_contract"] else 0
    warm = (report.get("performance") or {}).get("compiled", {}).get("warm", {})
    checkpoint_bytes = (tpu_run.get("resume") or {}).get("checkpoint_bytes", 0)
    report["cost"] = cost_mod.attribute(prices, seconds, checkpoint_bytes, useful, warm.get("samples_per_second"))
    if report.get("drill", {}).get("recovery"):
        report["cost"]["recovery"] = _recovery_cost(prices, report, useful)
    per_result = report["cost"]["cost_per_useful_result"]
    report["gates"]["cost"] = gate(
        per_result is not None,
        f"cost per useful result {per_result:.6f} {report['cost']['currency']} (1 trained model meeting the contract)"
        if per_result is not None
        else "no result met the quality contract, so cost per useful result is unbounded",
        **{k: report["cost"][k] for k in ("total", "useful_results", "cost_per_useful_result")},
    )


def _correctness_gate(
    report: dict[str, Any],
    work: Any,
    tpu_run: dict[str, Any],
    ref_run: dict[str, Any],
    forward_backward: list[dict[str, Any]],
) -> None:
    import torch

    from torch_tpu.kit import checks

    dtype = work.shapes[0].dtype
    problems = [
        f"{c['mode']} {c['shape']['dtype']}: outputs/gradients outside tolerance"
        for c in forward_backward
        if not c["passed"]
    ]
    curve: dict[str, Any] = {"passed": False}
    if tpu_run["failed_step"] is not None:
        failed = tpu_run["failed_step"]
        problems.append(f"training step {failed['step']} failed on tpu: {failed['type']}: {failed['message']}")
    elif ref_run["failed_step"] is not None:
        problems.append(f"reference training failed at step {ref_run['failed_step']['step']}")
    else:
        curve = checks.compare(
            torch.tensor(tpu_run["losses"]), torch.tensor(ref_run["losses"]), checks.policy(dtype)["loss"]
        )
        if not curve["passed"]:
            problems.append(
                f"loss curve differs from reference beyond rtol {curve['rtol']} "
                f"(max rel error {curve['max_rel_error']:.3g})"
            )
        if not tpu_run["meets_contract"]:
            problems.append(
                f"{work.metric_name} {tpu_run['quality']:.4f} on tpu misses the contract "
                f"({'>=' if work.higher_is_better else '<='} {work.quality_target})"
            )
    report["correctness"]["loss_curve"] = curve
    report["gates"]["correctness"] = problems_gate(
        problems,
        lambda: (
            f"outputs, gradients and {len(tpu_run['losses'])}-step loss curve within "
            f"the declared policy; {work.metric_name} {tpu_run['quality']:.4f} meets the contract"
        ),
        loss_curve=curve,
        quality_tpu=tpu_run["quality"],
        quality_reference=ref_run["quality"],
    )


def _performance(options: Options, run_id: str, log: runinfo.Log) -> dict[str, Any]:
    from torch_tpu.kit import perf

    results: dict[str, Any] = {}
    for mode in options.modes:
        cache_root = tempfile.mkdtemp(prefix=f"torch_tpu_kit_cache_{mode}_")  # empty: a cold start
        results[mode] = {}
        for state in ("cold", "warm"):
            log.event("performance_run", mode=mode, cache=state)
            results[mode][state] = perf.run_in_process(options.workload, mode, cache_root, options.iterations, run_id)
            log.event(
                "performance_result",
                mode=mode,
                cache=state,
                **{
                    k: results[mode][state].get(k)
                    for k in ("p50_ms", "p99_ms", "samples_per_second", "first_call_seconds", "error")
                },
            )
        shutil.rmtree(cache_root, ignore_errors=True)
    return results


def _spread(result: dict[str, Any], slo_ms: float | None) -> str:
    spread = result.get("warmup_spread")
    settled = f"last warm-up window medians spread {spread:.0%}" if spread is not None else "warm-up did not settle"
    against = f" against the SLO {slo_ms} ms" if slo_ms is not None else ""
    return (
        f"{settled} (tolerance {result.get('stability_tolerance', 0.15):.0%}); "
        f"p50 {result['p50_ms']:.2f} ms, p90 {result['p90_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms{against}"
    )


def performance_gate(
    perf: dict[str, Any], slo_ms: float | None, min_samples_per_second: float | None = None
) -> dict[str, Any]:
    """Judge the workload's contract (p99 latency SLO, throughput) on every run that reached a steady state.

    A broken run (error, non-finite output) or a settled run that misses the contract fails. A run that never
    settled cannot judge the contract either way — its numbers may still include warm-up or a busy machine — so
    it makes the gate inconclusive, with its spread shown, unless another run already failed it.
    """
    failures, unsettled = [], []
    for mode, runs in perf.items():
        for state, result in runs.items():
            name = f"{mode}/{state}"
            if "error" in result:
                failures.append(f"{name} run failed: {result['error']}")
            elif not result["finite"]:
                failures.append(f"{name} produced non-finite output")
            elif not result["stable"]:
                unsettled.append(f"{name} never reached a stable steady state: {_spread(result, slo_ms)}")
            else:
                if slo_ms is not None and result["p99_ms"] > slo_ms:
                    failures.append(f"{name} p99 {result['p99_ms']:.2f} ms exceeds the SLO {slo_ms} ms")
                throughput = result["samples_per_second"]
                if min_samples_per_second is not None and throughput < min_samples_per_second:
                    failures.append(
                        f"{name} {throughput:.1f} samples/s is below the contract's {min_samples_per_second}"
                    )
    contract = [f"p99 <= {slo_ms} ms"] if slo_ms is not None else []
    contract += [f">= {min_samples_per_second} samples/s"] if min_samples_per_second is not None else []
    evidence = {
        "latency_slo_ms": slo_ms,
        "min_samples_per_second": min_samples_per_second,
        "p99_ms": {f"{m}/{s}": r.get("p99_ms") for m, runs in perf.items() for s, r in runs.items()},
        "samples_per_second": {
            f"{m}/{s}": r.get("samples_per_second") for m, runs in perf.items() for s, r in runs.items()
        },
        "stable": {f"{m}/{s}": r.get("stable") for m, runs in perf.items() for s, r in runs.items()},
    }
    if failures:
        return gate(False, "; ".join(failures + unsettled), **evidence)
    if unsettled:
        return inconclusive(
            "inconclusive, keep the current path until a quieter run settles: " + "; ".join(unsettled), **evidence
        )
    return gate(
        True,
        f"every run reached steady state within the contract ({', '.join(contract)})"
        if contract
        else "every run reached steady state (no latency or throughput contract declared)",
        **evidence,
    )


def _operations_gate(report: dict[str, Any], tpu_run: dict[str, Any]) -> None:
    resume = tpu_run.get("resume")
    problems = []
    if tpu_run["failed_step"] is not None:
        problems.append(f"step {tpu_run['failed_step']['step']} failed: {tpu_run['failed_step']['message']}")
    if resume is None:
        problems.append("checkpoint/resume was not exercised (training stopped before the checkpoint)")
    elif not resume["passed"]:
        problems.append(
            f"resume did not reproduce the next-step loss: {resume.get('error', {}).get('message') or resume}"
        )
    report["gates"]["operations"] = problems_gate(
        problems,
        lambda: (
            f"resume after step {resume['resumed_after_step']} reproduced the "
            f"next-step loss exactly ({resume['resumed_loss']:.6f}); no failed steps"
        ),
        resume=resume,
        failed_step=tpu_run["failed_step"],
    )


def _distributed(options: Options, report: dict[str, Any], log: runinfo.Log) -> float:
    """The distributed evaluation (into the correctness gate) and the drill (into the operations gate); returns
    the chip-seconds they held (wall seconds x processes) for the cost."""
    from torch_tpu.kit import distributed_eval
    from torch_tpu.kit import drill as drill_mod

    if options.nprocs <= 1 and options.drill is None:
        return 0.0
    steps = options.train_steps or report["workload"]["train_steps"]
    section, run = distributed_eval.evaluate(
        options.workload, options.strategy, options.nprocs, steps, options.out / "distributed"
    )
    report["distributed"] = section
    log.event("distributed", **{k: section.get(k) for k in ("strategy", "passed", "scaling_efficiency", "error")})
    correctness = report["gates"]["correctness"]
    if section.get("passed"):
        correctness["reason"] += f"; {distributed_eval.summary(section)}"
    else:
        correctness.update(status="fail", reason=f"{correctness['reason']}; {distributed_eval.summary(section)}")
    correctness["evidence"]["distributed"] = {k: section.get(k) for k in ("loss_curve", "parameters", "quality")}
    seconds = (section.get("single_wall_seconds", 0.0) + section.get("wall_seconds", 0.0)) * options.nprocs
    if options.drill is None:
        return seconds
    options.drill.steps = steps
    drill = drill_mod.run(options.drill, uninterrupted=run if "error" not in run else None)
    report["drill"] = drill
    log.event("drill", passed=drill["passed"], reason=drill["reason"])
    operations = report["gates"]["operations"]
    if not drill["passed"]:
        operations["status"] = "fail"
    operations["reason"] += f"; recovery drill: {drill['reason']}"
    operations["evidence"]["drill"] = {k: drill.get(k) for k in ("recovery", "failure", "gate")}
    return seconds + drill.get("wall_seconds", 0.0) * options.nprocs


def _recovery_cost(prices: dict[str, Any], report: dict[str, Any], useful: int) -> dict[str, Any]:
    drill, section = report["drill"], report["distributed"]
    recovery = drill["recovery"]
    step_seconds = max(rank["median_step_seconds"] for rank in section.get("ranks", [])) if "ranks" in section else 0
    return cost_mod.recovery(
        prices,
        chips=section["nproc_per_node"],
        run_seconds=section.get("wall_seconds", 0.0),
        useful_results=useful,
        lost_seconds=max(recovery["rpo_seconds"], 0.0),
        resume_seconds=recovery["rto_seconds"] or 0.0,
        expected_lost_seconds=drill["options"]["checkpoint_every"] * step_seconds / 2,
    )
