"""bench/device_run.sh, dry-run on the XLA CPU platform at small sizes, so that the device run cannot rot between
borrowed machines: every step of each part passes and leaves its files under $OUT."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

STEPS = {
    "correctness": ["platform", "smoke_eager", "smoke_compiled", "device_suite", "cache_two_processes"],
    "ops": ["ops_suite"],
    "ops_rest": ["ops_suite", "numerics"],
    "models": ["models_suite"],
    "kit": ["kit_smoke", "kit_evaluate"],
    "numerics": ["numerics_tables", "compiled_numerics"],
    "perf": ["warmup", "eager_overhead", "formulations", "tpu_step_small", "eager_modes"],
    "perf_large": ["tpu_step_large"],
    "fused_large": ["fused_default", "fused_PRODUCTS_0_BACKWARD_CUT_AT_0.7", "fused_BACKWARD_CUT_AT_0.6"],
    "compile_ahead": ["ahead_1_tiny_whole_step", "ahead_0_tiny_whole_step", "ahead_1_tiny_compiled"],
    "runahead": ["runahead_1_tiny_whole_step", "runahead_0_tiny_whole_step", "runahead_1_tiny_compiled"],
    "cold_start": ["cold_start", "cold_first_step"],
    "backward_thread": ["backward_thread_1", "backward_thread_0"],
}
FILES = {
    "correctness": ["correctness.log", "correctness-junit.xml"],
    "ops": ["ops.log", "ops-junit.xml"],
    "ops_rest": ["ops_rest.log", "ops_rest-junit.xml", "numerics.json"],
    "models": ["models.log", "models-junit.xml"],
    "kit": ["kit.log", "evaluate-report.json"],
    "numerics": ["numerics.log", "numerics_tables.json", "compiled_numerics.json"],
    "perf": ["perf.log", "tpu_step_small.json", "warmup.json"],
    "perf_large": ["perf_large.log", "tpu_step_large.json"],
    "fused_large": ["fused_large.log"],
    "compile_ahead": ["compile_ahead.log"],
    "runahead": ["runahead.log"],
    "cold_start": ["cold_start.log"],
    "backward_thread": ["backward_thread.log"],
}


def _dry_run(tmp_path: Path, part: str) -> str:
    env = dict(
        os.environ,
        OUT=str(tmp_path),
        PYTHON=sys.executable,
        TORCH_TPU_PLATFORM="cpu",
        DEVICE_RUN_SMALL="1",
        DEVICE_RUN_BUDGET_S="1200",
        DEVICE_RUN_TIMEOUT_SCALE="4",
    )
    out = subprocess.run(["bash", str(ROOT / "bench" / "device_run.sh"), part], capture_output=True, text=True, env=env)
    summary = (tmp_path / "summary.txt").read_text()
    assert out.returncode == 0, summary + out.stdout[-3000:]
    return summary


@pytest.mark.parametrize(
    "part",
    ["correctness", "ops", "ops_rest", "models", "kit"]
    + [
        pytest.param(p, marks=pytest.mark.slow)
        for p in (
            "numerics",
            "perf",
            "perf_large",
            "fused_large",
            "compile_ahead",
            "runahead",
            "cold_start",
            "backward_thread",
        )
    ],
)
def test_each_part_passes_every_step_on_the_cpu_platform(tmp_path, part):
    summary = _dry_run(tmp_path, part)
    smoke = [ROOT / "shared" / "seeds" / "smoke.py", ROOT.parent / "shared" / "seeds" / "smoke.py"]
    for step in STEPS[part]:
        if step.startswith("smoke_") and not any(path.exists() for path in smoke):
            continue
        assert f"PASS  {part}/{step} " in summary, summary
    for name in FILES[part]:
        assert (tmp_path / name).stat().st_size > 0, name


def test_an_unknown_part_is_refused_naming_the_parts(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_run.sh"), "speed"], capture_output=True, text=True, env=env
    )
    parts = "correctness, ops, ops_rest, models, kit, numerics, perf, perf_large, fused_large, compile_ahead, runahead"
    assert out.returncode == 2 and parts in out.stderr


def test_a_suite_whose_process_dies_in_a_test_resumes_after_it(tmp_path):
    """On the chip XLA's compiler aborted the process in one test, which took the rest of the suite and its report
    with it: the step starts again after that test, names it, and the failures' texts reach the log."""
    crashing = "test_binary[dtype1-logaddexp]"
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, TORCH_TPU_PLATFORM="cpu", DEVICE_RUN_SMALL="1")
    env.update(DEVICE_RUN_BUDGET_S="1200", DEVICE_RUN_TIMEOUT_SCALE="4", TORCH_TPU_TEST_ABORT=crashing)
    script = ROOT / "bench" / "device_run.sh"
    out = subprocess.run(["bash", str(script), "ops"], capture_output=True, text=True, env=env)
    summary = (tmp_path / "summary.txt").read_text()
    assert out.returncode == 1, summary
    assert f"CRASH  ops/ops_suite: tests/ops/test_elementwise.py::{crashing} (exit status 134" in summary, summary
    assert "FAIL  ops/ops_suite (exit status 134" in summary and "PASS  ops/ops_suite " in summary, summary
    assert "passed" in summary.split("CRASH  ops/ops_suite")[1], summary  # the resumed run's counts
    assert "the failures, from the journal" in (tmp_path / "ops.log").read_text()


def test_steps_named_in_device_run_skip_are_left_out(tmp_path):
    """A call that must run part of a part (the rest of a suite cut at its cap) names the steps it leaves out."""
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, TORCH_TPU_PLATFORM="cpu", DEVICE_RUN_SMALL="1")
    env.update(DEVICE_RUN_SKIP="numerics ops_suite")
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_run.sh"), "ops_rest"], capture_output=True, text=True, env=env
    )
    summary = (tmp_path / "summary.txt").read_text()
    assert out.returncode == 0, summary
    for step in ("numerics", "ops_suite"):
        assert f"SKIP  ops_rest/{step} (DEVICE_RUN_SKIP)" in summary, summary
    assert not (tmp_path / "numerics.json").exists()
