"""`torch-tpu drill`: kill a real worker mid-run, recover the group from the last complete checkpoint, measure it.

The guide (§6) asks for coordinated recovery of the group, complete checkpoints and a failed-worker test, with
RPO and RTO as acceptance criteria. The drill:

1. runs the job uninterrupted (or takes that run from `evaluate`) — the curve the recovered run must reproduce;
2. runs it again, checkpointing every K steps to a directory outside the run's processes, and SIGKILLs rank
   `kill_rank` by its PID once it reports step `at_step` finished (that rank waits there for the kill, so the
   checkpoints that exist when it lands are those of the steps up to `at_step`, however the ranks are scheduled);
3. watches the surviving ranks fail by themselves (the tpu_dist watchdog ends a job that lost a rank within
   seconds; `DETECT_LIMIT_S` is the most the drill waits before calling it a hang and killing them);
4. picks the newest checkpoint whose `COMPLETE.json` marker and SHA-256s hold (a corrupt or partial one is
   reported and skipped; `corrupt_latest` damages the newest complete one on purpose to prove it), relaunches
   the group from it and lets it finish;
5. reports RPO (steps finished before the failure that the checkpoint does not hold, and the seconds between
   that checkpoint and the failure), RTO (failure to the first step finished after the restart), and whether
   every rank's resumed losses, RNG digests and data positions equal the uninterrupted run's step for step —
   exactly: same program, same inputs, same state must give the same bits;
6. passes when recovery worked, the curve is equal, RPO <= `rpo_steps` and RTO <= `rto_seconds`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import time
from typing import Any

from torch_tpu.kit import distributed_eval, launch
from torch_tpu.kit.disttrain import MARKER, checkpoint_problem

DETECT_LIMIT_S = 60.0  # a job that lost a rank must end within this (the watchdog ends it in seconds)
EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


class DrillError(ValueError):
    """The drill's options cannot describe a drill (a rank or step outside the run)."""


@dataclasses.dataclass
class DrillOptions:
    workload: str
    out: pathlib.Path
    strategy: str = "ddp"
    nprocs: int = 2
    steps: int | None = None
    kill_rank: int = 1
    at_step: int = 12
    checkpoint_every: int = 5
    rpo_steps: int = 10
    rto_seconds: float = 120.0
    checkpoint_dir: pathlib.Path | None = None
    corrupt_latest: bool = False
    timeout_s: float = distributed_eval.DEFAULT_TIMEOUT_S


def validate(options: DrillOptions, steps: int) -> None:
    if not 0 <= options.kill_rank < options.nprocs:
        raise DrillError(f"--kill-rank {options.kill_rank} is not a rank of a {options.nprocs}-process job")
    if not 1 <= options.at_step < steps:
        raise DrillError(f"--at-step {options.at_step} must be in 1..{steps - 1} (the run has {steps} steps)")
    if not 1 <= options.checkpoint_every <= options.at_step:
        raise DrillError(
            f"--checkpoint-every {options.checkpoint_every} must be in 1..{options.at_step}: "
            "a checkpoint must exist before the kill"
        )
    if options.nprocs < 2:
        raise DrillError("a recovery drill needs at least 2 processes (--nproc-per-node)")


def corrupt(directory: pathlib.Path) -> str:
    """Flip bytes in the middle of the checkpoint's largest data file; returns its name."""
    victim = max((p for p in directory.iterdir() if p.is_file() and p.name != MARKER), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    victim.write_bytes(bytes(data))
    return victim.name


def choose_checkpoint(root: pathlib.Path) -> tuple[pathlib.Path | None, list[dict[str, Any]]]:
    """The newest complete checkpoint under `root`, and every candidate looked at with why it was (not) used."""
    seen: list[dict[str, Any]] = []
    for directory in sorted(root.glob("step-*"), reverse=True):
        problem = checkpoint_problem(directory)
        seen.append({"path": str(directory), "problem": problem})
        if problem is None:
            return directory, seen
    return None, seen


def compare_runs(recovered: list[list[dict]], reference: list[list[dict]], first_step: int) -> dict[str, Any]:
    """Per rank, steps >= first_step: losses, RNG digests and data positions equal to the reference's."""
    worst, mismatches, compared = 0.0, [], 0
    for rank, (got, want) in enumerate(zip(recovered, reference, strict=True)):
        expected = {s["step"]: s for s in want}
        for step in (s for s in got if s["step"] >= first_step):
            other = expected.get(step["step"])
            if other is None:
                mismatches.append(f"rank {rank} step {step['step']}: not in the uninterrupted run")
                continue
            compared += 1
            worst = max(worst, abs(step["loss"] - other["loss"]))
            for key in ("loss", "rng_cpu", "rng_device", "position", "lr"):
                if step[key] != other[key]:
                    mismatches.append(f"rank {rank} step {step['step']}: {key} {step[key]} != {other[key]}")
    return {"steps_compared": compared, "max_abs_loss_difference": worst, "mismatches": mismatches[:20]}


def run(options: DrillOptions, uninterrupted: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole drill; `uninterrupted` is a finished `launch.run` of the same job (else one is run here)."""
    from torch_tpu.kit import workload as workload_mod

    started = time.time()
    work = workload_mod.load(options.workload)
    steps = options.steps or work.train_steps
    validate(options, steps)
    out = options.out
    checkpoints = options.checkpoint_dir or out / "checkpoints"
    for directory in (checkpoints, out / "drill-uninterrupted", out / "drill-attempt-1", out / "drill-attempt-2"):
        shutil.rmtree(directory, ignore_errors=True)
    base = distributed_eval.arguments(options.workload, options.strategy, steps)
    result: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in dataclasses.asdict(options).items()},
        "steps": steps,
        "checkpoint_dir": str(checkpoints),
        "started": started,
    }
    if uninterrupted is None:
        uninterrupted = launch.run(base, options.nprocs, out / "drill-uninterrupted", options.timeout_s)
    if "error" in uninterrupted:
        return _finish(result, options, [f"the uninterrupted run failed: {uninterrupted['error']}"])
    saving = [*base, "--checkpoint-dir", str(checkpoints), "--checkpoint-every", str(options.checkpoint_every)]
    failed_at = _kill_mid_run(saving, options, result)
    if failed_at is None:
        return _finish(result, options, [f"rank {options.kill_rank} never reached step {options.at_step}"])
    chosen = _checkpoint_to_resume(checkpoints, options, result)
    if chosen is None:
        return _finish(result, options, ["no complete checkpoint to resume from"])
    resumed = _resume(saving, chosen, failed_at, options, result)
    _compare_curves(uninterrupted, resumed, options, result)
    return _finish(result, options, gate_problems(result, options))


def _kill_mid_run(saving: list[str], options: DrillOptions, result: dict[str, Any]) -> float | None:
    """Attempt 1: run the checkpointing job, SIGKILL `kill_rank` once it finished `at_step`, and watch the
    survivors end (`result["killed"]`, `result["failure"]`); the time of the kill, or None if it never came."""
    held = ["--hold-rank", str(options.kill_rank), "--hold-at-step", str(options.at_step)]
    job = launch.Job([*saving, *held], options.nprocs, options.out / "drill-attempt-1", options.timeout_s)
    failed_at = None
    while job.running() and time.monotonic() < job.deadline:
        progress = job.progress(options.kill_rank)
        if progress and progress[-1]["step"] >= options.at_step:
            failed_at = job.kill(options.kill_rank)
            result["killed"] = {"rank": options.kill_rank, "pid": progress[-1]["pid"], "at_step": progress[-1]["step"]}
            break
        time.sleep(0.02)
    if failed_at is None:
        job.stop()
        return None
    codes = job.wait(DETECT_LIMIT_S)
    ended = time.time()
    survivors = [rank for rank in range(options.nprocs) if rank != options.kill_rank]
    finished = [max((s["step"] for s in job.progress(rank)), default=0) for rank in range(options.nprocs)]
    result["failure"] = {
        "time": failed_at,
        "exit_codes": codes,
        "detection_seconds": ended - failed_at,
        "survivors_failed_by_themselves": all(codes[rank] not in (None, 0) for rank in survivors),
        "last_step_finished": max(finished),
        "survivor_log_tail": job.log_tail(survivors[0], 4),
    }
    return failed_at


def _checkpoint_to_resume(
    checkpoints: pathlib.Path, options: DrillOptions, result: dict[str, Any]
) -> pathlib.Path | None:
    """The newest complete checkpoint (after damaging the newest one, with `corrupt_latest`), recording every
    candidate looked at."""
    if options.corrupt_latest:
        newest, _ = choose_checkpoint(checkpoints)
        if newest is not None:
            result["corrupted"] = {"path": str(newest), "file": corrupt(newest)}
    chosen, looked_at = choose_checkpoint(checkpoints)
    result["checkpoints_considered"] = looked_at
    return chosen


def _resume(
    saving: list[str], chosen: pathlib.Path, failed_at: float, options: DrillOptions, result: dict[str, Any]
) -> dict[str, Any]:
    """Attempt 2: relaunch the group from `chosen` and let it finish; `result["recovery"]` (RPO, RTO) and the
    resumed run's collected ranks."""
    marker = json.loads((chosen / MARKER).read_text())
    restored, marker_time = int(marker["step"]), float(marker["time"])
    attempt = options.out / "drill-attempt-2"
    restart = time.time()
    job = launch.Job([*saving, "--resume", str(chosen)], options.nprocs, attempt, options.timeout_s)
    codes = job.wait()
    resumed = launch.collect(attempt, options.nprocs)
    first = min((s["time"] for s in resumed["ranks"][0]["steps"]), default=None)
    result["recovery"] = {
        "restored_step": restored,
        "restored_from": str(chosen),
        "restart_launched_seconds_after_failure": restart - failed_at,
        "exit_codes": codes,
        "rpo_steps": result["failure"]["last_step_finished"] - restored,
        "rpo_seconds": failed_at - marker_time,
        "rto_seconds": (first - failed_at) if first is not None else None,
        "checkpoint_save_seconds": [c["seconds"] for c in _checkpoints_saved(options.out)],
    }
    result["resumed_exit_codes_tail"] = job.log_tail(0, 4) if any(code != 0 for code in codes) else ""
    return resumed


def _compare_curves(
    uninterrupted: dict[str, Any], resumed: dict[str, Any], options: DrillOptions, result: dict[str, Any]
) -> None:
    """Both attempts' steps against the uninterrupted run's, each rank's, and the three global loss curves."""
    reference = [rank["steps"] for rank in uninterrupted["ranks"]]
    before = launch.collect(options.out / "drill-attempt-1", options.nprocs)
    restored = result["recovery"]["restored_step"]
    result["curve_before_failure"] = compare_runs([r["steps"] for r in before["ranks"]], reference, 1)
    result["curve_after_resume"] = compare_runs([r["steps"] for r in resumed["ranks"]], reference, restored + 1)
    result["losses"] = {
        "uninterrupted": distributed_eval.global_losses(uninterrupted),
        "before_failure": distributed_eval.global_losses(before),
        "after_resume": distributed_eval.global_losses(resumed),
    }


def gate_problems(result: dict[str, Any], options: DrillOptions) -> list[str]:
    """Why a finished drill fails its gate (empty: it passes): recovery, the curve, RPO and RTO."""
    problems = []
    codes = result["recovery"]["exit_codes"]
    if not result["failure"]["survivors_failed_by_themselves"]:
        problems.append(
            f"the surviving ranks did not fail by themselves within {DETECT_LIMIT_S:.0f} s: "
            f"{result['failure']['exit_codes']}"
        )
    if any(code != 0 for code in codes):
        problems.append(f"the resumed job failed (exit codes {codes}): {result['resumed_exit_codes_tail']}")
    after = result["curve_after_resume"]
    expected = options.nprocs * (result["steps"] - result["recovery"]["restored_step"])
    if after["mismatches"] or after["steps_compared"] != expected:
        problems.append(
            f"the resumed curve differs from the uninterrupted run ({after['steps_compared']} of {expected} "
            "rank-steps compared): " + "; ".join(after["mismatches"][:3])
        )
    if result["curve_before_failure"]["mismatches"]:
        problems.append("the run before the failure already differs from the uninterrupted run")
    recovery = result["recovery"]
    if recovery["rpo_steps"] > options.rpo_steps:
        problems.append(f"RPO {recovery['rpo_steps']} steps exceeds --rpo-steps {options.rpo_steps}")
    if recovery["rto_seconds"] is None or recovery["rto_seconds"] > options.rto_seconds:
        rto = recovery["rto_seconds"]
        problems.append(f"RTO {rto if rto is None else round(rto, 1)} s exceeds --rto-seconds {options.rto_seconds}")
    return problems


def _checkpoints_saved(out: pathlib.Path) -> list[dict[str, Any]]:
    path = out / "drill-attempt-2" / "rank0.json"
    return json.loads(path.read_text()).get("checkpoints", []) if path.exists() else []


def _finish(result: dict[str, Any], options: DrillOptions, problems: list[str]) -> dict[str, Any]:
    result["problems"] = problems
    result["passed"] = not problems
    result["wall_seconds"] = time.time() - result["started"]
    result["gate"] = {"rpo_steps": options.rpo_steps, "rto_seconds": options.rto_seconds}
    recovery = result.get("recovery", {})
    result["reason"] = (
        "; ".join(problems)
        if problems
        else f"rank {options.kill_rank} killed at step {result['killed']['at_step']}; the job failed in "
        f"{result['failure']['detection_seconds']:.1f} s, resumed from step {recovery['restored_step']} and "
        f"reproduced the uninterrupted curve exactly; RPO {recovery['rpo_steps']} steps "
        f"({recovery['rpo_seconds']:.1f} s) <= {options.rpo_steps}, RTO {recovery['rto_seconds']:.1f} s <= "
        f"{options.rto_seconds:.0f} s"
    )
    return result
