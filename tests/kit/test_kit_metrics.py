"""The kit's Prometheus metrics: a training run's progress over HTTP, the runtime's counters, and the alert rules and
dashboard queries of docs/operations.md naming only metrics that exist."""

from __future__ import annotations

import re
import urllib.request

import pytest
import torch

prometheus_parser = pytest.importorskip("prometheus_client.parser")
yaml = pytest.importorskip("yaml")
pytest.importorskip("starlette")

from prometheus_client import generate_latest  # noqa: E402

from tests.helpers import ROOT  # noqa: E402
from tests.kit import kit_workloads  # noqa: E402
from torch_tpu.distributed import launch_env  # noqa: E402
from torch_tpu.kit import checks, cli, metrics, serve  # noqa: E402

OPERATIONS = ROOT / "docs" / "operations.md"
# Metrics the docs use that other exporters provide: Prometheus itself and kube-state-metrics.
EXTERNAL = {"up", "kube_pod_container_status_restarts_total", "kube_pod_status_phase", "kube_job_status_succeeded"}
# PromQL words that look like metric names.
PROMQL = {"time", "rate", "increase", "sum", "by", "histogram_quantile", "le", "code", "max", "avg", "phase", "job"}


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _names_in(text: str) -> set[str]:
    """Every sample name the exposition can hold, also of families with no sample yet (a labelled counter)."""
    return {
        family.name + suffix
        for family in prometheus_parser.text_string_to_metric_families(text)
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in prometheus_parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The kit's own training loop (checks.train) on tpu, with a checkpoint, as `evaluate` runs it."""
    metrics.reset()
    work = kit_workloads.tiny()
    result = checks.train(work, "tpu", "eager", 4, tmp_path_factory.mktemp("ckpt"), checkpoint_at=2)
    checks.train(work, "cpu", "eager", 2)  # the reference run is not what the endpoint reports
    yield result
    metrics.reset()


def test_training_run_is_served_over_http(trained):
    """`evaluate --metrics-port`'s endpoint: steps, loss, checkpoint and progress ages, quality vs contract."""
    port = launch_env.free_port()
    server = metrics.serve_http(port, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            samples = _samples(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    assert _value(samples, "torch_tpu_train_steps_total") == 4
    assert _value(samples, "torch_tpu_train_samples_total") == 4 * 16
    assert _value(samples, "torch_tpu_train_loss") == pytest.approx(trained["losses"][-1])
    assert _value(samples, "torch_tpu_checkpoints_total") == 1
    assert _value(samples, "torch_tpu_train_samples_per_second") > 0
    assert 0 <= _value(samples, "torch_tpu_seconds_since_last_progress") < 3600
    assert _value(samples, "torch_tpu_last_checkpoint_timestamp_seconds") <= _value(
        samples, "torch_tpu_last_progress_timestamp_seconds"
    )
    assert _value(samples, "torch_tpu_quality") == pytest.approx(trained["quality"])
    assert _value(samples, "torch_tpu_quality_meets_contract") == 1


def test_runtime_counters_follow_the_public_stats():
    """Compiles and tier hits are torch.tpu's cache statistics; fallbacks are torch_tpu.metrics'; memory is
    torch.tpu.memory_allocated (read at the same moment, with a tensor alive)."""
    from torch_tpu import metrics as backend_metrics

    keep = torch.ones(256, device="tpu")
    backend_metrics.cpu_fallbacks["aten::example_op"] += 2
    try:
        stats = torch.tpu._get_cache_stats()
        samples = _samples(generate_latest(metrics.registry()).decode())
        assert _value(samples, "torch_tpu_cache_hits_total", tier="memory") >= stats["num_cache_hits"]
        assert _value(samples, "torch_tpu_cache_hits_total", tier="disk") == stats["persistent"]["hits"]
        assert (
            _value(samples, "torch_tpu_cache_misses_total", tier="graph_index") == stats["persistent"]["graph_misses"]
        )
        assert _value(samples, "torch_tpu_executables_created_total") >= stats["num_inserts"]
        assert _value(samples, "torch_tpu_cpu_fallbacks_total", op="aten::example_op") >= 2
        assert _value(samples, "torch_tpu_device_memory_allocated_bytes") == torch.tpu.memory_allocated() > 0
        assert ("process_resident_memory_bytes", ()) in samples
    finally:
        backend_metrics.cpu_fallbacks["aten::example_op"] -= 2
        del backend_metrics.cpu_fallbacks["aten::example_op"]
        del keep


def test_evaluate_takes_a_metrics_port():
    args = cli.parser().parse_args(["evaluate", "m:f", "--metrics-port", "9100"])
    assert args.metrics_port == 9100 and args.metrics_host == "0.0.0.0"
    assert cli.parser().parse_args(["evaluate", "m:f"]).metrics_port is None


def _exposed_names(trained_result) -> set[str]:
    metrics.quality(1.0, 0.5, True)  # the quality families appear once a run has measured it
    names = _names_in(generate_latest(metrics.registry()).decode())
    server = serve.Server(serve.Options(workload="tests.kit.kit_workloads:tiny"), warm_on_start=False)
    return names | _names_in(generate_latest(server.registry).decode())


def _block(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", OPERATIONS.read_text(), re.S)


def _names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_strings)
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_ranges) if not re.fullmatch(r"\d+[smhd]?", w)}


def test_alert_rules_parse_and_name_existing_metrics(trained):
    """docs/operations.md's rule file: valid Prometheus rule YAML (groups of rules with alert, expr, for, labels,
    annotations) whose expressions name only metrics the kit exports (or Prometheus/kube-state-metrics' own)."""
    (rules_text,) = _block("yaml")
    rules = yaml.safe_load(rules_text)
    exposed = _exposed_names(trained) | EXTERNAL
    alerts = set()
    for group in rules["groups"]:
        assert set(group) == {"name", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"} and isinstance(rule["expr"], str)
            assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["labels"]["severity"] in ("page", "ticket")
            assert rule["annotations"]["summary"]
            unknown = {n for n in _names(rule["expr"]) if n not in PROMQL and n not in exposed}
            assert not unknown, (rule["alert"], unknown)
            alerts.add(rule["alert"])
    assert {"TorchTPUNoProgress", "TorchTPUCheckpointLate", "TorchTPUQualityBelowContract"} <= alerts


def test_dashboard_panels_name_existing_metrics(trained):
    """The three dashboards of the guide (business, application, infrastructure); every query's metrics exist."""
    text = OPERATIONS.read_text()
    for panel in ("### Business", "### Application", "### Infrastructure"):
        assert panel in text
    exposed = _exposed_names(trained) | EXTERNAL
    queries = re.findall(r"`((?:[a-z_]+\(|torch_tpu_|process_|kube_|up\b)[^`]*)`", text.split("## Dashboards")[1])
    assert len(queries) >= 9
    for query in queries:
        unknown = {n for n in _names(query) if n not in PROMQL and n not in exposed}
        assert not unknown, (query, unknown)
