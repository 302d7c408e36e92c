"""report.json (with a JSON Schema) and report.html (self-contained: inline SVG plots, no external assets).

The HTML is generated only from the report dict, so every number a reader sees is one report.json also holds,
and the page opens from a file:// URL on a machine with no network.
"""

from __future__ import annotations

import html
import json
import math
import pathlib
from typing import Any

_GATE = {
    "type": "object",
    "required": ["status", "reason", "evidence"],
    "properties": {
        "status": {"enum": ["pass", "fail", "inconclusive"]},
        "reason": {"type": "string"},
        "evidence": {"type": "object"},
    },
}

REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "torch-tpu evaluate report",
    "type": "object",
    "required": [
        "schema_version",
        "run_id",
        "workload_spec",
        "reference_device",
        "versions",
        "gates",
        "verdict",
        "errors",
        "started_at",
        "finished_at",
        "wall_seconds",
    ],
    "properties": {
        "schema_version": {"const": 1},
        "run_id": {"type": "string"},
        "workload_spec": {"type": "string"},
        "reference_device": {"type": "string"},
        "modes": {"type": "array", "items": {"enum": ["eager", "compiled"]}},
        "versions": {"type": "object", "required": ["torch", "torch_tpu"]},
        "platform": {"type": "object", "required": ["platform", "device_name", "device_count", "topology"]},
        "workload": {"type": "object", "required": ["name", "metric", "quality_target", "shapes"]},
        "precision_policy": {"type": "object"},
        "correctness": {
            "type": "object",
            "properties": {
                "forward_backward": {"type": "array"},
                "training": {"type": "object"},
                "loss_curve": {"type": "object"},
            },
        },
        "shapes": {"type": "array", "items": {"type": "object", "required": ["shape", "passed"]}},
        "performance": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "properties": {"cold": {"type": "object"}, "warm": {"type": "object"}},
            },
        },
        "cost": {"type": "object"},
        "distributed": {
            "type": "object",
            "required": ["strategy", "nproc_per_node", "steps", "passed"],
            "properties": {
                "losses": {"type": "object", "required": ["single", "distributed"]},
                "ranks": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["rank", "samples_per_second", "collective_share", "peak_memory_bytes"],
                    },
                },
                "scaling_efficiency": {"type": "number"},
            },
        },
        "drill": {"type": "object", "required": ["passed", "reason", "problems"]},
        "gates": {
            "type": "object",
            "required": ["compatibility", "correctness", "performance", "operations", "cost"],
            "additionalProperties": _GATE,
        },
        "verdict": {"enum": ["pass", "fail", "inconclusive"]},
        "errors": {"type": "array", "items": {"type": "object", "required": ["stage", "message"]}},
        "started_at": {"type": "number"},
        "finished_at": {"type": "number"},
        "wall_seconds": {"type": "number"},
    },
}


_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}.pass{color:#1a7f37}.fail{color:#c62828}"
    ".inconclusive{color:#b26a00}"
    ".verdict{font-size:1.4em}svg{border:1px solid #eee;margin:0.5em}"
)


def _clean(value: Any) -> Any:
    """JSON has no inf/nan: write them as strings so the file stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write(report: dict[str, Any], out: pathlib.Path) -> None:
    (out / "report.json").write_text(json.dumps(_clean(report), indent=2, default=str) + "\n")
    (out / "report.schema.json").write_text(json.dumps(REPORT_SCHEMA, indent=2) + "\n")
    (out / "report.html").write_text(render_html(report))


def write_drill(result: dict[str, Any], out: pathlib.Path) -> None:
    """`torch-tpu drill`'s drill.json and drill.html (the same drill section evaluate's report shows)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "drill.json").write_text(json.dumps(_clean(result), indent=2, default=str) + "\n")
    page = "".join(distributed_sections({"drill": result}))
    (out / "drill.html").write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>torch-tpu drill</title><style>{_STYLE}</style>"
        f"</head><body><h1>torch-tpu recovery drill</h1>{page}</body></html>\n"
    )


def distributed_sections(report: dict[str, Any]) -> list[str]:
    """The HTML of the report's `distributed` and `drill` parts (absent parts render nothing)."""
    sections: list[str] = []
    dist = report.get("distributed")
    if dist:
        status = "pass" if dist.get("passed") else "fail"
        sections += [
            f"<h2>Distributed evaluation: {dist['nproc_per_node']} processes, {html.escape(dist['strategy'])}</h2>",
            f'<p class="{status}">{status.upper()}: {html.escape(dist.get("error") or "; ".join(dist["problems"]))}'
            "</p>",
        ]
        if "losses" in dist:
            sections.append(
                _svg_lines(
                    {"one process": dist["losses"]["single"], dist["strategy"]: dist["losses"]["distributed"]},
                    f"training loss, {dist['nproc_per_node']} processes vs one (same global batch)",
                    "step",
                    "loss",
                )
            )
            curve, params = dist["loss_curve"], dist["parameters"]
            sections.append(
                _table(
                    [
                        ["loss curve", curve["max_abs_error"], curve["max_rel_error"], curve["rtol"], curve["atol"]],
                        [
                            "final parameters",
                            params["max_abs_error"],
                            params["max_rel_error"],
                            params["rtol"],
                            params["atol"],
                        ],
                    ],
                    ["compared with one process", "max abs error", "max rel error", "rtol", "atol"],
                )
            )
            rows = [
                [
                    "1 process",
                    "-",
                    dist["single"]["samples_per_second"],
                    dist["single"]["median_step_seconds"],
                    0.0,
                    dist["single"]["peak_memory_bytes"],
                    dist["single"]["quality"],
                ]
            ]
            rows += [
                [
                    f"rank {r['rank']}",
                    r["collective_seconds"],
                    r["samples_per_second"],
                    r["median_step_seconds"],
                    r["collective_share"],
                    r["peak_memory_bytes"],
                    r["quality"],
                ]
                for r in dist["ranks"]
            ]
            sections += [
                _table(
                    rows,
                    [
                        "run",
                        "collective s",
                        "samples/s",
                        "median step s",
                        "collective share",
                        "peak memory bytes",
                        "quality",
                    ],
                ),
                f"<p>global throughput {dist['global_samples_per_second']:.4g} samples/s; scaling efficiency "
                f"{dist['scaling_efficiency']:.1%} of {dist['nproc_per_node']} x one process</p>",
            ]
    drill = report.get("drill")
    if drill:
        status = "pass" if drill.get("passed") else "fail"
        sections += [
            "<h2>Recovery drill</h2>",
            f'<p class="{status}">{status.upper()}: {html.escape(drill.get("reason", ""))}</p>',
        ]
        if drill.get("losses"):
            losses = dict(drill["losses"])
            restored = drill.get("recovery", {}).get("restored_step", 0)
            losses["after_resume"] = [None] * restored + list(losses["after_resume"])  # drawn at its own steps
            sections.append(_svg_lines(losses, "loss: uninterrupted, before the kill, after resume", "step", "loss"))
        facts = [
            [f"{part}.{key}", value]
            for part in ("failure", "recovery")
            for key, value in drill.get(part, {}).items()
            if key != "survivor_log_tail"
        ]
        sections.append(_table(facts, ["fact", "value"]))
        if drill.get("checkpoints_considered"):
            sections.append(
                _table(
                    [[c["path"], c["problem"] or "complete: used"] for c in drill["checkpoints_considered"]],
                    ["checkpoint (newest first)", "state"],
                )
            )
    return sections


def _svg_lines(series: dict[str, list[float]], title: str, xlabel: str, ylabel: str) -> str:
    """A line chart of one or more series (inline SVG)."""
    width, height, pad = 520, 260, 48
    values = [v for s in series.values() for v in s if isinstance(v, int | float) and math.isfinite(v)]
    if not values:
        return f"<p>{html.escape(title)}: no data</p>"
    low, high = min(values), max(values)
    high = high if high > low else low + 1
    longest = max(len(s) for s in series.values())
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - 10}" y2="{height - pad}" stroke="#333"/>',
        f'<line x1="{pad}" y1="24" x2="{pad}" y2="{height - pad}" stroke="#333"/>',
        f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">{html.escape(xlabel)}</text>',
        f'<text x="4" y="30" font-size="11">{high:.4g}</text>',
        f'<text x="4" y="{height - pad}" font-size="11">{low:.4g}</text>',
        f'<text x="4" y="{height / 2}" font-size="11" transform="rotate(-90 10 {height / 2})">'
        f"{html.escape(ylabel)}</text>",
    ]
    for index, (name, points) in enumerate(series.items()):
        color = colors[index % len(colors)]
        coords = []
        for i, v in enumerate(points):
            if isinstance(v, int | float) and math.isfinite(v):
                x = pad + (width - pad - 10) * (i / max(longest - 1, 1))
                y = (height - pad) - (height - pad - 24) * ((v - low) / (high - low))
                coords.append(f"{x:.1f},{y:.1f}")
        dash = ' stroke-dasharray="6 4"' if index else ""  # identical curves must both stay visible
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{" ".join(coords)}"/>')
        parts.append(f'<text x="{width - 150}" y="{40 + 16 * index}" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_histograms(series: dict[str, list[float]], title: str) -> str:
    """Latency distributions as sorted-latency (quantile) curves: one line per run, x = quantile."""
    quantiles = {name: sorted(v) for name, v in series.items() if v}
    return _svg_lines(quantiles, title, "quantile (sorted calls)", "latency ms")


def _table(rows: list[list[Any]], header: list[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _flatten(value: Any, prefix: str = "") -> list[list[Any]]:
    """Nested dicts/lists as (dotted key, scalar) rows, so evidence reads as a table rather than a JSON dump."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return [[prefix or "value", ", ".join(map(str, value)) if isinstance(value, list) else value]]
    rows: list[list[Any]] = []
    for key, sub in items:
        rows += _flatten(sub, f"{prefix}.{key}" if prefix else str(key))
    return rows


def render_html(report: dict[str, Any]) -> str:
    gates = report.get("gates", {})
    verdict = report.get("verdict", "fail")
    sections = [
        f"<h1>torch-tpu evaluation: {html.escape(str(report.get('workload', {}).get('name', '?')))}</h1>",
        f'<p class="verdict {verdict}">Verdict: <b>{verdict.upper()}</b></p>',
        f"<p>run {html.escape(report.get('run_id', ''))} &middot; workload "
        f"<code>{html.escape(report.get('workload_spec', ''))}</code> &middot; reference "
        f"{html.escape(report.get('reference_device', ''))} &middot; "
        f"{html.escape(', '.join(f'{a} {b}' for a, b in _flatten(report.get('versions', {}))))} &middot; "
        f"{html.escape(', '.join(f'{a} {b}' for a, b in _flatten(report.get('platform', {}))))}</p>",
        "<h2>Gates</h2>",
        _table(
            [[name, g.get("status", "fail").upper(), g.get("reason", "")] for name, g in gates.items()],
            ["gate", "status", "evidence"],
        ),
    ]
    for error in report.get("errors", []):
        sections.append(
            f'<p class="fail">error in {html.escape(error.get("stage", ""))}: '
            f"{html.escape(error.get('message', ''))}</p>"
        )
    training = report.get("correctness", {}).get("training")
    if training:
        sections += [
            "<h2>Correctness</h2>",
            _svg_lines(
                {
                    "tpu": training["tpu"]["losses"],
                    report.get("reference_device", "ref"): training["reference"]["losses"],
                },
                "training loss, tpu vs reference",
                "step",
                "loss",
            ),
        ]
    fb = report.get("correctness", {}).get("forward_backward", [])
    if fb:
        sections.append(
            _table(
                [
                    [
                        c["mode"],
                        c["shape"]["dtype"],
                        c.get("outputs", {}).get("max_abs_error", "-"),
                        c.get("gradients", {}).get("max_abs_error", "-"),
                        "pass" if c["passed"] else "FAIL",
                    ]
                    for c in fb
                ],
                ["mode", "dtype", "max |output err|", "max |grad err|", "result"],
            )
        )
    if report.get("precision_policy"):
        sections += [
            "<h3>Precision policy (declared before the run)</h3>",
            _table(
                [[d, p["outputs"], p["gradients"], p["loss"], p["why"]] for d, p in report["precision_policy"].items()],
                ["dtype", "outputs (rtol, atol)", "gradients", "loss curve", "why"],
            ),
        ]
    if report.get("shapes"):
        sections += [
            "<h2>Shape catalogue</h2>",
            _table(
                [
                    [
                        s.get("label"),
                        s.get("compiles", "-"),
                        s.get("compile_seconds", "-"),
                        s.get("repeat_call_seconds", "-"),
                        "pass" if s["passed"] else "FAIL",
                    ]
                    for s in report["shapes"]
                ],
                ["shape", "compiles", "compile s", "repeat call s", "result"],
            ),
        ]
    perf = report.get("performance")
    if perf:
        rows, series = [], {}
        for mode, runs in perf.items():
            for state, r in runs.items():
                rows.append(
                    [
                        f"{mode}/{state}",
                        r.get("first_call_seconds", "-"),
                        r.get("compile_seconds", "-"),
                        r.get("warmup_calls", "-"),
                        {True: "yes", False: "NO"}.get(r.get("stable"), "-"),
                        "-" if r.get("warmup_spread") is None else f"{r['warmup_spread']:.0%}",
                        r.get("p50_ms", "-"),
                        r.get("p90_ms", "-"),
                        r.get("p99_ms", "-"),
                        r.get("samples_per_second", "-"),
                        r.get("compile_cache", {}).get("state", "-"),
                        r.get("error", ""),
                    ]
                )
                if r.get("latencies_ms"):
                    series[f"{mode}/{state}"] = r["latencies_ms"]
        sections += [
            "<h2>Performance</h2>",
            _table(
                rows,
                [
                    "run",
                    "first call s",
                    "compile s",
                    "warm-up calls",
                    "steady",
                    "warm-up spread",
                    "p50 ms",
                    "p90 ms",
                    "p99 ms",
                    "samples/s",
                    "cache",
                    "error",
                ],
            ),
            _svg_histograms(series, "steady-state latency distribution"),
        ]
    sections += distributed_sections(report)
    if report.get("cost"):
        sections += ["<h2>Cost</h2>", _table(_flatten(report["cost"]), ["item", "value"])]
    style = _STYLE
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>torch-tpu report {report.get('run_id', '')}"
        f"</title><style>{style}</style></head><body>{''.join(sections)}</body></html>\n"
    )
