import json
import math

import pytest

from torch_tpu.kit import cost, measure, workload


def test_percentiles_and_stability():
    values = [float(i) for i in range(1, 101)]
    assert measure.percentile(values, 50) == pytest.approx(50.5)
    assert measure.percentile(values, 99) == pytest.approx(99.01)
    assert measure.is_stable([5.0, 1.0, 1.02, 0.99], windows=3, tolerance=0.05)
    assert not measure.is_stable([1.0, 2.0, 1.0], windows=3, tolerance=0.05)
    assert not measure.is_stable([1.0], windows=3, tolerance=0.05)


def test_measure_warms_up_until_stable():
    calls = []
    timing = measure.measure(lambda: calls.append(1), batch_size=4, iterations=10, window=2, windows=2)
    summary = timing.summary()
    assert summary["iterations"] == 10 and summary["p50_ms"] <= summary["p99_ms"]
    assert len(calls) == 1 + timing.warmup_calls + 10


def test_price_file_errors(tmp_path):
    with pytest.raises(cost.PriceError, match="no price file"):
        cost.load_prices(None)
    with pytest.raises(cost.PriceError, match="does not exist"):
        cost.load_prices(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"accelerator_per_hour": 1, "host_per_hour": -1, "storage_per_gb_month": 0}))
    with pytest.raises(cost.PriceError, match="host_per_hour"):
        cost.load_prices(bad)


def test_cost_per_useful_result():
    prices = {
        "accelerator_per_hour": 3.6,
        "host_per_hour": 0.36,
        "storage_per_gb_month": 1.0,
        "engineering": {"hours": 10, "rate_per_hour": 100, "amortise_over_runs": 100},
    }
    result = cost.attribute(prices, machine_seconds=100, stored_bytes=10**9, useful_results=2)
    assert result["breakdown"]["accelerator"] == pytest.approx(0.1)
    assert result["total"] == pytest.approx(0.1 + 0.01 + 1.0)
    assert result["cost_per_useful_result"] == pytest.approx(result["total"] / 2)
    assert result["engineering"]["per_run"] == pytest.approx(10.0)  # amortised separately, not in total
    assert cost.attribute(prices, 100, 0, 0)["cost_per_useful_result"] is None


def test_workload_loading_errors(tmp_path):
    with pytest.raises(workload.WorkloadError, match="module:callable|must look like"):
        workload.load("no_colon_here")
    with pytest.raises(workload.WorkloadError, match="cannot import"):
        workload.load("definitely_not_a_module_xyz:build")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_installed_dependency_xyz\n")
    with pytest.raises(workload.WorkloadError, match="not_installed_dependency_xyz"):
        workload.load(f"{broken}:build")
    with pytest.raises(workload.WorkloadError, match="expected torch_tpu.kit.workload.Workload"):
        workload.load("tests/kit/kit_workloads.py:not_a_workload")
    loaded = workload.load("tests/kit/kit_workloads.py:tiny")
    assert loaded.name == "tiny" and loaded.meets_contract(0.5) and not loaded.meets_contract(math.nan)


def test_recovery_cost_and_spot_net_savings():
    prices = {
        "accelerator_per_hour": 3.0,
        "host_per_hour": 0.6,
        "storage_per_gb_month": 0.0,
        "spot": {"accelerator_per_hour": 1.0, "host_per_hour": 0.2, "preemptions_per_hour": 2.0},
    }
    result = cost.recovery(
        prices,
        chips=4,
        run_seconds=3600,
        useful_results=1,
        lost_seconds=60,
        resume_seconds=120,
        expected_lost_seconds=300,
    )
    assert result["run_cost"] == pytest.approx(4 * 3.6)
    assert result["cost_per_failure"] == pytest.approx(180 / 3600 * 4 * 3.6)  # (RPO + RTO) x chips x rate
    assert result["cost_per_useful_result_with_failure"] == pytest.approx(4 * 3.6 * (1 + 180 / 3600))
    spot = result["spot"]
    # Two preemptions an hour, each losing 300 s of work and 120 s of resume: 840 s of every hour is lost.
    assert spot["useful_fraction"] == pytest.approx(1 - 840 / 3600)
    assert spot["cost_per_useful_chip_hour"] == pytest.approx(1.2 / (1 - 840 / 3600))
    assert spot["gross_savings_fraction"] == pytest.approx(1 - 1.2 / 3.6)
    assert spot["net_savings_per_useful_chip_hour"] == pytest.approx(3.6 - 1.2 / (1 - 840 / 3600))
    assert spot["net_savings_fraction"] < spot["gross_savings_fraction"]
    prices["spot"]["preemptions_per_hour"] = 3600 / 420  # a preemption every 420 s: never any progress
    assert cost.recovery(prices, 4, 3600, 1, 60, 120, 300)["spot"]["net_savings_per_useful_chip_hour"] is None
    del prices["spot"]
    nothing_useful = cost.recovery(prices, 4, 3600, 0, 60, 120, 300)
    assert nothing_useful["spot"] is None and nothing_useful["cost_per_useful_result_with_failure"] is None


def test_spot_price_fields_are_checked(tmp_path):
    path = tmp_path / "prices.json"
    base = {"accelerator_per_hour": 1, "host_per_hour": 0.1, "storage_per_gb_month": 0}
    path.write_text(json.dumps({**base, "spot": {"accelerator_per_hour": 0.3}}))
    with pytest.raises(cost.PriceError, match="spot.preemptions_per_hour"):
        cost.load_prices(path)
    path.write_text(json.dumps({**base, "spot": {"accelerator_per_hour": 0.3, "preemptions_per_hour": -1}}))
    with pytest.raises(cost.PriceError, match="spot.preemptions_per_hour"):
        cost.load_prices(path)
    example = cost.load_prices("torch_tpu/kit/example_prices.json")
    assert example["spot"]["preemptions_per_hour"] > 0
