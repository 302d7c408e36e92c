"""Verdicts and exit statuses of `torch-tpu evaluate` and `make demo`: inconclusive evidence is not a failure."""

import json
import os
import shutil
import stat
import subprocess

import pytest

from tests.helpers import ROOT
from torch_tpu.kit import cli, evaluate


def _run(stable=True, p99=9.5, throughput=800.0, spread=0.4, **extra):
    return {
        "finite": True,
        "stable": stable,
        "warmup_spread": None if stable else spread,
        "stability_tolerance": 0.15,
        "p50_ms": 3.0,
        "p90_ms": 6.0,
        "p99_ms": p99,
        "samples_per_second": throughput,
        **extra,
    }


def test_unsettled_run_within_the_slo_is_inconclusive_with_its_spread():
    perf = {"eager": {"cold": _run(), "warm": _run()}, "compiled": {"cold": _run(), "warm": _run(stable=False)}}
    result = evaluate.performance_gate(perf, slo_ms=500.0)
    assert result["status"] == "inconclusive"
    assert "compiled/warm never reached a stable steady state" in result["reason"]
    assert "spread 40%" in result["reason"] and "p99 9.50 ms against the SLO 500.0 ms" in result["reason"]
    assert result["evidence"]["stable"]["compiled/warm"] is False


def test_unsettled_run_without_any_spread_is_inconclusive():
    result = evaluate.performance_gate({"eager": {"warm": _run(stable=False, spread=None)}}, slo_ms=None)
    assert result["status"] == "inconclusive" and "warm-up did not settle" in result["reason"]


def test_settled_runs_are_judged_on_the_contract():
    ok = evaluate.performance_gate({"eager": {"cold": _run(), "warm": _run()}}, 500.0, 100.0)
    assert ok["status"] == "pass" and "p99 <= 500.0 ms" in ok["reason"] and ">= 100.0 samples/s" in ok["reason"]
    slow = evaluate.performance_gate({"eager": {"cold": _run(), "warm": _run(p99=600.0)}}, 500.0)
    assert slow["status"] == "fail" and "eager/warm p99 600.00 ms exceeds the SLO 500.0 ms" in slow["reason"]
    starved = evaluate.performance_gate({"eager": {"warm": _run(throughput=20.0)}}, None, 100.0)
    assert starved["status"] == "fail" and "20.0 samples/s is below" in starved["reason"]


def test_a_failure_outweighs_an_unsettled_run():
    perf = {"eager": {"cold": _run(stable=False), "warm": _run(p99=900.0)}}
    assert evaluate.performance_gate(perf, 500.0)["status"] == "fail"
    broken = {"eager": {"cold": {"error": "timed out after 600 s"}, "warm": _run(stable=False)}}
    assert evaluate.performance_gate(broken, 500.0)["status"] == "fail"
    nonfinite = {"eager": {"warm": _run(finite=False)}}
    assert evaluate.performance_gate(nonfinite, 500.0)["status"] == "fail"


def _gates(*statuses):
    return {name: {"status": s, "reason": "", "evidence": {}} for name, s in zip(evaluate.GATES, statuses, strict=True)}


@pytest.mark.parametrize(
    ("statuses", "verdict", "code"),
    [
        (("pass",) * 5, "pass", 0),
        (("pass", "pass", "inconclusive", "pass", "pass"), "inconclusive", 3),
        (("pass", "fail", "inconclusive", "pass", "pass"), "fail", 1),
        (("fail",) * 5, "fail", 1),
    ],
)
def test_verdict_and_exit_code(statuses, verdict, code):
    report = {"gates": _gates(*statuses), "errors": []}
    report["verdict"] = evaluate.verdict(report["gates"])
    assert report["verdict"] == verdict and evaluate.exit_code(report) == code


@pytest.mark.parametrize("error", ["WorkloadError", "PriceError"])
def test_bad_input_exits_2(error):
    report = {"gates": _gates(*("fail",) * 5), "verdict": "fail", "errors": [{"stage": "load", "type": error}]}
    assert evaluate.exit_code(report) == evaluate.EXIT_BAD_INPUT == 2


@pytest.mark.parametrize(("statuses", "code"), [(("pass",) * 5, 0), (("inconclusive",) * 5, 3), (("fail",) * 5, 1)])
def test_cli_returns_the_verdicts_exit_code(monkeypatch, capsys, tmp_path, statuses, code):
    gates = _gates(*statuses)
    fake = {"gates": gates, "verdict": evaluate.verdict(gates), "errors": [], "run_id": "r1"}
    monkeypatch.setattr(evaluate, "run", lambda options: fake)
    assert cli.main(["evaluate", "examples.workloads:tiny_lm", "--out", str(tmp_path)]) == code
    assert f"verdict: {fake['verdict'].upper()}" in capsys.readouterr().out


def test_evaluate_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["evaluate", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for line in ("0  pass", "1  fail", "2  bad input", "3  inconclusive"):
        assert line in text


def test_unloadable_workload_exits_2(tmp_path, capsys):
    assert cli.main(["evaluate", "no_such_module_xyz:build", "--out", str(tmp_path), "--no-performance"]) == 2
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "fail"
    assert "(bad input)" in capsys.readouterr().out


def _fake_venv(tmp_path, status, write_report):
    """A stand-in `.venv` whose `torch-tpu` exits with `status`, after writing a report when asked."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    newer = (ROOT / "pyproject.toml").stat().st_mtime + 1
    os.utime(venv / ".installed", (newer, newer))  # newer than pyproject.toml: make builds nothing
    script = venv / "bin" / "torch-tpu"
    body = 'out="${@: -1}"; mkdir -p "$out"; echo "{}" > "$out/report.json"; ' if write_report else ""
    script.write_text(f"#!/bin/bash\n{body}echo 'verdict: X'; exit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return venv


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(
    ("status", "write_report", "succeeds"),
    [(0, True, True), (1, True, True), (3, True, True), (2, True, False), (0, False, False)],
)
def test_make_demo_succeeds_whenever_the_evaluation_ran_to_a_report(tmp_path, status, write_report, succeeds):
    venv = _fake_venv(tmp_path, status, write_report)
    out = tmp_path / "report"
    done = subprocess.run(
        ["make", "-s", "demo", f"VENV={venv}", f"DEMO_OUT={out}"], cwd=ROOT, capture_output=True, text=True
    )
    assert (done.returncode == 0) == succeeds, done.stdout + done.stderr
    assert "verdict: X" in done.stdout
    assert ("ran to a report" in done.stdout) == succeeds
