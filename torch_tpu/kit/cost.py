"""Cost per useful result, from prices the user supplies — never from prices the kit makes up.

The guide's model: cost per useful result = total cost attributed to the run / results that meet the quality
contract. "Attributed" includes everything the run held the machine for (set-up, compilation, warm-up, idle,
failed attempts), not only the steady-state steps, and storage for what it kept. Engineering cost is a one-off
and is amortised separately over the runs the user expects, so it never hides inside a per-run number.

Price file (JSON):
    {"currency": "USD", "accelerator_per_hour": 1.375, "host_per_hour": 0.20,
     "storage_per_gb_month": 0.02, "storage_months": 1,
     "engineering": {"hours": 40, "rate_per_hour": 100, "amortise_over_runs": 500}}
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
        value = prices.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0 or not math.isfinite(value):
            raise PriceError(f"price file {file}: {key!r} must be a non-negative number, got {value!r}")
    return prices


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
