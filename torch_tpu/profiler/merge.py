"""The XLA executions of an XSpace joined to PyTorch's profile: device time per op and one Chrome trace.

An execution belongs to the innermost host range (ATen op or `record_function`) that was open when the host
launched it — eager's `aten::mm` for `jit_aten__mm`, the op that materialised a Fused cluster, the compiled
region's call for a graph. That range gets a kernel of the execution's duration (so `key_averages()` has "Self
TPU" times, as CUDA kernels give a CUDA op) and the profile gets a PrivateUse1 event per execution; the Chrome
trace gets a device process with the executions and their ops, and a flow from each launching range to its
execution, all on Kineto's clock (`baseTimeNanoseconds + ts`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import pathlib
import re
from typing import Any

from torch.autograd.profiler_util import EventList, FunctionEvent
from torch.profiler import DeviceType

from torch_tpu.profiler.xspace import Execution

_HOST_CATEGORIES = ("cpu_op", "user_annotation")
_DEVICE_PID = 1 << 30  # past any OS pid, so the device process never merges with a host's
_FLOW_BASE = 1 << 40  # past Kineto's correlation ids


@dataclasses.dataclass
class DeviceTrace:
    """What one profiling cycle's XSpace held: its executions, and the file kept (None without a run_dir)."""

    executions: list[Execution]
    path: pathlib.Path | None


class _Spans:
    """Host ranges by start, to find the innermost one open at a time (ranges nest on a thread)."""

    def __init__(self, spans: list[tuple[int, int, Any]]) -> None:
        self.spans = sorted(spans, key=lambda s: (s[0], -s[1]))
        self.starts = [s[0] for s in self.spans]

    def at(self, time_ns: int) -> Any | None:
        i = bisect.bisect_right(self.starts, time_ns) - 1
        while i >= 0:
            start, end, payload = self.spans[i]
            if end >= time_ns:
                return payload
            i -= 1
        return None


def _launch(execution: Execution) -> int:
    return execution.launch_ns if execution.launch_ns is not None else execution.start_ns


def _device_index(execution: Execution) -> int:
    found = re.search(r"(\d+)$", execution.device)
    return int(found.group(1)) if found else 0


def into_function_events(events: EventList, trace: DeviceTrace, trace_start_ns: int) -> None:
    """Add a PrivateUse1 event per execution and a kernel to the range that launched it (once per list)."""
    if getattr(events, "_tpu_merged", False):
        return
    events._tpu_merged = True
    host = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    spans = _Spans(
        [
            (trace_start_ns + round(e.time_range.start * 1000), trace_start_ns + round(e.time_range.end * 1000), e)
            for e in host
        ]
    )
    next_id = max((e.id for e in events), default=0) + 1
    use_device = next((e.use_device for e in host if e.use_device), "tpu")
    for execution in trace.executions:
        parent = spans.at(_launch(execution))
        index = _device_index(execution)
        if parent is not None:
            parent.append_kernel(execution.name, index, execution.duration_us)
        events.append(
            FunctionEvent(
                id=next_id,
                name=execution.name,
                thread=0,
                start_us=(execution.start_ns - trace_start_ns) / 1000,
                end_us=(execution.end_ns - trace_start_ns) / 1000,
                use_device=use_device,
                device_type=DeviceType.PrivateUse1,
                device_index=index,
                trace_name=execution.name,
                input_shapes=[],
                stack=[],
            )
        )
        next_id += 1


def into_chrome_trace(path: str | pathlib.Path, trace: DeviceTrace) -> None:
    """Rewrite the Chrome trace at `path` with the device's timeline and the launch flows."""
    path = pathlib.Path(path)
    document = json.loads(path.read_text())
    base = int(document.get("baseTimeNanoseconds", 0))
    events = document.setdefault("traceEvents", [])
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in _HOST_CATEGORIES]
    spans = _Spans([(base + round(e["ts"] * 1000), base + round((e["ts"] + e.get("dur", 0)) * 1000), e) for e in host])

    def us(ns: int) -> float:
        return (ns - base) / 1000

    tids: dict[tuple[int, str], int] = {}
    added: list[dict] = []
    for n, execution in enumerate(trace.executions):
        pid = _DEVICE_PID + _device_index(execution)
        if (pid, "XLA Modules") not in tids:
            tids[(pid, "XLA Modules")] = 0
            added += _process_metadata(pid, execution.device)
        parent = spans.at(_launch(execution))
        args = {"device": execution.device, "run_id": execution.run_id}
        if parent is not None:
            args["launched by"] = parent["name"]
        start = us(execution.start_ns)
        added.append(
            {"ph": "X", "cat": "xla_module", "name": execution.name, "pid": pid, "tid": 0, "ts": start,
             "dur": execution.duration_us, "args": args}
        )  # fmt: skip
        for op in execution.ops:
            tid = tids.setdefault((pid, op.line), len([k for k in tids if k[0] == pid]))
            added.append(
                {"ph": "X", "cat": "xla_op", "name": op.name, "pid": pid, "tid": tid, "ts": us(op.start_ns),
                 "dur": (op.end_ns - op.start_ns) / 1000, "args": {"hlo_module": execution.name}}
            )  # fmt: skip
        if parent is not None:
            flow = {"id": _FLOW_BASE + n, "cat": "ac2g", "name": "tpu_launch"}
            added.append({**flow, "ph": "s", "pid": parent["pid"], "tid": parent["tid"], "ts": us(_launch(execution))})
            added.append({**flow, "ph": "f", "bp": "e", "pid": pid, "tid": 0, "ts": start})
    for (pid, line), tid in tids.items():
        added.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": line}})
        added.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    events += added
    if trace.path is not None:
        document["tpu_xspace"] = str(trace.path)
    path.write_text(json.dumps(document))


def _process_metadata(pid: int, device: str) -> list[dict]:
    name = f"TPU {pid - _DEVICE_PID} (XLA executions, {device})"
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "TPU"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
