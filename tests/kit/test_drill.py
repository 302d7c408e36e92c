"""The recovery drill: a real worker process SIGKILLed mid-run on a 2-process loopback DDP job, the group failing
by itself, the newest checkpoint corrupted on purpose and skipped, the resumed curve equal to the uninterrupted
one step for step (bit-exact: same program, inputs and state), the RPO/RTO gate; and the checkpoint checks."""

import json
import os
import pathlib

import pytest

from torch_tpu.kit import cli, disttrain, drill

HERE = pathlib.Path(__file__).parent
SPEC = f"{HERE / 'kit_workloads.py'}:tiny"


def test_drill_kills_a_worker_and_resumes_from_the_last_complete_checkpoint(tmp_path):
    out = tmp_path / "drill"
    code = cli.main(
        ["drill", SPEC, "--steps", "8", "--at-step", "5", "--checkpoint-every", "2", "--corrupt-latest"]
        + ["--kill-rank", "1", "--rpo-steps", "10", "--rto-seconds", "300", "--out", str(out)]
    )
    result = json.loads((out / "drill.json").read_text())
    assert code == 0 and result["passed"], result["problems"]
    killed, failure, recovery = result["killed"], result["failure"], result["recovery"]
    # Rank 1 waits after step 5 for the kill, so no rank gets past step 5 and step 4's is the newest checkpoint.
    assert killed["rank"] == 1 and killed["at_step"] == 5 and failure["last_step_finished"] == 5
    with pytest.raises(ProcessLookupError):
        os.kill(killed["pid"], 0)  # the worker really is gone
    assert failure["exit_codes"][1] == -9 and failure["exit_codes"][0] not in (0, None)
    assert failure["survivors_failed_by_themselves"] and failure["detection_seconds"] < drill.DETECT_LIMIT_S
    assert "rank 1 was lost" in failure["survivor_log_tail"]
    # Checkpoints at steps 2 and 4 were complete; the drill corrupted step 4's data, so step 2 is used.
    considered = result["checkpoints_considered"]
    step4 = next(c for c in considered if c["path"].endswith("step-000004"))
    assert "does not match its SHA-256" in step4["problem"] and result["corrupted"]["path"] == step4["path"]
    assert considered[-1]["path"].endswith("step-000002") and considered[-1]["problem"] is None
    assert recovery["restored_step"] == 2 and recovery["exit_codes"] == [0, 0]
    assert recovery["rpo_steps"] == 5 - 2
    assert recovery["rpo_seconds"] > 0 and recovery["rto_seconds"] > 0
    after = result["curve_after_resume"]
    assert after["steps_compared"] == 2 * (8 - 2) and after["mismatches"] == []
    assert after["max_abs_loss_difference"] == 0.0
    assert result["curve_before_failure"]["mismatches"] == []
    assert result["losses"]["after_resume"] == result["losses"]["uninterrupted"][2:]
    assert "Recovery drill" in (out / "drill.html").read_text()

    # The same evidence against a stricter gate fails it, naming both objectives.
    strict = drill.DrillOptions(SPEC, out, steps=8, at_step=5, checkpoint_every=2, rpo_steps=1, rto_seconds=0.001)
    problems = drill.gate_problems(result, strict)
    assert len(problems) == 2 and "RPO" in problems[0] and "--rpo-steps 1" in problems[0] and "RTO" in problems[1]
    # A resumed step whose loss (or RNG, data position, learning rate) differs is caught.
    resumed = [[dict(step) for step in steps] for steps in _steps(out / "drill-attempt-2")]
    resumed[1][0]["loss"] += 1e-7
    reference = _steps(out / "drill-uninterrupted")
    found = drill.compare_runs(resumed, reference, 3)["mismatches"]
    assert len(found) == 1 and found[0].startswith("rank 1 step 3: loss")


def _steps(directory: pathlib.Path) -> list[list[dict]]:
    return [[json.loads(line) for line in (directory / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]


def test_checkpoint_marker_detects_partial_and_corrupt_checkpoints(tmp_path):
    good = tmp_path / "step-000002"
    good.mkdir()
    (good / "__0_0.distcp").write_bytes(b"a" * 64)
    (good / ".metadata").write_bytes(b"m")
    (good / disttrain.MARKER).write_text(json.dumps({"step": 2, "time": 0.0, "files": disttrain.file_digests(good)}))
    assert disttrain.checkpoint_problem(good) is None
    partial = tmp_path / "step-000004"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"b" * 64)
    assert "missing (the save did not finish)" in disttrain.checkpoint_problem(partial)
    chosen, seen = drill.choose_checkpoint(tmp_path)
    assert chosen == good and [s["problem"] is None for s in seen] == [False, True]
    drill.corrupt(good)
    assert "does not match its SHA-256" in disttrain.checkpoint_problem(good)
    (good / ".metadata").unlink()
    assert disttrain.checkpoint_problem(good) == ".metadata is missing"
    assert drill.choose_checkpoint(tmp_path)[0] is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--at-step", "9"], "--at-step 9 must be in 1..7"),
        (["--kill-rank", "2"], "--kill-rank 2 is not a rank of a 2-process job"),
        (["--checkpoint-every", "6"], "a checkpoint must exist before the kill"),
    ],
)
def test_drill_refuses_options_that_describe_no_drill(tmp_path, capsys, flags, message):
    assert cli.main(["drill", SPEC, "--steps", "8", "--at-step", "5", *flags, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "drill-attempt-1").exists()  # refused before anything was launched
