"""bench/step_profile.py: where a step's device time goes, from a JAX profiler capture (bench/tpu_step.py --profile)."""

import importlib.util
import json
import subprocess
import sys

from tests.helpers import ROOT
from torch_tpu.profiler.xspace import Execution, Op

# Loaded from its file, not by putting bench/ on sys.path: bench/kernels.py would then shadow the `kernels` package
# that transformers imports, and every later Hugging Face test in this process would fail.
_SPEC = importlib.util.spec_from_file_location("step_profile", ROOT / "bench" / "step_profile.py")
step_profile = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(step_profile)
_HOST_SPEC = importlib.util.spec_from_file_location("host_profile", ROOT / "bench" / "host_profile.py")
host_profile = importlib.util.module_from_spec(_HOST_SPEC)
_HOST_SPEC.loader.exec_module(host_profile)


def _execution(name: str, start_ms: float, ops: list[tuple[str, float, float]]) -> Execution:
    ms = 1_000_000
    spans = [Op(op, int(begin * ms), int(end * ms), "XLA Ops") for op, begin, end in ops]
    return Execution(name, "TPU:0", int(start_ms * ms), max(op.end_ns for op in spans), ops=spans)


def test_summarize_gives_each_program_kind_and_op_its_device_time_per_step():
    step = lambda t: [
        _execution("jit_forward", t, [("fusion.1", t, t + 3), ("convolution.2", t + 3, t + 4)]),
        _execution("jit_backward", t + 5, [("fusion.7", t + 5, t + 6), ("%copy-start.3", t + 6, t + 8)]),
    ]
    summary = step_profile.summarize(step(0) + step(10), steps=2, wall_s=0.010)
    assert summary["programs_per_step"] == 2 and summary["distinct_programs"] == 2
    assert summary["wall_ms"] == 10.0 and summary["device_busy_ms"] == 7.0
    assert summary["top_programs_ms"] == {"jit_forward": 4.0, "jit_backward": 3.0}
    assert summary["top_kinds_ms"] == {"fusion": 4.0, "copy-start": 2.0, "convolution": 1.0}
    assert next(iter(summary["top_ops_ms"].items())) == ("jit_forward/fusion.1", 3.0)


HLO = """HloModule jit_step

%fused_product (p0: bf16[8,8], p1: bf16[8,8]) -> bf16[8,8] {
  %p0 = bf16[8,8]{1,0} parameter(0)
  %p1 = bf16[8,8]{1,0} parameter(1)
  %convolution.1 = f32[8,8]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
  ROOT %convert.2 = bf16[8,8]{1,0} convert(%convolution.1)
}

%fused_softmax (p0: f32[8,8]) -> (f32[8], f32[8,8]) {
  %p0 = f32[8,8]{1,0} parameter(0)
  %exponential.3 = f32[8,8]{1,0} exponential(%p0)
  ROOT %tuple.4 = (f32[8], f32[8,8]) tuple(%p0, %exponential.3)
}

ENTRY %main (a: bf16[8,8], b: bf16[8,8]) -> bf16[8,8] {
  %a = bf16[8,8]{1,0} parameter(0)
  %b = bf16[8,8]{1,0} parameter(1)
  %fusion.7 = bf16[8,8]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused_product
  %fusion.8 = (f32[8], f32[8,8]{1,0}) fusion(%a), kind=kLoop, calls=%fused_softmax
  %copy.9 = bf16[8,8]{0,1} copy(%fusion.7)
  %dot.10 = f32[8,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %slice-done.2 = bf16[8,8]{1,0} async-done(%copy.9)
}
"""


def test_device_time_is_classed_by_what_each_fusion_computes():
    """With the programs' optimized HLO, each op's time goes to its class: a fusion by the opcodes its computation
    holds (a tuple-typed one too), another op by its kind; op names on a TPU are whole instruction texts."""
    classes = step_profile.hlo_classes(HLO)
    assert classes["fusion.7"] == "matmul" and classes["fusion.8"] == "exp"
    assert classes["copy.9"] == "copy" and classes["slice-done.2"] == "slice-done" and classes["dot.10"] == "matmul"
    ops = [("fusion.7 = bf16[8,8]{1,0} fusion(%a, %b), kind=kOutput", 0, 3), ("fusion.8", 3, 4), ("%copy.9", 4, 6)]
    executions = [_execution("jit_step", 0, ops)]
    summary = step_profile.summarize(executions, steps=1, wall_s=0.01, classes={"jit_step": classes})
    assert summary["classes_ms"] == {"matmul": 3.0, "copy": 2.0, "exp": 1.0}
    assert summary["top_kinds_ms"]["fusion"] == 4.0 and "jit_step/fusion.7" in summary["top_ops_ms"]


def test_capture_holds_whole_steps(tmp_path):
    """The device's queued work is waited for before the trace starts and before it stops."""
    calls = []
    wall = step_profile.capture(lambda: calls.append("run"), 2, tmp_path, lambda: calls.append("settle"))
    assert calls == ["settle", "run", "run", "settle"] and wall >= 0


def test_tpu_step_profiles_jax_as_one_program_and_our_whole_step_as_its_graphs(tmp_path):
    """On the CPU platform: plain JAX's step is one program; ours compiled whole is the three graphs Dynamo makes
    of it (forward, backward, the optimizer's), each with device time, busy no longer than the wall."""
    out = tmp_path / "step.json"
    command = [sys.executable, str(ROOT / "bench" / "tpu_step.py"), "--size", "tiny", "--impls", "jax,ours"]
    command += ["--modes", "whole_step", "--steps", "1", "--warmup", "1", "--json", str(out)]
    command += ["--profile", str(tmp_path / "profile"), "--host-profile", "2"]
    printed = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600).stdout
    rows = json.loads(out.read_text())
    profiles = {row["impl"]: row["profile"] for row in rows}
    assert profiles["jax"]["programs_per_step"] == 1.0
    graphs = {name for name in profiles["ours"]["top_programs_ms"] if name.startswith("jit_compiled_graph_")}
    assert graphs == {f"jit_compiled_graph_{kind}" for kind in ("forward", "backward", "inference")}
    for profile in profiles.values():
        assert 0 < profile["device_busy_ms"] <= profile["wall_ms"]
        assert sum(profile["top_kinds_ms"].values()) > 0
    hosts = {row["impl"]: row["host_profile"] for row in rows}  # and each step's host thread, under cProfile
    ours = [where for where, *_ in hosts["ours"]["own"] + hosts["ours"]["cumulative"]]
    assert any(where.startswith(("compile/", "runtime/")) for where in ours), ours  # our graphs' calls, among the top
    assert all(hosts[impl]["wall_ms"] > 0 for impl in ("jax", "ours"))
    assert "host profile, ours whole_step" in printed and "host profile, jax jit" in printed


def test_host_profile_gives_each_function_its_time_and_calls_per_step(capsys):
    def leaf() -> int:
        return sum(range(2000))

    def step() -> None:
        for _ in range(3):
            leaf()

    profile = host_profile.capture(step, 4)
    rows = {where.rsplit("(", 1)[-1]: (own, cumulative, calls) for where, own, cumulative, calls in profile["own"]}
    own, cumulative, calls = rows["leaf)"]
    assert calls == 3.0 and 0 < own <= cumulative <= profile["wall_ms"]
    assert [row[1] for row in profile["own"]] == sorted((row[1] for row in profile["own"]), reverse=True)
    step_row = next(row for row in profile["cumulative"] if row[0].endswith("(step)"))
    assert step_row[3] == 1.0 and step_row[2] >= cumulative  # a step's time holds its three leaves'
    host_profile.report("a test", profile)
    assert "host profile, a test" in capsys.readouterr().out
