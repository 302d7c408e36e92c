"""torch.profiler with ProfilerActivity.TPU: the XSpace file, device time per ATen op, one merged Chrome trace with
launch flows, executables named after what they run (Strict, Fused, compiled), record_function ranges in XProf,
and a CPU-only profile exactly as PyTorch makes it."""

import json
import socket
import time

import jax
import jax.numpy as jnp
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torch_tpu.eager import programs
from torch_tpu.profiler import session

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.TPU]


def _step(x, w):
    with record_function("train_step"):
        return torch.relu(x @ w).sum()


def _xplane_names(path):
    data = jax.profiler.ProfileData.from_file(str(path))
    return {event.name for plane in data.planes for line in plane.lines for event in line.events}


def _chrome(prof, tmp_path, name="trace.json"):
    out = tmp_path / name
    prof.export_chrome_trace(str(out))
    return json.loads(out.read_text())


def _check_flows(trace, span, module_prefix, launcher=None):
    """Every device execution starting with `module_prefix` has a flow from a host range that was open at the
    launch (on that range's thread), and every timestamp (host and device) lies within `span`, the wall-clock
    nanoseconds around the profile."""
    events = trace["traceEvents"]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    modules = [e for e in events if e.get("cat") == "xla_module"]
    ops = [e for e in events if e.get("cat") == "xla_op"]
    assert modules and ops
    base = trace["baseTimeNanoseconds"]
    for event in host + modules + ops:
        assert span[0] <= base + event["ts"] * 1000 and base + (event["ts"] + event["dur"]) * 1000 <= span[1], event
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("name") == "tpu_launch"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("name") == "tpu_launch"}
    assert starts.keys() == ends.keys()
    linked = []
    for flow_id, start in starts.items():
        target = next(m for m in modules if m["ts"] == ends[flow_id]["ts"] and m["pid"] == ends[flow_id]["pid"])
        source = [
            e
            for e in host
            if e["pid"] == start["pid"] and e["tid"] == start["tid"] and e["ts"] <= start["ts"] <= e["ts"] + e["dur"]
        ]
        assert source, start
        assert target["args"]["launched by"] == min(source, key=lambda e: e["dur"])["name"]
        linked.append((target["args"]["launched by"], target["name"]))
    wanted = [pair for pair in linked if pair[1].startswith(module_prefix)]
    assert wanted, linked
    if launcher is not None:
        assert any(source == launcher for source, _ in wanted), wanted
    return linked


def test_strict_profile_files_device_time_and_merged_trace(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    xt, wt = x.to("tpu"), w.to("tpu")
    cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir=tmp_path / "run", worker_rank=3)
    _step(xt, wt)  # compiled first: a miss runs the meta kernel, another aten::mm in the profile
    begin = time.time_ns()
    with profile(activities=ACTIVITIES, experimental_config=cfg) as prof:
        for _ in range(2):
            loss = _step(xt, wt)
    span = (begin, time.time_ns())
    torch.testing.assert_close(loss.cpu(), _step(x, w))

    files = list((tmp_path / "run" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert [f.name for f in files] == [f"{socket.gethostname()}_3.xplane.pb"]
    assert prof.profiler._tpu_trace.path == files[0]
    names = _xplane_names(files[0])
    assert "train_step" in names  # record_function ranges are XProf annotations too

    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].self_device_time_total > 0 and averages["aten::mm"].count == 2
    assert averages["jit_aten__mm"].count == 2 and averages["jit_aten__mm"].self_device_time_total > 0
    assert averages["aten::relu"].self_device_time_total > 0
    assert averages["train_step"].device_time_total >= averages["aten::mm"].device_time_total
    assert "Self TPU" in prof.key_averages().table(sort_by="self_device_time_total")

    trace = _chrome(prof, tmp_path)
    assert trace["tpu_xspace"] == str(files[0])
    linked = _check_flows(trace, span, "jit_aten__mm", launcher="aten::mm")
    assert ("aten::relu", "jit_aten__relu") in linked


def test_fused_and_compiled_executables_are_named(tmp_path):
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    xt, wt = x.to("tpu"), w.to("tpu")
    compiled = torch.compile(lambda a, b: torch.relu(a @ b).sum(), backend="tpu")
    compiled(xt, wt)  # compiled before the profile
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        _step(xt, wt).item()  # the cluster too: where clusters compile in two tiers (a TPU), its final program
    torch.tpu.finish_compiles()  # runs from now on, not its ops one by one
    begin = time.time_ns()
    with profile(activities=ACTIVITIES) as prof:
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            fused_loss = _step(xt, wt).item()
        compiled_loss = compiled(xt, wt)
    span = (begin, time.time_ns())
    assert fused_loss == pytest.approx(_step(x, w).item(), rel=1e-5)
    torch.testing.assert_close(compiled_loss.cpu(), _step(x, w))
    trace = _chrome(prof, tmp_path)
    _check_flows(trace, span, "jit_fused_cluster_", launcher="aten::_local_scalar_dense")
    _check_flows(trace, span, "jit_compiled_graph_")
    assert prof.profiler._tpu_trace.path is None  # no run_dir: the XSpace is not kept


def test_named_scope_per_op_in_a_fused_cluster():
    def neg(x):
        return -x

    neg.__name__ = "aten::neg"
    cluster = programs.replay([(neg, [None])], ((0, 0),))
    lowered = jax.jit(cluster).lower(jnp.ones(3))
    assert "module @jit_fused_cluster_1_ops" in lowered.as_text()
    assert "aten::neg" in lowered.as_text(debug_info=True)


def test_schedule_and_tensorboard_trace_handler(tmp_path):
    xt, wt = torch.randn(8, 16, device="tpu"), torch.randn(16, 4, device="tpu")
    cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir=tmp_path / "run", worker_rank="0")
    begin = time.time_ns()
    with profile(
        activities=ACTIVITIES,
        experimental_config=cfg,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path / "tb"), worker_name="w0"),
    ) as prof:
        for _ in range(6):
            _step(xt, wt)
            prof.step()
    span = (begin, time.time_ns())
    exported = sorted((tmp_path / "tb").glob("w0.*.pt.trace.json"))
    assert len(exported) == 2
    for path in exported:  # every active cycle has its executions, linked (a regression: 1 cycle in 3 had none)
        trace = json.loads(path.read_text())
        _check_flows(trace, span, "jit_aten__mm", launcher="aten::mm")
        steps = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
        assert len(steps) == 1
    assert len(list((tmp_path / "run" / "plugins" / "profile").glob("*/*_0.xplane.pb"))) == 2


def _structure(prof, tmp_path, name):
    """A profile's events as names and parents, and its Chrome trace's (category, name) list: no timings."""
    events = [(e.name, e.cpu_parent.name if e.cpu_parent else None, e.device_type) for e in prof.events()]
    trace = _chrome(prof, tmp_path, name)
    kinds = sorted((e.get("ph"), e.get("cat"), e.get("name")) for e in trace["traceEvents"] if e.get("ph") != "M")
    return events, kinds, sorted(trace)


def test_cpu_only_profile_is_pytorchs_own(tmp_path):
    xt, wt = torch.randn(8, 16, device="tpu"), torch.randn(16, 4, device="tpu")
    cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir=tmp_path / "run")
    _step(xt, wt)  # compiled: both profiles see cache hits only

    def run(config):
        with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
            _step(xt, wt)
        return prof

    ours = [_structure(run(c), tmp_path, f"ours{i}.json") for i, c in enumerate((None, cfg))]
    session.uninstall()
    try:
        theirs = _structure(run(None), tmp_path, "theirs.json")
    finally:
        session.install()
    assert ours[0] == theirs and ours[1] == theirs
    assert not (tmp_path / "run").exists()  # no TPU activity: JAX's profiler never ran


def test_config_rejects_bad_levels():
    with pytest.raises(ValueError, match="host_tracer_level"):
        torch.tpu.profiler.TpuProfilerConfig(host_tracer_level=7)
    with pytest.raises(TypeError, match="experimental_options"):
        torch.tpu.profiler.TpuProfilerConfig(experimental_options={"a": 1.5})
    torch.tpu.profiler.TpuProfilerConfig(verbose=True)  # Kineto's own options pass through (every release has this)
    if "trace_only" in (torch._C._profiler._ExperimentalConfig.__init__.__doc__ or ""):  # torch >= 2.13
        assert torch.tpu.profiler.TpuProfilerConfig(trace_only=True).trace_only


def test_rank_in_file_name_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    assert torch.tpu.profiler.TpuProfilerConfig().rank() == "5"
    assert torch.tpu.profiler.TpuProfilerConfig(worker_rank=2).rank() == "2"


def test_a_running_jax_trace_is_a_clear_error_and_leaves_torch_profiler_usable(tmp_path):
    xt = torch.randn(4, 4, device="tpu")
    jax.profiler.start_trace(str(tmp_path / "theirs"))
    try:
        with pytest.raises(RuntimeError, match="ProfilerActivity.TPU could not start JAX's profiler"):
            with profile(activities=ACTIVITIES):
                xt + 1
    finally:
        jax.profiler.stop_trace()
    with profile(activities=ACTIVITIES) as prof:
        (xt + 1).cpu()
    assert any(e.name == "jit_aten__add" for e in prof.events())
