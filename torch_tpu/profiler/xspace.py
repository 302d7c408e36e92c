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
- TPU (as a v5e capture shows): a `/device:TPU:0` plane whose "XLA Modules" line holds one event per execution
  ("jit_aten__mm(13255971095483475177)", the program id in brackets; stat `run_id`, the TPU runtime's count: 2, 3,
  ...) and whose "XLA Ops" line holds its HLO ops, nested in it by time. On `/host:CPU` the launching thread's
  line ("main/<tid>") has `CommonPjRtLoadedExecutable::Execute (jit_aten__mm)` (its own `run_id` is PjRt's, not
  the device's) around `DoEnqueueProgram`, which carries the device's `run_id`; a runtime thread
  ("futex-default-SDomainT/<tid>") has `CompleteCallbacks` with the same `run_id` when the execution is done,
  after the call returned, often inside the next op's range. The Python calls (`PjitFunction(jit(aten::mm))`,
  `PjitFunction(jit(compiled_graph:inference))`) are on a "python" line. The device names a program after the
  first executable loaded with its fingerprint, so a compiled graph with the same HLO as a Fused cluster runs as
  "jit_fused_cluster_3_ops" there; the host's Execute event names the executable actually called.
- GPU as the device tracer records it: no "XLA Modules" line; kernels on "Stream #N(...)" lines, each with
  `hlo_module`, `hlo_op` and `run_id` stats; one execution is the kernels of one (module, run), spanning them.
  On a device plane the launch is the earliest host event carrying the execution's `run_id` stat (TPU:
  `DoEnqueueProgram`), the execution named after the executable whose Execute event is open around it on its
  line; else (no such event) the launch is the host's next unclaimed call of that module, as for XLA:CPU's waiting
  executions. The GPU shape is tested on synthetic XSpaces shaped after XProf's names, not on a GPU; the TPU
  shape on one shaped after the v5e capture (tests/profiler/test_profiler_xspace.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import pathlib
import re
from typing import Any

_MODULE_SUFFIX = re.compile(r"\(\d+\)$")
_EXECUTE = re.compile(r"::Execute \((.+)\)$")  # `CommonPjRtLoadedExecutable::Execute (jit_aten__mm)`


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


@dataclasses.dataclass
class _Host:
    """What the host planes say about launches and XLA:CPU's executions, gathered line by line: threadpool Records
    by flow id (time, on a host thread?), each module's outermost host calls, per run_id the earliest host event
    carrying it and the executable whose Execute event was open around it, XLA:CPU's runs by (module, run_id) and
    the flow id of the region each began in."""

    producers: dict[int, tuple[int, bool]] = dataclasses.field(default_factory=dict)
    calls: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    launches: dict[int, tuple[int, str | None]] = dataclasses.field(default_factory=dict)
    cpu_runs: dict[tuple, Execution] = dataclasses.field(default_factory=dict)
    regions: dict[tuple, int] = dataclasses.field(default_factory=dict)

    def read_line(self, line: Any, base: int) -> None:
        """One line's calls, launches, threadpool flows and XLA:CPU thunks (`tf_` lines are XLA's threads)."""
        host = not line.name.startswith("tf_")
        region, call_end, executable, executable_end = None, -1, None, -1
        for event in line.events:
            stats = dict(event.stats)
            start, end = base + int(event.start_ns), base + int(event.end_ns)
            if host and event.name.startswith("PjitFunction(jit(") and start >= call_end:
                self.calls.setdefault(_module_name(event.name), []).append(start)
                call_end = end
            called = _EXECUTE.search(event.name)
            if called:
                executable, executable_end = called.group(1), end
            if event.name == "ThreadpoolListener::Record" and "_p" in stats:
                self.producers[int(stats["_p"])] = (start, host)
            elif event.name == "ThreadpoolListener::StartRegion" and "_c" in stats:
                region = int(stats["_c"])
            module, run = stats.get("hlo_module"), stats.get("run_id")
            if run is None:
                continue
            run = int(run)
            if module is not None:
                self._cpu_op(module, run, Op(event.name, start, end, line.name), region)
            elif host and (run not in self.launches or start < self.launches[run][0]):
                self.launches[run] = (start, executable if start <= executable_end else None)

    def _cpu_op(self, module: str, run: int, op: Op, region: int | None) -> None:
        """An XLA:CPU thunk: part of its (module, run)'s execution, which the first thunk's region launched."""
        found = self.cpu_runs.get((module, run))
        if found is None:
            found = self.cpu_runs[(module, run)] = Execution(module, "XLA:CPU", op.start_ns, op.end_ns, run)
            if region is not None:
                self.regions[(module, run)] = region
        found.start_ns, found.end_ns = min(found.start_ns, op.start_ns), max(found.end_ns, op.end_ns)
        found.ops.append(op)


def read(path: str | pathlib.Path) -> list[Execution]:
    """The executions recorded in the `.xplane.pb` at `path`, ordered by start."""
    import jax.profiler

    data = jax.profiler.ProfileData.from_file(str(path))
    environment = data.find_plane_with_name("Task Environment")
    base = int(dict(environment.stats)["profile_start_time"]) if environment is not None else 0
    executions: list[Execution] = []
    host = _Host()
    for plane in data.planes:
        if plane.name.startswith("/device:"):
            executions += _device_plane(plane, base)
        else:
            for line in plane.lines:
                host.read_line(line, base)
    _cpu_launches(host)
    _device_launches(executions, host)
    return sorted(executions + list(host.cpu_runs.values()), key=lambda e: e.start_ns)


def _module_name(call: str) -> str:
    """`jit_aten__relu` for the host event `PjitFunction(jit(aten::relu))`, as JAX names modules."""
    return "jit_" + re.sub(r"\W", "_", call.removeprefix("PjitFunction(jit(").removesuffix("))"))


def _claim(starts: list[int], time: int) -> None:
    """Takes the host call made around `time` (an exact launch) out of those left to executions without one."""
    i = bisect.bisect_right(starts, time) - 1
    if i >= 0:
        starts.pop(i)


def _cpu_launches(host: _Host) -> None:
    """Each XLA:CPU execution's launch: its region's host Record, else its module's next unclaimed host call."""
    waiting: dict[str, list[Execution]] = {}
    for key, execution in sorted(host.cpu_runs.items(), key=lambda item: item[1].start_ns):
        time, on_host = host.producers.get(host.regions.get(key, -1), (None, False))
        if on_host:
            execution.launch_ns = time
            _claim(host.calls.get(execution.name, []), time)
        else:
            waiting.setdefault(execution.name, []).append(execution)
    for name, executions in waiting.items():
        starts = host.calls.get(name, [])
        for execution in executions:  # in order: a module's executions run in the order of its calls
            if starts and starts[0] <= execution.start_ns:
                execution.launch_ns = starts.pop(0)


def _device_launches(executions: list[Execution], host: _Host) -> None:
    """Each device execution's launch and the executable called: the earliest host event with its run_id (TPU's
    `CompleteCallbacks` with it comes later, after the call), else its module's next unclaimed host call."""
    for execution in sorted(executions, key=lambda e: e.start_ns):
        launch, executable = host.launches.get(execution.run_id, (None, None))
        execution.name = executable or execution.name  # the device's name may be another executable's, same HLO
        starts = host.calls.get(execution.name, [])
        if launch is not None:
            execution.launch_ns = launch
            _claim(starts, launch)
        elif starts and starts[0] <= execution.start_ns:
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
