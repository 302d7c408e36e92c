"""The report's plots, drawn by matplotlib from the report dict and inlined as SVG so report.html stays one file.

matplotlib is optional (`pip install torch_tpu[report]`): `available()` says whether it imports, and without it
report.py renders its tables alone, with a line naming the extra where each plot would be. Every function here
takes the same report.json data the tables show and returns a `matplotlib.figure.Figure` (None when the report has
no data for it), so a test can read the drawn series back from the figure. Figures are built with the
object-oriented API (no pyplot): no global state, no GUI backend.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable
from typing import Any

MISSING = "plots need matplotlib: pip install torch_tpu[report]"
_RC = {"svg.fonttype": "none", "svg.hashsalt": "torch-tpu-report", "font.size": 9, "axes.grid": True}
_SIZE = (8.0, 3.2)


def available() -> bool:
    """Whether matplotlib can be imported (the `report` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _styled(draw: Callable[..., Any]) -> Callable[..., Any]:
    """Run a plot function under the report's matplotlib settings without touching the caller's rcParams."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context(_RC):
            return draw(*args, **kwargs)

    return wrapper


def _figure(ncols: int = 1, size: tuple[float, float] = _SIZE) -> tuple[Any, list[Any]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def to_svg(fig: Any) -> str:
    """The figure as an inline <svg> element: text kept as text (searchable, small), no date, no XML prologue."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


def _curve(ax: Any, values: list[Any], label: str, start: int = 0, **style: Any) -> None:
    """One loss curve at steps start, start+1, ...; non-finite points are left out (a gap, not a zero)."""
    points = [(start + i, float(v)) for i, v in enumerate(values) if isinstance(v, int | float) and math.isfinite(v)]
    ax.plot([p[0] for p in points], [p[1] for p in points], label=label, marker=".", **style)


@_styled
def correctness_loss(report: dict[str, Any]) -> Any:
    """Training loss per step on tpu vs the reference (and the N-process run when there is one), and the
    per-step difference from the reference against the declared policy's allowance atol + rtol * |reference|."""
    training = report.get("correctness", {}).get("training") or {}
    tpu, ref = training.get("tpu", {}).get("losses"), training.get("reference", {}).get("losses")
    if not tpu or not ref:
        return None
    fig, (ax, diff) = _figure(2)
    reference = report.get("reference_device", "reference")
    _curve(ax, tpu, f"tpu ({training['tpu'].get('mode', 'tpu')})")
    _curve(ax, ref, f"reference ({reference})", linestyle="--")
    dist = report.get("distributed") or {}
    if dist.get("losses"):
        _curve(ax, dist["losses"]["distributed"], f"{dist['nproc_per_node']}-process {dist['strategy']}", linestyle=":")
    ax.set(title="training loss, tpu vs reference", xlabel="step", ylabel="loss")
    ax.legend()
    steps = [i for i, (a, b) in enumerate(zip(tpu, ref, strict=False)) if _finite([a, b]) == [a, b]]
    diff.plot(steps, [abs(tpu[i] - ref[i]) for i in steps], marker=".", label="|tpu - reference|")
    curve = report.get("correctness", {}).get("loss_curve") or {}
    if "rtol" in curve:
        allowed = [curve["atol"] + curve["rtol"] * abs(ref[i]) for i in steps]
        diff.plot(steps, allowed, color="#c62828", linestyle="--", label=f"allowed (rtol {curve['rtol']:g})")
    if any(v > 0 for line in diff.lines for v in line.get_ydata()):
        diff.set_yscale("log")
    diff.set(title="difference from the reference", xlabel="step", ylabel="absolute loss difference")
    diff.legend()
    return fig


@_styled
def distributed_loss(dist: dict[str, Any]) -> Any:
    """The N-process training loss against one process on the same global batch."""
    if not dist.get("losses"):
        return None
    fig, (ax,) = _figure(1, (8.0, 3.0))
    _curve(ax, dist["losses"]["single"], "one process")
    _curve(ax, dist["losses"]["distributed"], f"{dist['nproc_per_node']}-process {dist['strategy']}", linestyle="--")
    ax.set(title=f"training loss, {dist['nproc_per_node']} processes vs one", xlabel="step", ylabel="loss")
    ax.legend()
    return fig


@_styled
def drill_loss(drill: dict[str, Any]) -> Any:
    """The drill's uninterrupted, killed and resumed curves, the resumed one at its own steps, kill and restore
    steps marked."""
    losses = drill.get("losses") or {}
    if not losses:
        return None
    fig, (ax,) = _figure(1, (8.0, 3.0))
    restored = (drill.get("recovery") or {}).get("restored_step", 0) or 0
    _curve(ax, losses.get("uninterrupted", []), "uninterrupted")
    _curve(ax, losses.get("before_failure", []), "before the kill", linestyle="--")
    _curve(ax, losses.get("after_resume", []), "after resume", start=restored, linestyle=":")
    killed = (drill.get("killed") or {}).get("at_step")
    if killed is not None:
        ax.axvline(killed, color="#c62828", linestyle="--", label=f"killed after step {killed}")
    if restored:
        ax.axvline(restored, color="#2ca02c", linestyle="-.", label=f"restored step {restored}")
    ax.set(title="recovery drill: loss per step", xlabel="step", ylabel="loss")
    ax.legend()
    return fig


@_styled
def latency(perf: dict[str, Any], slo_ms: float | None) -> Any:
    """Steady-state latency of each run (mode/cache) as a histogram and an empirical CDF, with the p99 SLO line.

    The x axis turns logarithmic when the values and the SLO span more than 20x, so a run far inside its SLO
    still shows its shape and the SLO line stays on the plot.
    """
    import numpy as np

    runs = {f"{m}/{s}": _finite(r.get("latencies_ms") or []) for m, states in perf.items() for s, r in states.items()}
    runs = {name: values for name, values in runs.items() if values}
    if not runs:
        return None
    fig, (hist, cdf) = _figure(2)
    everything = [v for values in runs.values() for v in values] + ([slo_ms] if slo_ms else [])
    low, high = min(everything), max(everything)
    log = low > 0 and high / low > 20
    bins = np.geomspace(low, high, 40) if log else np.linspace(low, high if high > low else low + 1, 40)
    for name, values in runs.items():
        hist.hist(values, bins=bins, histtype="step", linewidth=1.5, label=name)
        ordered = sorted(values)
        cdf.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=name)
    cdf.axhline(0.99, color="#888", linestyle=":", linewidth=1, label="p99")
    for ax in (hist, cdf):
        if slo_ms is not None:
            ax.axvline(slo_ms, color="#c62828", linestyle="--", label=f"p99 SLO {slo_ms:g} ms")
        if log:
            ax.set_xscale("log")
        ax.set_xlabel("latency per batch, ms")
        ax.legend()
    hist.set(title="steady-state latency histogram", ylabel="calls")
    cdf.set(title="latency CDF", ylabel="fraction of calls", ylim=(0, 1.02))
    return fig


@_styled
def throughput(report: dict[str, Any]) -> Any:
    """Samples per second against the work in one call: one repeat call per catalogued shape (per dtype), and
    the performance runs' steady state (median of their calls) at their shape, with the throughput contract.

    The x axis is the batch size, or batch x sequence length when shapes have one (a language model's catalogue
    varies the sequence at a fixed batch)."""
    shapes = [s for s in report.get("shapes") or [] if "shape" in s]
    runs = [(f"{m}/{s}", r) for m, states in (report.get("performance") or {}).items() for s, r in states.items()]
    with_seq = any(x["shape"].get("seq") for x in shapes + [r for _, r in runs if "shape" in r])

    def size(shape: dict[str, Any]) -> int:
        return shape["batch"] * (shape.get("seq") or 1)

    per_dtype: dict[str, list[tuple[int, float]]] = {}
    for shape in shapes:
        seconds = shape.get("repeat_call_seconds")
        if isinstance(seconds, int | float) and seconds > 0:
            rate = shape["shape"]["batch"] / seconds
            per_dtype.setdefault(shape["shape"]["dtype"], []).append((size(shape["shape"]), rate))
    steady = [
        (name, size(r["shape"]), r["samples_per_second"])
        for name, r in runs
        if isinstance(r.get("samples_per_second"), int | float) and "shape" in r
    ]
    if not per_dtype and not steady:
        return None
    fig, (ax,) = _figure(1, (8.0, 3.0))
    for dtype, points in per_dtype.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"shape catalogue, {dtype}")
    markers = "s^vD"
    for index, (name, work, rate) in enumerate(steady):
        ax.plot([work], [rate], marker=markers[index % 4], linestyle="none", markersize=8, label=f"{name} steady")
    contract = (report.get("workload") or {}).get("min_samples_per_second")
    if contract is not None:
        ax.axhline(contract, color="#c62828", linestyle="--", label=f"contract {contract:g} samples/s")
    xlabel = "batch x sequence length per call" if with_seq else "batch size"
    ax.set(title=f"inference throughput vs {xlabel}", xlabel=xlabel, ylabel="samples/s")
    ax.set_xticks(sorted({p[0] for points in per_dtype.values() for p in points} | {w for _, w, _ in steady}))
    ax.legend()
    return fig


@_styled
def scaling(dist: dict[str, Any]) -> Any:
    """Job throughput at 1 and N processes against linear scaling, and each run's share of step time spent in
    collectives."""
    single = (dist.get("single") or {}).get("global_samples_per_second")
    if not single or "global_samples_per_second" not in dist:
        return None
    n = dist["nproc_per_node"]
    fig, (ax, share) = _figure(2)
    ax.plot([1, n], [single, n * single], color="#888", linestyle="--", label="linear scaling")
    ax.plot([1, n], [single, dist["global_samples_per_second"]], marker="o", label=f"measured ({dist['strategy']})")
    ax.annotate(f"{dist['scaling_efficiency']:.0%} efficiency", (n, dist["global_samples_per_second"]))
    ax.set(title="training throughput vs processes", xlabel="processes", ylabel="samples/s", xticks=[1, n])
    ax.legend()
    names = ["1 process"] + [f"rank {r['rank']}" for r in dist.get("ranks", [])]
    shares = [0.0] + [r["collective_share"] for r in dist.get("ranks", [])]
    share.bar(names, [1 - s for s in shares], label="compute and the rest")
    share.bar(names, shares, bottom=[1 - s for s in shares], label="collectives")
    share.set(title="share of step time", ylabel="fraction", ylim=(0, 1))
    share.legend()
    return fig


@_styled
def cost(cost: dict[str, Any]) -> Any:
    """What the evaluation cost, item by item (with the amortised engineering and a drilled failure if priced)."""
    measured = dict(cost.get("breakdown") or {})
    extra = {}
    if "engineering" in cost:
        extra["engineering (amortised per run)"] = cost["engineering"]["per_run"]
    if (cost.get("recovery") or {}).get("cost_per_failure") is not None:
        extra["one failure (drill RPO + RTO)"] = cost["recovery"]["cost_per_failure"]
    if not measured and not extra:
        return None
    currency = cost.get("currency", "USD")
    fig, (ax,) = _figure(1, (8.0, 0.9 + 0.4 * (len(measured) + len(extra))))
    for items, color, label in ((measured, "#1f77b4", "this evaluation"), (extra, "#ff7f0e", "added per run")):
        if items:
            values = [float(v) for v in items.values()]
            bars = ax.barh(list(items), values, color=color, label=label)
            ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], padding=3)
    ax.invert_yaxis()
    ax.set(title=f"cost breakdown, {currency} (total {cost.get('total', 0):.3g})", xlabel=currency)
    ax.legend(loc="lower right")
    return fig
