"""Device planes of an XSpace, as TPU and GPU profilers write them, read and merged into a real torch.profiler
profile: XLA:CPU has none, so a synthetic XSpace (text proto, JAX's own parser) is laid over the host ranges of a
real profile of tpu ops. TPU shape: "XLA Modules" ("jit_aten__mm(12)", stat run_id) and "XLA Ops" lines, and
the host events of a v5e capture (DoEnqueueProgram in the call, CompleteCallbacks on a runtime thread); GPU shape:
kernels on "Stream #N(...)" lines with hlo_module/hlo_op/run_id stats. A launch is the earliest host event with the
execution's run_id, else the host's call of its module (`PjitFunction(jit(aten::mm))`)."""

import json

import jax
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torch_tpu.profiler import merge, xspace

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

STATS = ("run_id", "hlo_module", "hlo_op", "program_id", "correlation_id", "profile_start_time", "queue_id", "name")
BASE_LAG_NS = 5_000  # the XSpace's profile_start_time, before Kineto's trace start


def _host_ranges(compiled=False):
    """A real profile (CPU and TPU activities) of three matmuls and a relu on tpu tensors, then with `compiled` a
    call of a graph compiled by torch.compile, and the ranges (Kineto clock, ns) of its aten::mm and aten::relu
    events (and the graph's "Torch-Compiled Region: ..."), read from Kineto's results before the function events
    are built (the device trace they are built with is the test's)."""
    xt, wt = torch.randn(8, 16, device="tpu"), torch.randn(16, 4, device="tpu")
    graph = torch.compile(lambda a, b: torch.relu(a @ b).sum(), backend="tpu")

    def work():
        return torch.relu((xt @ wt) @ wt.T @ wt)

    work().cpu()  # compiled before the profile (a miss would add the meta kernel's aten::mm)
    if compiled:
        graph(xt, wt)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.TPU]) as prof:
        result = work()
        if compiled:
            graph(xt, wt)
    torch.testing.assert_close(result.cpu(), work().cpu())
    ranges = {}
    for event in prof.profiler.kineto_results.events():
        if event.name() in ("aten::mm", "aten::relu") or event.name().startswith("Torch-Compiled Region"):
            ranges.setdefault(event.name(), []).append((event.start_ns(), event.end_ns()))
    assert len(ranges["aten::mm"]) == 3 and len(ranges["aten::relu"]) == 1
    return prof, prof.profiler.kineto_results.trace_start_ns(), ranges


class _Plane:
    """One XPlane as text proto: named lines of events (name, start and duration in ns from the base, stats)."""

    def __init__(self, name):
        self.name, self.lines, self.names = name, {}, {}

    def event(self, line, event_name, start_ns, duration_ns, **stats):
        self.lines.setdefault(line, []).append(
            (self.names.setdefault(event_name, len(self.names) + 1), start_ns, duration_ns, stats)
        )

    def text(self, plane_id):
        stat_ids = {name: i + 1 for i, name in enumerate(STATS)}

        def stat(key, value):
            kind = "str_value" if isinstance(value, str) else "int64_value"
            return f"stats {{ metadata_id: {stat_ids[key]} {kind}: {json.dumps(value)} }}"

        lines = []
        for n, (line, events) in enumerate(self.lines.items()):
            body = " ".join(
                f"events {{ metadata_id: {meta} offset_ps: {start * 1000} duration_ps: {duration * 1000} "
                + " ".join(stat(k, v) for k, v in stats.items())
                + " }"
                for meta, start, duration, stats in events
            )
            lines.append(f"lines {{ id: {n + 1} name: {json.dumps(line)} timestamp_ns: 0 {body} }}")
        metadata = " ".join(
            f"event_metadata {{ key: {i} value {{ id: {i} name: {json.dumps(name)} }} }}"
            for name, i in self.names.items()
        )
        stat_metadata = " ".join(
            f"stat_metadata {{ key: {i} value {{ id: {i} name: {json.dumps(name)} }} }}" for name, i in stat_ids.items()
        )
        return f"planes {{ id: {plane_id} name: {json.dumps(self.name)} {' '.join(lines)} {metadata} {stat_metadata} }}"


def _write(tmp_path, base, planes):
    environment = (
        'planes { id: 99 name: "Task Environment" '
        f"stats {{ metadata_id: 6 uint64_value: {base} }} "
        'stat_metadata { key: 6 value { id: 6 name: "profile_start_time" } } }'
    )
    text = " ".join(plane.text(i + 1) for i, plane in enumerate(planes)) + " " + environment
    path = tmp_path / "synthetic.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(text))
    return path


def _inside(span, fraction):
    return span[0] + round((span[1] - span[0]) * fraction)


def _lay_out(ranges, base, device_shape):
    """Host and device planes for the profile's ranges: per aten::mm a host call of jit(aten::mm) (no run_id on
    the host: launched by that call) and an execution after it; the relu launched by a host event with its run_id.
    Returns the planes and the expected executions (name, launch, start, duration, ops)."""
    host, device = _Plane("/host:CPU"), _Plane("/device:TPU:0" if device_shape == "tpu" else "/device:GPU:0")
    expected = []
    after = max(end for spans in ranges.values() for _, end in spans) + 2_000  # devices run after the host's calls
    runs = [("jit_aten__mm", span, None) for span in ranges["aten::mm"]] + [
        ("jit_aten__relu", ranges["aten::relu"][0], 9001)
    ]
    for n, (module, span, host_run) in enumerate(runs):
        launch = _inside(span, 0.5)
        call = module.removeprefix("jit_").replace("__", "::")
        host.event("python", f"PjitFunction(jit({call}))", _inside(span, 0.3) - base, span[1] - _inside(span, 0.3) - 10)
        if host_run is not None:
            host.event("python", "PjRtLoadedExecutable::Execute", launch - base, 50, run_id=host_run)
        else:
            launch = _inside(span, 0.3)
        run_id = host_run if host_run is not None else 100 + n
        start = after + n * 10_000
        if device_shape == "tpu":
            ops = [("dot.1" if "mm" in module else "maximum.2", start + 200, 1_500), ("copy.3", start + 1_800, 600)]
            device.event("XLA Modules", f"{module}({12 + n})", start - base, 3_000, run_id=run_id, program_id=12 + n)
            for op, op_start, duration in ops:
                device.event("XLA Ops", op, op_start - base, duration)
            expected.append((module, launch, start, 3_000, [op for op, _, _ in ops]))
        else:
            kernels = [
                ("Stream #7(Compute)", "gemm_fusion_dot_kernel", "dot.1", start, 1_500),
                ("Stream #7(Compute)", "loop_convert_fusion", "convert.2", start + 1_700, 400),
                ("Stream #9(MemcpyD2D)", "MemcpyD2D", "copy.3", start + 2_300, 700),
            ]
            for line, kernel, hlo_op, kernel_start, duration in kernels:
                device.event(
                    line, kernel, kernel_start - base, duration, hlo_module=module, hlo_op=hlo_op, run_id=run_id,
                    correlation_id=700 + n,
                )  # fmt: skip
            expected.append((module, launch, start, 3_000, [hlo_op for _, _, hlo_op, _, _ in kernels]))
    return [host, device], expected


@pytest.mark.parametrize("device_shape", ["tpu", "gpu"])
def test_device_plane_gives_device_time_columns_and_flows(tmp_path, device_shape):
    prof, trace_start, ranges = _host_ranges()
    base = trace_start - BASE_LAG_NS
    planes, expected = _lay_out(ranges, base, device_shape)
    executions = xspace.read(_write(tmp_path, base, planes))

    device = "TPU:0" if device_shape == "tpu" else "GPU:0"
    got = [(e.name, e.launch_ns, e.start_ns, e.end_ns - e.start_ns, [op.name for op in e.ops]) for e in executions]
    assert got == expected
    assert {e.device for e in executions} == {device}

    prof.profiler._tpu_trace = merge.DeviceTrace(executions, None)  # in place of XLA:CPU's
    averages = {e.key: e for e in prof.key_averages()}
    # 3 µs per execution, on the op that launched it: aten::mm 3 times, aten::relu once
    assert averages["aten::mm"].self_device_time_total == pytest.approx(9.0)
    assert averages["aten::relu"].self_device_time_total == pytest.approx(3.0)
    assert averages["jit_aten__mm"].count == 3 and averages["jit_aten__relu"].count == 1
    assert "Self TPU" in prof.key_averages().table(sort_by="self_device_time_total")

    out = tmp_path / "trace.json"
    prof.export_chrome_trace(str(out))
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    modules = sorted((e for e in events if e.get("cat") == "xla_module"), key=lambda e: e["ts"])
    assert [(m["name"], m["args"]["launched by"], m["args"]["device"]) for m in modules] == [
        ("jit_aten__mm", "aten::mm", device)
    ] * 3 + [("jit_aten__relu", "aten::relu", device)]
    flows = {(e["ph"], e["id"]): e for e in events if e.get("name") == "tpu_launch"}
    assert len(flows) == 8
    by_ts = {round(m["ts"], 3): m for m in modules}
    for (phase, flow_id), flow in flows.items():
        if phase == "f":
            assert round(flow["ts"], 3) in by_ts
            start = flows[("s", flow_id)]
            launched = expected[sorted(by_ts).index(round(flow["ts"], 3))][1]
            assert start["ts"] == pytest.approx((launched - trace["baseTimeNanoseconds"]) / 1000)
    ops = [e for e in events if e.get("cat") == "xla_op"]
    assert sorted(e["name"] for e in ops) == sorted(op for *_, names in expected for op in names)
    lines = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if device_shape == "gpu":
        assert {"Stream #7(Compute)", "Stream #9(MemcpyD2D)"} <= lines
    else:
        assert "XLA Ops" in lines


def _lay_out_v5e(ranges, base):
    """Host and device planes as a TPU v5e capture has them (xspace.py's docstring): per call, `PjitFunction`
    twice (nested) on the "python" line; PjRt's Execute event, with PjRt's own run_id, around `DoEnqueueProgram`,
    with the device's run_id, on the "main" line; `CompleteCallbacks` with the device's run_id on a runtime
    thread's line (listed first), inside the next call's range; on the device an "XLA Modules" event starting a
    little before the enqueue (the chip's clock is a few hundred µs off the host's). The compiled graph runs on the
    device under the name of a Fused cluster with the same HLO (same program id), loaded before the profile.
    Returns the planes and the expected executions (name, launch, run_id) and launching ranges."""
    host, device = _Plane("/host:CPU"), _Plane("/device:TPU:0")
    futex, main = "futex-default-SDomainT/11205", "main/11029"
    for line in (futex, main, "python"):
        host.lines[line] = []
    region = next(name for name in ranges if name.startswith("Torch-Compiled Region"))
    runs = sorted(
        [("aten::mm", "jit_aten__mm(13255971095483475177)", span) for span in ranges["aten::mm"]]
        + [("aten::relu", "jit_aten__relu(4242)", ranges["aten::relu"][0])],
        key=lambda run: run[2],
    ) + [("compiled_graph:inference", "jit_fused_cluster_3_ops(8180118201890229785)", ranges[region][0])]
    expected, launchers = [], []
    for n, (call, on_device, span) in enumerate(runs):
        executable, run_id = "jit_" + call.replace(":", "_"), 2 + n
        launch, start = _inside(span, 0.7), _inside(span, 0.65)
        for outer, inner in ((0.55, 0.9), (0.56, 0.89)):
            call_span = _inside(span, outer), _inside(span, inner)
            host.event("python", f"PjitFunction(jit({call}))", call_span[0] - base, call_span[1] - call_span[0])
        execute, execute_end = _inside(span, 0.6), _inside(span, 0.85)
        host.event(
            main, f"CommonPjRtLoadedExecutable::Execute ({executable})", execute - base, execute_end - execute,
            run_id=128683992 + n, name=executable,
        )  # fmt: skip
        host.event(main, "DoEnqueueProgram", launch - base, 100, run_id=run_id, queue_id=0)
        done = _inside(runs[n + 1][2], 0.2) if n + 1 < len(runs) else span[1] + 5_000
        host.event(futex, "CompleteCallbacks", done - base, 90, run_id=run_id, queue_id=0)
        device.event("XLA Modules", on_device, start - base, 800, run_id=run_id, queue_id=0)
        device.event("XLA Ops", "%fusion = f32[8,4]{0,1:T(4,128)} fusion(...)", start + 80 - base, 650)
        expected.append((executable, launch, run_id))
        launchers.append((executable, region if call.startswith("compiled") else call))
    return [host, device], expected, launchers


def test_tpu_capture_links_each_execution_to_the_call_that_enqueued_it(tmp_path):
    """On the chip the launches were off by one (the runtime thread's CompleteCallbacks, in the next op, taken for
    the launch) and the compiled graph's execution went under the Fused cluster's name, unlinked."""
    prof, trace_start, ranges = _host_ranges(compiled=True)
    base = trace_start - BASE_LAG_NS
    planes, expected, launchers = _lay_out_v5e(ranges, base)
    executions = xspace.read(_write(tmp_path, base, planes))
    assert [(e.name, e.launch_ns, e.run_id) for e in executions] == expected

    prof.profiler._tpu_trace = merge.DeviceTrace(executions, None)
    out = tmp_path / "trace.json"
    prof.export_chrome_trace(str(out))
    modules = sorted((e for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "xla_module"),
                     key=lambda e: e["ts"])  # fmt: skip
    assert [(m["name"], m["args"]["launched by"]) for m in modules] == launchers
