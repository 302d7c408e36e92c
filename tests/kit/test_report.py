"""The evaluation report's HTML: its summary, tables and plots show report.json's own numbers.

report_fixture.json is the report.json of a real run (paths shortened):
    torch-tpu evaluate tests/kit/kit_workloads.py:tiny --prices torch_tpu/kit/example_prices.json
        --modes eager,compiled --iterations 20 --steps 16 --nproc-per-node 2 --strategy ddp --drill --out DIR
so every section and plot has data, without a 5-minute evaluation in the test.
"""

import html
import json
import pathlib
import re
import sys

import pytest
from report_checks import assert_drawn

from torch_tpu.kit import report, report_plots, screenshot

HERE = pathlib.Path(__file__).parent
SECTIONS = {"summary", "workload", "correctness", "shapes", "performance", "distributed", "drill", "cost", "gates"}
PLOTS = {"loss", "latency", "throughput", "distributed-loss", "scaling", "drill-loss", "cost"}


@pytest.fixture
def data():
    return json.loads((HERE / "report_fixture.json").read_text())


def _part(page, section):
    return page.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]


def _text(page):
    """The page without its style sheet and plots: what a reader sees as text and tables."""
    page = re.sub(r"<svg.*?</svg>", "", page, flags=re.S)
    return re.sub(r"<style>.*?</style>", "", page, flags=re.S)


def test_fixture_is_a_valid_report(data):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, report.REPORT_SCHEMA)


def test_summary_gives_the_decision_and_each_gate_with_its_evidence_in_one_line(data):
    page = report.render_html(data)
    summary = _part(page, "summary")
    assert "Decision: <b>PASS</b> &mdash; adopt: every gate passed" in summary
    rows = re.findall(
        r'<tr><td>(\w+)</td><td class="(\w+)"><b>(\w+)</b></td><td class="line"[^>]*>([^<]*)</td>', summary
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [(name, "pass", "PASS") for name in data["gates"]]
    lines = {r[0]: html.unescape(r[3]) for r in rows}
    p99 = data["gates"]["performance"]["evidence"]["p99_ms"]
    worst = max(p99, key=p99.get)
    assert f"worst p99 {p99[worst]:.4g} ms ({worst}) vs SLO 10,000 ms" in lines["performance"]
    recovery = data["drill"]["recovery"]
    assert (
        f"drill RPO {recovery['rpo_steps']} steps (<= 10), RTO {recovery['rto_seconds']:.4g} s (<= 120 s)"
        in (lines["operations"])
    )
    assert lines["cost"].startswith(f"{data['cost']['cost_per_useful_result']:.4g} USD per useful result")
    curve = data["correctness"]["loss_curve"]
    assert f"loss max rel error {curve['max_rel_error']:.4g} (rtol 0.001)" in lines["correctness"]
    assert lines["compatibility"] == "modes eager, compiled: forward and backward on tpu, 0 CPU fallbacks"
    # the summary links every section that follows it, in order
    linked = re.findall(r'<a href="#([\w-]+)">', summary)
    assert linked == re.findall(r'<section id="([\w-]+)">', page)[1:] and set(linked) == SECTIONS - {"summary"}


def test_a_failed_gate_shows_its_reason_and_the_decision_names_it(data):
    data["verdict"] = "fail"
    data["gates"]["cost"] = {"status": "fail", "reason": "price file p.json does not exist", "evidence": {}}
    summary = _part(report.render_html(data), "summary")
    assert "Decision: <b>FAIL</b> &mdash; do not adopt yet: failed cost" in summary
    assert '<td>cost</td><td class="fail"><b>FAIL</b></td>' in summary
    assert ">price file p.json does not exist</td>" in summary


def test_gate_evidence_tables_hold_the_gate_values(data):
    gates = _part(report.render_html(data), "gates")
    performance = data["gates"]["performance"]["evidence"]
    assert f"<td>p99_ms.compiled/warm</td><td>{performance['p99_ms']['compiled/warm']:.4g}</td>" in gates
    assert "<td>latency_slo_ms</td><td>10,000</td>" in gates
    assert "<td>resume.resumed_after_step</td><td>8</td>" in gates
    rto = data["gates"]["operations"]["evidence"]["drill"]["recovery"]["rto_seconds"]
    assert f"<td>drill.recovery.rto_seconds</td><td>{rto:.4g}</td>" in gates
    assert "<td>drill.failure.exit_codes</td><td>1, -9</td>" in gates
    assert "<td>distributed.parameters.why</td><td>atol = 0.05 x lr 0.05 x 16 steps</td>" in gates
    assert "survivor_log_tail" not in gates  # the log is in the drill section, folded
    for name, gate in data["gates"].items():
        assert f'<h3 id="gate-{name}" class="pass">{name}: PASS</h3><p>{html.escape(gate["reason"])}</p>' in gates


def test_no_section_is_a_json_dump(data):
    text = _text(report.render_html(data))
    tables = re.sub(r"<details>.*?</details>", "", text, flags=re.S)  # the survivor's log tail is quoted as is
    assert "{" not in tables and '":' not in tables and "[" not in tables.replace("torch_tpu[report]", "")
    policy = _part(text, "correctness")
    assert "<td>float32</td><td>rtol 0.0001, atol 1e-05</td><td>rtol 0.001, atol 1e-05</td>" in policy
    drill = _part(text, "drill")
    assert "<td>failure.time</td><td>2026-12-02T00:54:04.539+00:00</td>" in drill
    assert "<details><summary>survivor's log tail</summary><pre>" in drill
    single = data["distributed"]["single"]
    assert f"<td>1 process</td><td>-</td><td>{single['samples_per_second']:.4g}</td>" in _part(text, "distributed")
    assert "<td>shapes</td><td>batch 16 float32, batch 8 float32</td>" in _part(text, "workload")


def _lines(ax):
    return {line.get_label(): line for line in ax.lines}


def test_loss_plots_draw_the_report_losses(data):
    training, dist = data["correctness"]["training"], data["distributed"]
    loss, diff = report_plots.correctness_loss(data).axes
    lines = _lines(loss)
    assert list(lines["tpu (compiled)"].get_ydata()) == training["tpu"]["losses"]
    assert list(lines["reference (cpu)"].get_ydata()) == training["reference"]["losses"]
    assert list(lines["2-process ddp"].get_ydata()) == dist["losses"]["distributed"]
    assert list(lines["tpu (compiled)"].get_xdata()) == list(range(16))
    tpu, ref = training["tpu"]["losses"], training["reference"]["losses"]
    lines = _lines(diff)
    assert list(lines["|tpu - reference|"].get_ydata()) == [abs(a - b) for a, b in zip(tpu, ref, strict=True)]
    assert list(lines["allowed (rtol 0.001)"].get_ydata()) == pytest.approx([1e-5 + 1e-3 * abs(r) for r in ref])
    lines = _lines(report_plots.distributed_loss(dist).axes[0])
    assert list(lines["one process"].get_ydata()) == dist["losses"]["single"]
    drill = data["drill"]
    lines = _lines(report_plots.drill_loss(drill).axes[0])
    resumed = lines["after resume"]
    assert list(resumed.get_ydata()) == drill["losses"]["after_resume"]
    assert list(resumed.get_xdata()) == list(range(10, 10 + len(drill["losses"]["after_resume"])))
    assert list(lines["killed after step 12"].get_xdata()) == [12, 12]


def test_latency_plot_is_each_runs_distribution_with_the_slo_line(data):
    perf = data["performance"]
    hist, cdf = report_plots.latency(perf, 10_000.0).axes
    for ax in (hist, cdf):
        assert list(_lines(ax)["p99 SLO 10000 ms"].get_xdata()) == [10_000.0, 10_000.0]
        assert ax.get_xscale() == "log"  # 0.2 ms to a 10 s SLO: the runs stay visible
    for mode, states in perf.items():
        for state, run in states.items():
            curve = _lines(cdf)[f"{mode}/{state}"]
            assert list(curve.get_xdata()) == sorted(run["latencies_ms"])
            assert list(curve.get_ydata()) == [(i + 1) / 20 for i in range(20)]
    counts = [patch for patch in hist.patches if patch.get_label() == "compiled/warm"]
    assert len(counts) == 1  # one step histogram per run
    page = report.render_html(data)
    assert "p99 SLO 10000 ms" in _part(page, "performance")  # the SVG keeps its text as text
    assert "<p>latency SLO (p99 per batch): 10,000 ms</p>" in page


def test_throughput_scaling_and_cost_plots_draw_the_report_numbers(data):
    lines = _lines(report_plots.throughput(data).axes[0])
    catalogue = lines["shape catalogue, float32"]
    shapes = sorted(data["shapes"], key=lambda s: s["shape"]["batch"])
    assert list(catalogue.get_xdata()) == [8, 16]
    assert list(catalogue.get_ydata()) == [s["shape"]["batch"] / s["repeat_call_seconds"] for s in shapes]
    warm = data["performance"]["compiled"]["warm"]
    assert list(lines["compiled/warm steady"].get_ydata()) == [warm["samples_per_second"]]
    # a language model's catalogue varies the sequence: the x axis is then batch x sequence length
    for shape in data["shapes"] + [data["performance"]["compiled"]["warm"]]:
        shape["shape"]["seq"] = 64 if shape["shape"]["batch"] == 8 else 16
    ax = report_plots.throughput(data).axes[0]
    assert list(_lines(ax)["shape catalogue, float32"].get_xdata()) == [16 * 16, 8 * 64]
    assert list(_lines(ax)["compiled/warm steady"].get_xdata()) == [16 * 16]
    assert ax.get_xlabel() == "batch x sequence length per call"
    dist = data["distributed"]
    throughput, share = report_plots.scaling(dist).axes
    single = dist["single"]["global_samples_per_second"]
    assert list(_lines(throughput)["measured (ddp)"].get_ydata()) == [single, dist["global_samples_per_second"]]
    assert list(_lines(throughput)["linear scaling"].get_ydata()) == [single, 2 * single]
    collectives = [bar.get_height() for bar in share.containers[1]]
    # matplotlib stores a stacked bar as (bottom, bottom + height): the height comes back to a rounding error
    assert collectives == pytest.approx([0.0] + [r["collective_share"] for r in dist["ranks"]], rel=1e-12, abs=1e-15)
    cost = data["cost"]
    ax = report_plots.cost(cost).axes[0]
    widths = [bar.get_width() for container in ax.containers for bar in container]
    breakdown = cost["breakdown"]
    expected = [breakdown["accelerator"], breakdown["host"], breakdown["storage"], cost["engineering"]["per_run"]]
    assert widths == expected + [cost["recovery"]["cost_per_failure"]]


def test_plots_are_inline_svg_and_the_page_is_self_contained(data, tmp_path):
    page = report.render_html(data)
    for plot in PLOTS:
        assert f'<figure class="plot" id="plot-{plot}"><svg ' in page
    assert page.count("<svg ") == len(PLOTS)
    urls = set(re.findall(r"https?://[^\"' )]+", page))
    assert urls == {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}  # XML namespaces, never fetched
    assert " src=" not in page and "<script" not in page
    report.write_drill(data["drill"], tmp_path)
    assert '<figure class="plot" id="plot-drill-loss"><svg ' in (tmp_path / "drill.html").read_text()


def test_without_matplotlib_the_report_keeps_its_tables_and_names_the_extra(data, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    assert not report_plots.available()
    page = report.render_html(data)
    assert "<svg" not in page and "<figure" not in page
    assert page.count("plots need matplotlib: pip install torch_tpu[report]") == 1 + len(PLOTS)
    assert set(re.findall(r'<section id="([\w-]+)">', page)) == SECTIONS
    assert "<td>latency_slo_ms</td><td>10,000</td>" in page and "<td>breakdown.host</td>" in page


def test_a_plot_that_fails_to_draw_leaves_the_rest_of_the_report(data, monkeypatch):
    def broken(*args):
        raise ValueError("no such series")

    monkeypatch.setattr(report_plots, "latency", broken)
    page = report.render_html(data)
    assert '<p class="noplot fail" id="plot-latency">latency plot not drawn: ValueError: no such series</p>' in page
    assert page.count("<svg ") == len(PLOTS) - 1 and set(re.findall(r'<section id="([\w-]+)">', page)) == SECTIONS


def test_report_screenshot_shows_every_section_and_plot(data, tmp_path):
    if screenshot.find_browser() is None:
        pytest.skip("chromium is not installed")
    pytest.importorskip("websocket", reason="websocket-client (the test extra) drives chromium")
    pytest.importorskip("PIL", reason="pillow (with matplotlib) reads the screenshots")
    (tmp_path / "report.html").write_text(report.render_html(data))
    layout = screenshot.sections(tmp_path / "report.html", tmp_path / "shots")
    assert_drawn(layout, SECTIONS, PLOTS)
    # The check can fail: a plot missing from the page, or drawn blank, is caught.
    without = {**layout, "boxes": [box for box in layout["boxes"] if box["id"] != "plot-scaling"]}
    with pytest.raises(AssertionError, match="plot-scaling"):
        assert_drawn(without, SECTIONS, PLOTS)
    from PIL import Image

    cost = next(box for box in layout["boxes"] if box["id"] == "plot-cost")
    Image.new("RGB", Image.open(cost["png"]).size, "white").save(cost["png"])
    with pytest.raises(AssertionError, match="plot-cost looks blank"):
        assert_drawn(layout, SECTIONS, PLOTS)
