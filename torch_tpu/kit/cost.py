"""Cost per useful result, from prices the user supplies — never from prices the kit makes up.

The guide's model: cost per useful result = total cost attributed to the run / results that meet the quality
contract. "Attributed" includes everything the run held the machine for (set-up, compilation, warm-up, idle,
failed attempts), not only the steady-state steps, and storage for what it kept. Engineering cost is a one-off
and is amortised separately over the runs the user expects, so it never hides inside a per-run number.

Price file (JSON):
    {"currency": "USD", "accelerator_per_hour": 1.375, "host_per_hour": 0.20,
     "storage_per_gb_month": 0.02, "storage_months": 1,
     "engineering": {"hours": 40, "rate_per_hour": 100, "amortise_over_runs": 500},
     "spot": {"accelerator_per_hour": 0.55, "host_per_hour": 0.08, "preemptions_per_hour": 0.1}}

`spot` is optional (the Spot scenario of `recovery`); `preemptions_per_hour` is the user's observed or assumed rate.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

REQUIRED = ("accelerator_per_hour", "host_per_hour", "storage_per_gb_month")


class PriceError(ValueError):
    """The price file is missing, unreadable or lacks a required, non-negative price."""


def load_prices(path: str | pathlib.Path | None) -> dict[str, Any]:
    if path is None:
        raise PriceError(
            "no price file given (--prices FILE); the cost gate needs accelerator, host and storage "
            "prices and the kit will not invent them"
        )
    file = pathlib.Path(path)
    if not file.is_file():
        raise PriceError(f"price file {file} does not exist")
    try:
        prices = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise PriceError(f"price file {file} is not valid JSON: {exc}") from exc
    if not isinstance(prices, dict):
        raise PriceError(f"price file {file} must hold a JSON object")
    for key in REQUIRED:
        _check_number(file, key, prices.get(key))
    spot = prices.get("spot")
    if spot is not None:
        if not isinstance(spot, dict):
            raise PriceError(f"price file {file}: 'spot' must be an object, got {spot!r}")
        for key in ("accelerator_per_hour", "preemptions_per_hour"):
            _check_number(file, f"spot.{key}", spot.get(key))
        if "host_per_hour" in spot:
            _check_number(file, "spot.host_per_hour", spot["host_per_hour"])
    return prices


def _check_number(file: pathlib.Path, key: str, value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0 or not math.isfinite(value):
        raise PriceError(f"price file {file}: {key!r} must be a non-negative number, got {value!r}")


def attribute(
    prices: dict[str, Any],
    machine_seconds: float,
    stored_bytes: int,
    useful_results: int,
    samples_per_second: float | None = None,
) -> dict[str, Any]:
    """The cost breakdown, cost per useful result (None when nothing useful came out) and amortised engineering."""
    hours = machine_seconds / 3600.0
    accelerator = prices["accelerator_per_hour"] * hours
    host = prices["host_per_hour"] * hours
    storage = prices["storage_per_gb_month"] * stored_bytes / 1e9 * prices.get("storage_months", 1)
    total = accelerator + host + storage
    result: dict[str, Any] = {
        "currency": prices.get("currency", "USD"),
        "machine_seconds": machine_seconds,
        "stored_bytes": stored_bytes,
        "breakdown": {"accelerator": accelerator, "host": host, "storage": storage},
        "total": total,
        "useful_results": useful_results,
        "cost_per_useful_result": total / useful_results if useful_results > 0 else None,
        "prices": prices,
    }
    if samples_per_second and useful_results > 0:
        per_second = (prices["accelerator_per_hour"] + prices["host_per_hour"]) / 3600.0
        result["serving_cost_per_1000_samples"] = per_second / samples_per_second * 1000
    engineering = prices.get("engineering")
    if isinstance(engineering, dict):
        one_off = float(engineering.get("hours", 0)) * float(engineering.get("rate_per_hour", 0))
        runs = max(int(engineering.get("amortise_over_runs", 1)), 1)
        result["engineering"] = {"one_off": one_off, "amortise_over_runs": runs, "per_run": one_off / runs}
    return result


def recovery(
    prices: dict[str, Any],
    chips: int,
    run_seconds: float,
    useful_results: int,
    lost_seconds: float,
    resume_seconds: float,
    expected_lost_seconds: float,
) -> dict[str, Any]:
    """What a failure costs, and what Spot capacity nets once its preemptions' lost work and resumes are paid.

    `lost_seconds`/`resume_seconds` are the drill's measured RPO and RTO (wall seconds, every chip idle or
    redoing work); a failure's cost is their sum x chips at the on-demand rate, and the drilled run's cost per
    useful result includes one. For Spot (`prices["spot"]`: `accelerator_per_hour`, optional `host_per_hour`,
    `preemptions_per_hour`), a preemption lands anywhere in a checkpoint interval, so it loses
    `expected_lost_seconds` (half an interval) plus the resume: of each wall hour only
    1 - preemptions_per_hour x (expected lost + resume) / 3600 is useful work, and the Spot cost of a useful hour is
    the Spot rate divided by that. Net savings = on-demand cost of a useful hour - that; none when Spot never
    makes progress (a preemption every interval).
    """
    on_demand = prices["accelerator_per_hour"] + prices["host_per_hour"]
    failure = (lost_seconds + resume_seconds) / 3600.0 * chips * on_demand
    run = run_seconds / 3600.0 * chips * on_demand
    result: dict[str, Any] = {
        "currency": prices.get("currency", "USD"),
        "chips": chips,
        "lost_seconds": lost_seconds,
        "resume_seconds": resume_seconds,
        "cost_per_failure": failure,
        "run_cost": run,
        "cost_per_useful_result_with_failure": (run + failure) / useful_results if useful_results > 0 else None,
    }
    spot = prices.get("spot")
    if not isinstance(spot, dict):
        result["spot"] = None
        return result
    rate = float(spot["accelerator_per_hour"]) + float(spot.get("host_per_hour", prices["host_per_hour"]))
    preemptions = float(spot["preemptions_per_hour"])
    overhead_hours = (expected_lost_seconds + resume_seconds) / 3600.0
    useful_fraction = 1.0 - preemptions * overhead_hours
    per_useful_hour = rate / useful_fraction if useful_fraction > 0 else None
    result["spot"] = {
        "rate_per_chip_hour": rate,
        "on_demand_rate_per_chip_hour": on_demand,
        "preemptions_per_hour": preemptions,
        "lost_seconds_per_preemption": expected_lost_seconds,
        "resume_seconds_per_preemption": resume_seconds,
        "useful_fraction": useful_fraction,
        "cost_per_useful_chip_hour": per_useful_hour,
        "gross_savings_fraction": 1.0 - rate / on_demand if on_demand > 0 else None,
        "net_savings_per_useful_chip_hour": on_demand - per_useful_hour if per_useful_hour is not None else None,
        "net_savings_fraction": 1.0 - per_useful_hour / on_demand if per_useful_hour and on_demand > 0 else None,
    }
    return result
