"""Distributed evaluation: 2 processes on loopback trained under DDP (FSDP2 and TP: slow) against one process on
the same global batch, and the one process against CPU PyTorch; per-rank throughput, collective share, memory."""

import json
import pathlib

import pytest
import torch

from torch_tpu.kit import checks, cli, distributed_eval, disttrain, report, workload

HERE = pathlib.Path(__file__).parent
SPEC = f"{HERE / 'kit_workloads.py'}:tiny"
STEPS = 6


def _cpu_losses(steps: int) -> list[float]:
    """The single-process run's training done by CPU PyTorch in this process: same data stream, same updates."""
    work = workload.load(SPEC)
    model = work.make_model(0)
    optimizer = work.optimizer(model)
    scheduler = work.scheduler(optimizer)
    stream = disttrain.BatchStream(work, 0, 1, split=False, device="cpu")
    losses = []
    for _ in range(steps):
        inputs, target = stream.next()
        optimizer.zero_grad()
        loss = work.loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    return losses


def test_evaluate_with_two_ddp_processes_matches_one_process_and_cpu(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"accelerator_per_hour": 1.2, "host_per_hour": 0.2, "storage_per_gb_month": 0.02}))
    out = tmp_path / "report"
    code = cli.main(
        ["evaluate", SPEC, "--steps", str(STEPS), "--modes", "eager", "--no-performance", "--prices", str(prices)]
        + ["--nproc-per-node", "2", "--strategy", "ddp", "--out", str(out)]
    )
    data = json.loads((out / "report.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, report.REPORT_SCHEMA)
    assert code == 1 and data["gates"]["performance"]["reason"].startswith("not run")  # --no-performance
    assert all(g["status"] == "pass" for name, g in data["gates"].items() if name != "performance"), data["gates"]
    section = data["distributed"]
    assert section["passed"] and section["strategy"] == "ddp" and section["nproc_per_node"] == 2, section
    assert "2-process ddp matches one process" in data["gates"]["correctness"]["reason"]
    single, distributed = section["losses"]["single"], section["losses"]["distributed"]
    assert len(single) == len(distributed) == STEPS
    # The global batch's loss is the mean of the two ranks' half-batch losses (equal halves of a mean loss).
    per_rank = section["per_rank_losses"]
    assert distributed == pytest.approx([(a + b) / 2 for a, b in zip(*per_rank, strict=True)], rel=1e-12)
    assert per_rank[0] != per_rank[1]  # each rank really trained on its own half
    # float32: DDP differs from one process only by the order of the gradient sums (~1e-7 relative); the declared
    # policy allows 1e-3, and a rank that skipped the all-reduce would be off by ~1e-2 after a step.
    assert section["loss_curve"]["passed"] and section["loss_curve"]["max_rel_error"] < 1e-5
    assert section["parameters"]["passed"] and section["parameters"]["max_abs_error"] < 1e-5
    assert section["parameters"]["tensors"] == 4
    # The one-process tpu run itself against CPU PyTorch, under the declared float32 loss policy.
    expected = torch.tensor(_cpu_losses(STEPS))
    assert checks.compare(torch.tensor(single), expected, checks.policy("float32")["loss"])["passed"], (
        single,
        expected,
    )
    assert section["quality"]["single"] == section["quality"]["distributed"]
    ranks = section["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:
        assert rank["samples_per_second"] > 0 and rank["peak_memory_bytes"] > 0
        assert rank["collective_seconds"] > 0 and 0 < rank["collective_share"] < 1  # DDP all-reduces every step
    assert section["single"]["collective_seconds"] == 0
    assert section["scaling_efficiency"] == pytest.approx(
        section["global_samples_per_second"] / (2 * section["single"]["global_samples_per_second"])
    )
    assert "Distributed evaluation: 2 processes, ddp" in (out / "report.html").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", "tp"])
def test_fsdp2_and_tp_match_one_process(tmp_path, strategy):
    section, _ = distributed_eval.evaluate(SPEC, strategy, 2, STEPS, tmp_path)
    assert section["passed"], section
    assert section["loss_curve"]["max_rel_error"] < 1e-5 and section["parameters"]["max_abs_error"] < 1e-5
    if strategy == "tp":  # every rank sees the whole batch and computes the same loss
        assert section["per_rank_losses"][0] == section["per_rank_losses"][1]


def test_strategies_refuse_what_they_cannot_run():
    work = workload.load(SPEC, tp_plan=None)
    with pytest.raises(ValueError, match="declares no tp_plan"):
        disttrain._wrap(work.make_model(0), "tp", work, 2)
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        disttrain.BatchStream(work, 0, 3, split=True)
