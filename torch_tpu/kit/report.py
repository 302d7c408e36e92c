"""report.json (with a JSON Schema) and report.html (self-contained: tables, and matplotlib plots inlined as SVG
by report_plots; no external assets).

The HTML is generated only from the report dict, so every number a reader sees is one report.json also holds,
and the page opens from a file:// URL on a machine with no network.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import pathlib
import re
from typing import Any

from torch_tpu.kit import report_plots

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
    "body{font-family:sans-serif;margin:2em;max-width:72em;color:#222}table{border-collapse:collapse;margin:0.6em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}"
    "th{background:#f3f3f3}.pass{color:#1a7f37}.fail{color:#c62828}.inconclusive{color:#b26a00}"
    ".verdict{font-size:1.5em;margin:0.3em 0}section{margin:1.5em 0;padding-top:0.2em}"
    "#summary{border:2px solid #ccc;border-radius:6px;padding:0.4em 1em 0.8em}"
    "#summary td.line{max-width:52em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}"
    "figure.plot{margin:0.6em 0}figure.plot svg{max-width:100%;height:auto}.noplot{color:#666;font-style:italic}"
    ".cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(30em,1fr));gap:0 2em}.card h3{margin-bottom:0}"
    "nav a{margin-right:1em}pre{white-space:pre-wrap;font-size:12px}"
)
_STATUS = {True: "pass", False: "fail"}


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


def _plot(name: str, draw: Any, *args: Any) -> str:
    """One matplotlib figure as <figure id="plot-NAME"> with inline SVG; nothing when the report has no data for it.

    Without matplotlib, or when drawing fails on data the plot did not foresee, a line says so in its place: the
    report is written in every case, so a plot must never cost the reader the tables.
    """
    if not report_plots.available():
        return f'<p class="noplot" id="plot-{name}">{name} plot not drawn: {report_plots.MISSING}</p>'
    try:
        fig = draw(*args)
        svg = None if fig is None else report_plots.to_svg(fig)
    except Exception as exc:
        error = html.escape(f"{type(exc).__name__}: {exc}")
        return f'<p class="noplot fail" id="plot-{name}">{name} plot not drawn: {error}</p>'
    return "" if svg is None else f'<figure class="plot" id="plot-{name}">{svg}</figure>'


def _section(name: str, title: str, *parts: str) -> str:
    return f'<section id="{name}"><h2>{html.escape(title)}</h2>{"".join(parts)}</section>'


def _status(ok: Any, text: str) -> str:
    status = _STATUS[bool(ok)]
    return f'<p class="{status}">{status.upper()}: {html.escape(text)}</p>'


def distributed_sections(report: dict[str, Any]) -> list[str]:
    """The HTML of the report's `distributed` and `drill` parts (absent parts render nothing)."""
    sections: list[str] = []
    dist = report.get("distributed")
    if dist:
        parts = [_status(dist.get("passed"), dist.get("error") or "; ".join(dist["problems"]) or "matches one process")]
        if "losses" in dist:
            curve, params = dist["loss_curve"], dist["parameters"]
            parts += [
                _plot("distributed-loss", report_plots.distributed_loss, dist),
                _table(
                    [
                        ["loss curve", curve["max_abs_error"], curve["max_rel_error"], curve["rtol"], curve["atol"]],
                        ["final parameters", *(params[k] for k in ("max_abs_error", "max_rel_error", "rtol", "atol"))],
                    ],
                    ["compared with one process", "max abs error", "max rel error", "rtol", "atol"],
                ),
            ]
            single = dist["single"]
            rows = [["1 process", "-", single["samples_per_second"], single["median_step_seconds"], 0.0]]
            rows[0] += [single["peak_memory_bytes"], single["quality"]]
            rows += [
                [f"rank {r['rank']}"]
                + [
                    r[k]
                    for k in ("collective_seconds", "samples_per_second", "median_step_seconds", "collective_share")
                ]
                + [r["peak_memory_bytes"], r["quality"]]
                for r in dist["ranks"]
            ]
            header = ["run", "collective s", "samples/s", "median step s", "collective share", "peak memory bytes"]
            parts += [
                _table(rows, [*header, "quality"]),
                f"<p>global throughput {_fmt(dist['global_samples_per_second'])} samples/s; scaling efficiency "
                f"{dist['scaling_efficiency']:.1%} of {dist['nproc_per_node']} x one process</p>",
                _plot("scaling", report_plots.scaling, dist),
            ]
        title = f"Distributed evaluation: {dist['nproc_per_node']} processes, {dist['strategy']}"
        sections.append(_section("distributed", title, *parts))
    drill = report.get("drill")
    if drill:
        parts = [_status(drill.get("passed"), drill.get("reason", ""))]
        if drill.get("losses"):
            parts.append(_plot("drill-loss", report_plots.drill_loss, drill))
        facts = [
            [f"{part}.{key}", _utc(value) if key == "time" else value]
            for part in ("killed", "failure", "recovery", "curve_before_failure", "curve_after_resume", "gate")
            for key, value in (drill.get(part) or {}).items()
            if key != "survivor_log_tail"
        ]
        parts.append(_table(facts, ["fact", "value"]))
        if drill.get("checkpoints_considered"):
            parts.append(
                _table(
                    [[c["path"], c["problem"] or "complete: used"] for c in drill["checkpoints_considered"]],
                    ["checkpoint (newest first)", "state"],
                )
            )
        tail = (drill.get("failure") or {}).get("survivor_log_tail")
        if tail:
            parts.append(f"<details><summary>survivor's log tail</summary><pre>{html.escape(tail)}</pre></details>")
        sections.append(_section("drill", "Recovery drill", *parts))
    return sections


def _utc(seconds: Any) -> Any:
    """A Unix time as a readable UTC time (left alone when it is not a number)."""
    if not isinstance(seconds, int | float):
        return seconds
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


def _fmt(v: Any) -> str:
    """A cell: numbers to 4 significant digits (thousands separated when large), lists joined, None as '-'."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isfinite(v) and 1e4 <= abs(v) < 1e15:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, list | tuple):
        return ", ".join(_fmt(x) for x in v) if v else "none"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items()) if v else "none"
    return str(v)


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _flatten(value: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> list[list[Any]]:
    """Nested dicts/lists as (dotted key, scalar) rows, so evidence reads as a table rather than a JSON dump."""
    if value == {} and not prefix:
        return []
    if isinstance(value, dict) and value:
        items = [(k, v) for k, v in value.items() if k not in skip]
    elif isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return [[prefix or "value", value]]
    rows: list[list[Any]] = []
    for key, sub in items:
        rows += _flatten(sub, f"{prefix}.{key}" if prefix else str(key), skip)
    return rows


def _gate_line(name: str, gate: dict[str, Any], report: dict[str, Any]) -> str:
    """A gate's evidence in one line: its key numbers when it passed, its reason (what failed) otherwise."""
    ev = gate.get("evidence") or {}
    if gate.get("status") != "pass":
        return gate.get("reason", "")
    if name == "correctness" and "loss_curve" in ev:
        curve = ev["loss_curve"]
        line = f"loss max rel error {_fmt(curve.get('max_rel_error'))} (rtol {_fmt(curve.get('rtol'))})"
        line += f"; quality tpu {_fmt(ev.get('quality_tpu'))} vs reference {_fmt(ev.get('quality_reference'))}"
        dist = (ev.get("distributed") or {}).get("loss_curve")
        if dist:
            line += f"; {report['distributed']['nproc_per_node']} processes: loss {_fmt(dist['max_rel_error'])}"
        return line
    if name == "performance" and ev.get("p99_ms"):
        worst = max(ev["p99_ms"], key=lambda k: ev["p99_ms"][k] or 0)
        line = f"worst p99 {_fmt(ev['p99_ms'][worst])} ms ({worst})"
        line += f" vs SLO {_fmt(ev['latency_slo_ms'])} ms" if ev.get("latency_slo_ms") is not None else ", no SLO"
        rates = ev.get("samples_per_second") or {}
        best = max(rates, key=lambda k: rates[k] or 0) if rates else None
        return line + (f"; {_fmt(rates[best])} samples/s ({best})" if best else "")
    if name == "operations" and ev.get("resume"):
        resume = ev["resume"]
        line = f"resume after step {resume['resumed_after_step']}: |loss diff| {_fmt(resume['abs_difference'])}"
        drill = ev.get("drill") or {}
        if drill.get("recovery"):
            recovery, limit = drill["recovery"], drill.get("gate") or {}
            line += f"; drill RPO {recovery['rpo_steps']} steps (<= {_fmt(limit.get('rpo_steps'))})"
            line += f", RTO {_fmt(recovery['rto_seconds'])} s (<= {_fmt(limit.get('rto_seconds'))} s)"
        return line
    if name == "cost" and ev.get("cost_per_useful_result") is not None:
        currency = (report.get("cost") or {}).get("currency", "USD")
        return (
            f"{_fmt(ev['cost_per_useful_result'])} {currency} per useful result "
            f"(total {_fmt(ev['total'])} {currency}, {ev['useful_results']} useful)"
        )
    if name == "compatibility" and "metrics" in ev:
        fallbacks = ev["metrics"].get("cpu_fallbacks") or {}
        modes = ", ".join(report.get("modes", [])) or "?"
        return f"modes {modes}: forward and backward on tpu, {len(fallbacks)} CPU fallbacks"
    return gate.get("reason", "")


_DECISION = {
    "pass": "adopt: every gate passed",
    "fail": "do not adopt yet: failed {names}",
    "inconclusive": "inconclusive, keep the current path: could not judge {names}",
}


def _summary(report: dict[str, Any], sections: list[tuple[str, str]]) -> str:
    """The one-screen summary: the decision, each gate's status and evidence in a line, links to the sections."""
    gates, verdict = report.get("gates", {}), report.get("verdict", "fail")
    names = ", ".join(n for n, g in gates.items() if g.get("status") == verdict) or "-"
    rows = "".join(
        f'<tr><td>{html.escape(n)}</td><td class="{g.get("status", "fail")}"><b>{g.get("status", "fail").upper()}'
        f'</b></td><td class="line" title="{html.escape(g.get("reason", ""))}">'
        f"{html.escape(_gate_line(n, g, report))}</td></tr>"
        for n, g in gates.items()
    )
    meta = [
        f"run {report.get('run_id', '')}",
        f"workload {report.get('workload_spec', '')}",
        f"reference {report.get('reference_device', '')}",
        ", ".join(f"{a} {b}" for a, b in _flatten(report.get("versions", {}))),
        ", ".join(f"{a} {b}" for a, b in _flatten(report.get("platform", {}))),
    ]
    if "wall_seconds" in report:
        meta.append(f"{report['wall_seconds']:.0f} s")
    meta = [m for m in meta if m and not m.endswith(" ")]
    links = "".join(f'<a href="#{i}">{t}</a>' for i, t in sections)  # titles are escaped already
    plots = "" if report_plots.available() else f'<p class="noplot">{report_plots.MISSING}</p>'
    return (
        f'<section id="summary"><p class="verdict {verdict}">Decision: <b>{verdict.upper()}</b> &mdash; '
        f"{html.escape(_DECISION.get(verdict, '{names}').format(names=names))}</p>"
        f"<table><thead><tr><th>gate</th><th>status</th><th>evidence</th></tr></thead><tbody>{rows}</tbody></table>"
        f"<p>{html.escape(' · '.join(meta))}</p>{plots}<nav>{links}</nav></section>"
    )


def _pair(tolerance: Any) -> str:
    return f"rtol {_fmt(tolerance[0])}, atol {_fmt(tolerance[1])}" if isinstance(tolerance, list) else _fmt(tolerance)


def _correctness(report: dict[str, Any]) -> str:
    correctness = report.get("correctness") or {}
    training, fb, parts = correctness.get("training"), correctness.get("forward_backward") or [], []
    if training:
        parts.append(_plot("loss", report_plots.correctness_loss, report))
        rows = [
            [run, r.get("device"), r.get("mode"), len(r.get("losses", [])), r.get("quality"), r.get("meets_contract")]
            + [(r.get("failed_step") or {}).get("message", "-")]
            for run, r in (("tpu", training["tpu"]), ("reference", training["reference"]))
        ]
        parts.append(_table(rows, ["run", "device", "mode", "steps", "quality", "meets contract", "failed step"]))
    if fb:
        rows = [
            [c["mode"], c["shape"]["dtype"], c.get("outputs", {}).get("max_abs_error", "-")]
            + [c.get("gradients", {}).get("max_abs_error", "-"), "pass" if c["passed"] else "FAIL"]
            for c in fb
        ]
        parts.append(_table(rows, ["mode", "dtype", "max |output err|", "max |grad err|", "result"]))
    if report.get("precision_policy"):
        rows = [
            [d, _pair(p["outputs"]), _pair(p["gradients"]), _pair(p["loss"]), p["why"]]
            for d, p in report["precision_policy"].items()
        ]
        parts += [
            "<h3>Precision policy (declared before the run)</h3>",
            _table(rows, ["dtype", "outputs", "gradients", "loss curve", "why"]),
        ]
    return _section("correctness", "Correctness", *parts) if parts else ""


def _performance(report: dict[str, Any]) -> str:
    perf = report.get("performance")
    if not perf:
        return ""
    keys = ("first_call_seconds", "compile_seconds", "warmup_calls", "stable", "warmup_spread", "p50_ms", "p90_ms")
    rows = [
        [f"{mode}/{state}", *(r.get(k) for k in keys), r.get("p99_ms"), r.get("samples_per_second")]
        + [r.get("compile_cache", {}).get("state"), r.get("error", "")]
        for mode, runs in perf.items()
        for state, r in runs.items()
    ]
    header = ["run", "first call s", "compile s", "warm-up calls", "steady", "warm-up spread", "p50 ms", "p90 ms"]
    slo = (report.get("workload") or {}).get("latency_slo_ms")
    return _section(
        "performance",
        "Performance",
        _table(rows, [*header, "p99 ms", "samples/s", "cache", "error"]),
        f"<p>latency SLO (p99 per batch): {_fmt(slo)} ms</p>",
        _plot("latency", report_plots.latency, perf, slo),
        _plot("throughput", report_plots.throughput, report),
    )


def _workload(report: dict[str, Any]) -> str:
    work = report.get("workload")
    if not work:
        return ""
    rows = [[k.replace("_", " "), v] for k, v in work.items() if k != "shapes"]
    shapes = [" ".join(f"{k} {s[k]}" for k in ("batch", "seq") if s.get(k)) + f" {s['dtype']}" for s in work["shapes"]]
    rows.append(["shapes", shapes])
    return _section("workload", "Workload and contract", _table(rows, ["field", "value"]))


def _gate_card(name: str, gate: dict[str, Any]) -> str:
    """A gate's status, its full reason and its evidence as a key/value table."""
    status = gate.get("status", "fail")
    rows = _flatten(gate.get("evidence") or {}, skip=("survivor_log_tail",))
    return (
        f'<div class="card"><h3 id="gate-{name}" class="{status}">{html.escape(name)}: {status.upper()}</h3>'
        f"<p>{html.escape(gate.get('reason', ''))}</p>{_table(rows, ['evidence', 'value'])}</div>"
    )


def render_html(report: dict[str, Any]) -> str:
    gates = report.get("gates", {})
    errors = [[e.get("stage", ""), e.get("type", ""), e.get("message", "")] for e in report.get("errors", [])]
    shapes = report.get("shapes") or []
    shape_rows = [
        [s.get("label"), s.get("compiles"), s.get("compile_seconds"), s.get("repeat_call_seconds")]
        + ["pass" if s["passed"] else "FAIL"]
        for s in shapes
    ]
    body = [
        _section("errors", "Errors", _table(errors, ["stage", "type", "message"])) if errors else "",
        _workload(report),
        _correctness(report),
        _section(
            "shapes",
            "Shape catalogue",
            _table(shape_rows, ["shape", "compiles", "compile s", "repeat call s", "result"]),
        )
        if shapes
        else "",
        _performance(report),
        *distributed_sections(report),
    ]
    if report.get("cost"):
        body.append(
            _section(
                "cost",
                "Cost",
                _plot("cost", report_plots.cost, report["cost"]),
                _table(_flatten(report["cost"]), ["item", "value"]),
            )
        )
    if gates:
        body.append(
            _section(
                "gates",
                "Gate evidence",
                f'<div class="cards">{"".join(_gate_card(n, g) for n, g in gates.items())}</div>',
            )
        )
    found = re.findall(r'<section id="([^"]+)"><h2>(.*?)</h2>', "".join(body))
    title = html.escape(str(report.get("workload", {}).get("name", "?")))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>torch-tpu report {report.get('run_id', '')}"
        f"</title><style>{_STYLE}</style></head><body><h1>torch-tpu evaluation: {title}</h1>"
        f"{_summary(report, found)}{''.join(body)}</body></html>\n"
    )
