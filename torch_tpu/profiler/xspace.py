"""The XLA executions in a JAX profiler XSpace, on the wall clock PyTorch's profiler uses.

JAX's event times are nanoseconds from the Task Environment plane's `profile_start_time` (epoch ns), the clock
Kineto's `baseTimeNanoseconds + ts` uses too (they agree within a few µs, REFERENCE.md §8), so adding it is the
whole calibration.

Two shapes of XSpace are read:
- XLA:CPU has no device plane: an execution's thunks (fusions, dots) run on `tf_XLAPjRtCpuClient` threads of the
  `/host:CPU` plane, each with `hlo_module` and `run_id` stats; one execution is the events of one (module, run).
  Its launch is the `ThreadpoolListener::Record` event (producer id `_p`) whose consumer
  `ThreadpoolListener::StartRegion` (`_c`) opens the region the thunks ran in, when that Record is on a host
  thread (the call). An execution that waited for its inputs was scheduled from an XLA thread when they were
  ready; its launch is then the host's call of that module (`PjitFunction(jit(aten::relu))`, outermost), matched
  in order among that module's calls no exact launch took.
- TPU and GPU: a `/device:*` plane whose "XLA Modules" line holds one event per execution ("jit_aten__mm(42)")
  and whose "XLA Ops" line holds the ops; the launch is the host event carrying the same `run_id` stat. (Written
  from XProf's documented layout; only the XLA:CPU shape is exercised by the tests here.)
"""

from __future__ import annotations

import bisect
import dataclasses
import pathlib
import re

_MODULE_SUFFIX = re.compile(r"\(\d+\)$")


@dataclasses.dataclass
class Op:
    """One HLO op (or fused computation) of an execution, on the line (thread, or device line) it ran on."""

    name: str
    start_ns: int
    end_ns: int
    line: str


@dataclasses.dataclass
class Execution:
    """One run of an XLA executable: its module name (`jit_aten__mm`), device, span, and when the host launched
    it (None when the XSpace does not say)."""

    name: str
    device: str
    start_ns: int
    end_ns: int
    run_id: int | None = None
    launch_ns: int | None = None
    ops: list[Op] = dataclasses.field(default_factory=list)

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1000


def read(path: str | pathlib.Path) -> list[Execution]:
    """The executions recorded in the `.xplane.pb` at `path`, ordered by start."""
    import jax.profiler

    data = jax.profiler.ProfileData.from_file(str(path))
    environment = data.find_plane_with_name("Task Environment")
    base = int(dict(environment.stats)["profile_start_time"]) if environment is not None else 0
    executions: list[Execution] = []
    producers: dict[int, tuple[int, bool]] = {}  # flow id -> the launching event's time, on a host thread
    calls: dict[str, list[int]] = {}  # module name -> start times of the host's outermost calls of it
    by_run: dict[int, int] = {}  # run_id -> the host event's time (TPU/GPU launches)
    regions: dict[tuple, int] = {}  # (module, run_id) of an XLA:CPU execution -> the flow id opening its region
    cpu_runs: dict[tuple, Execution] = {}
    for plane in data.planes:
        if plane.name.startswith("/device:"):
            executions += _device_plane(plane, base)
            continue
        for line in plane.lines:
            region = None
            host = not line.name.startswith("tf_")
            call_end = -1
            for event in line.events:
                stats = dict(event.stats)
                start = base + int(event.start_ns)
                if host and event.name.startswith("PjitFunction(jit(") and start >= call_end:
                    calls.setdefault(_module_name(event.name), []).append(start)
                    call_end = base + int(event.end_ns)
                if event.name == "ThreadpoolListener::Record" and "_p" in stats:
                    producers[int(stats["_p"])] = (start, host)
                elif event.name == "ThreadpoolListener::StartRegion" and "_c" in stats:
                    region = int(stats["_c"])
                module, run = stats.get("hlo_module"), stats.get("run_id")
                if module is None or run is None:
                    if run is not None and not line.name.startswith("tf_"):
                        by_run.setdefault(int(run), start)
                    continue
                op = Op(event.name, start, base + int(event.end_ns), line.name)
                found = cpu_runs.get((module, run))
                if found is None:
                    found = cpu_runs[(module, run)] = Execution(module, "XLA:CPU", op.start_ns, op.end_ns, int(run))
                    if region is not None:
                        regions[(module, run)] = region
                found.start_ns, found.end_ns = min(found.start_ns, op.start_ns), max(found.end_ns, op.end_ns)
                found.ops.append(op)
    _cpu_launches(cpu_runs, regions, producers, calls)
    for execution in executions:
        if execution.run_id is not None:
            execution.launch_ns = by_run.get(execution.run_id)
    executions += cpu_runs.values()
    return sorted(executions, key=lambda e: e.start_ns)


def _module_name(call: str) -> str:
    """`jit_aten__relu` for the host event `PjitFunction(jit(aten::relu))`, as JAX names modules."""
    return "jit_" + re.sub(r"\W", "_", call.removeprefix("PjitFunction(jit(").removesuffix("))"))


def _cpu_launches(runs: dict[tuple, Execution], regions: dict, producers: dict, calls: dict[str, list[int]]) -> None:
    """Each XLA:CPU execution's launch: its region's host Record, else its module's next unclaimed host call."""
    waiting: dict[str, list[Execution]] = {}
    for key, execution in sorted(runs.items(), key=lambda item: item[1].start_ns):
        time, host = producers.get(regions.get(key, -1), (None, False))
        if host:
            execution.launch_ns = time
            starts = calls.get(execution.name, [])
            claimed = bisect.bisect_right(starts, time) - 1  # the call this Record was made in
            if claimed >= 0:
                starts.pop(claimed)
        else:
            waiting.setdefault(execution.name, []).append(execution)
    for name, executions in waiting.items():
        starts = calls.get(name, [])
        for execution in executions:  # in order: a module's executions run in the order of its calls
            if starts and starts[0] <= execution.start_ns:
                execution.launch_ns = starts.pop(0)


def _device_plane(plane: object, base: int) -> list[Execution]:
    """A TPU/GPU device plane's executions ("XLA Modules") with their ops ("XLA Ops") by time."""
    device = plane.name.removeprefix("/device:")
    modules: list[Execution] = []
    ops: list[Op] = []
    for line in plane.lines:
        if line.name == "XLA Modules":
            for event in line.events:
                run = dict(event.stats).get("run_id")
                name = _MODULE_SUFFIX.sub("", event.name)
                start, end = base + int(event.start_ns), base + int(event.end_ns)
                modules.append(Execution(name, device, start, end, None if run is None else int(run)))
        elif line.name == "XLA Ops":
            ops += [Op(e.name, base + int(e.start_ns), base + int(e.end_ns), line.name) for e in line.events]
    for op in ops:
        for module in modules:
            if module.start_ns <= op.start_ns and op.end_ns <= module.end_ns:
                module.ops.append(op)
                break
    return modules
