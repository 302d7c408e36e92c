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
- TPU (and GPU after XProf's derived timelines): a `/device:*` plane whose "XLA Modules" line holds one event per
  execution ("jit_aten__mm(42)", the program id in brackets; stat `run_id`) and whose "XLA Ops" line holds its HLO
  ops, nested in it by time.
- GPU as the device tracer records it: no "XLA Modules" line; kernels on "Stream #N(...)" lines, each with
  `hlo_module`, `hlo_op` and `run_id` stats; one execution is the kernels of one (module, run), spanning them.
  On a device plane the launch is the host event carrying the execution's `run_id` stat, else (no such event) the
  host's next unclaimed call of that module, as for XLA:CPU's waiting executions. These shapes are tested on
  synthetic XSpaces shaped after XProf's names (tests/test_profiler_xspace.py), not on a TPU or GPU here.
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
    for execution in sorted(executions, key=lambda e: e.start_ns):
        execution.launch_ns = by_run.get(execution.run_id) if execution.run_id is not None else None
        starts = calls.get(execution.name, [])
        if execution.launch_ns is None:
            if starts and starts[0] <= execution.start_ns:
                execution.launch_ns = starts.pop(0)
        else:  # the call this launch was made in is claimed
            claimed = bisect.bisect_right(starts, execution.launch_ns) - 1
            if claimed >= 0:
                starts.pop(claimed)
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
    """A device plane's executions: its "XLA Modules" line with the "XLA Ops" ops nested in them (TPU), else
    its kernels grouped by (`hlo_module`, `run_id`) stats (GPU streams)."""
    device = plane.name.removeprefix("/device:")
    modules: list[Execution] = []
    ops: list[Op] = []
    kernels: dict[tuple, Execution] = {}
    for line in plane.lines:
        if line.name == "XLA Modules":
            for event in line.events:
                run = dict(event.stats).get("run_id")
                name = _MODULE_SUFFIX.sub("", event.name)
                start, end = base + int(event.start_ns), base + int(event.end_ns)
                modules.append(Execution(name, device, start, end, None if run is None else int(run)))
        elif line.name == "XLA Ops":
            ops += [Op(e.name, base + int(e.start_ns), base + int(e.end_ns), line.name) for e in line.events]
        else:
            for event in line.events:
                stats = dict(event.stats)
                module, run = stats.get("hlo_module"), stats.get("run_id")
                if module is None:
                    continue
                op = Op(str(stats.get("hlo_op", event.name)), base + int(event.start_ns), base + int(event.end_ns),
                        line.name)  # fmt: skip
                key = (module, run)
                found = kernels.get(key)
                if found is None:
                    run_id = None if run is None else int(run)
                    found = kernels[key] = Execution(module, device, op.start_ns, op.end_ns, run_id)
                found.start_ns, found.end_ns = min(found.start_ns, op.start_ns), max(found.end_ns, op.end_ns)
                found.ops.append(op)
    if modules:  # the device's own module timeline; kernels with module stats beside it are its ops already
        modules.sort(key=lambda m: m.start_ns)
        starts = [m.start_ns for m in modules]
        for op in ops:
            i = bisect.bisect_right(starts, op.start_ns) - 1
            if i >= 0 and op.end_ns <= modules[i].end_ns:
                modules[i].ops.append(op)
        return modules
    return list(kernels.values())
