"""Strict eager's warm-up: an op whose program is not compiled yet does not wait for XLA.

A cold process's first step in Strict eager compiles dozens of per-op programs (the large GPT step on a TPU host:
68 programs, 52 s of XLA), one after another, each where an op first needs it. Here a cold op's program compiles
on Fused eager's pool (`fused.compiler()`) while Python goes on: the op's outputs are sealed `Pending` values
(`runtime.deferred`), and it and every op after it wait in Fused eager's queue of sealed work (`fused._sealed`),
in order, until a value is needed (a read, a sync, an op that cannot wait, a compiled graph) or their programs
are ready: the queue runs up to the first op still compiling each time an op joins it. A cold step's programs
thus compile side by side; a warm step queues nothing and takes the steady-state path unchanged. The values are
those running each op at once gives: the same programs, run in the same order.

Not queued (the queue runs first, then the op, as before): Debug mode; ops while torch.profiler records; ops
that donate inputs or run op by op (no jit); a cold op with 64-bit floats on a TPU (XLA may refuse them: the op
raises where it is called); ops on another device than this process's first. A queued op whose program makes
device-side checks (an embedding's indices) leaves them pending when it runs, as any Strict op does: a failed one
raises at the next read. `TORCH_TPU_STRICT_ASYNC_COMPILE=0` compiles each program where it is needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Any

import jax
from torch._ops import OpOverload

from torch_tpu import metrics
from torch_tpu.eager import fused, modes, programs
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.runtime import checks as device_checks
from torch_tpu.runtime import compat, float64, persistent
from torch_tpu.runtime.deferred import Pending

ASYNC_COMPILE = os.environ.get("TORCH_TPU_STRICT_ASYNC_COMPILE", "1") != "0"
MAX_QUEUED = 4096
"""Past this many queued ops and clusters, the queue runs, waiting for their programs: the inputs it holds stay
bounded."""


class _Program:
    """A cold op's program compiling on the pool. Its cache entry is in `executables` from the start (so the op's
    next calls share it), calling this until it is compiled; the first queued op to run completes it. A compile
    that fails drops the entry (the op's next call compiles again) and raises where the queue runs."""

    def __init__(self, key: Hashable, entry: Entry, soon: persistent.Soon, checked: bool) -> None:
        self.key, self.entry, self.soon, self.checked = key, entry, soon, checked

    def ready(self) -> bool:
        return self.entry.compiling is None or self.soon.done()

    def executable(self) -> Callable:
        entry = self.entry
        if entry.compiling is not None:
            try:
                compiled, from_disk, seconds = self.soon()
            except BaseException:
                executables.discard(self.key, entry)
                raise
            executable = persistent.fast_call(compiled)
            # device-side checks: each call leaves them pending, as an op compiled where it is called does
            entry.executable = device_checks.stashing(executable) if self.checked else executable
            entry.compilation_duration = seconds
            entry.source = "disk" if from_disk else "compiled"
            entry.compiling = None
            executables.refit(self.key, entry)
            metrics.compiled("eager", entry.source, seconds)
        return entry.executable


class Queued:
    """One Strict op in the queue (`fused._sealed`): its program (an `Entry`, or a `_Program` compiling), its
    inputs (arrays, and sealed values of the ops before it) and its outputs (`wanted`, sealed until it runs)."""

    def __init__(self, key: Hashable, program: Entry | _Program, leaves: list, outputs: list[Pending]) -> None:
        self.fingerprint, self.program, self.leaves = key, program, leaves
        self.outputs = outputs
        self.wanted = dict(enumerate(outputs))

    def ready(self) -> bool:
        return type(self.program) is Entry or self.program.ready()

    def run(self) -> None:
        program = self.program
        executable = program.executable if type(program) is Entry else program.executable()
        leaves = fused.computed(self.leaves)
        self.leaves = []
        with fused.errors_named(leaves, [], (value for item in fused._sealed for value in item.wanted.values())):
            results = jax.tree_util.tree_leaves(executable(*leaves))
        for pending, value in zip(self.outputs, results, strict=True):
            pending.value = value


def queue(runner: Any, meta_op: OpOverload, key: Hashable, call: tuple, leaves: list, entry: Entry | None) -> Any:
    """Queue a Strict op (the dispatcher's `Runner`, its key and (args, kwargs, template), its inputs, its cached
    entry or None): its sealed outputs, like the executable's; None where it cannot wait, after the queue has run
    (`leaves` then holds computed values)."""
    lowering, state = runner.lowering, modes.state
    if (
        ASYNC_COMPILE
        and not (state.blocking or state.fused)
        and lowering.jit
        and not lowering.donate
        and _here(leaves)
        and not compat.profiler_enabled()  # a profile attributes each op's device time to the op
    ):
        with fused.queue_lock:
            _seal_recorded(leaves)
            if entry is None:  # (another thread may have started it since the caller looked)
                entry = executables.entries.get(key) or _start(runner, meta_op, key, call, leaves)
            if entry is not None and entry.out_avals is not None and (entry.compiling is not None or fused._sealed):
                tree, outputs = _enqueue(key, entry, leaves)
                if len(fused._sealed) > MAX_QUEUED:
                    fused.flush()
                else:
                    _run_ready()
                # run already (its program was ready): no storage may take a value to compute once nothing is queued
                return jax.tree_util.tree_unflatten(tree, [p if p.value is None else p.value for p in outputs])
    if fused._sealed or any(type(x) is Pending for x in leaves):
        fused.flush()
        leaves[:] = fused.computed(leaves)
    return None


def _here(leaves: list) -> bool:
    """Whether the op's arrays are on this process's first device, where a queued value's program runs, and not
    consumed by a donation (an op reading one raises where it is called, naming the donation)."""
    home = programs.home()
    return all(
        type(x) is Pending or not isinstance(x, jax.Array) or (x.sharding == home and not x.is_deleted())
        for x in leaves
    )


def _seal_recorded(leaves: list) -> None:
    """Inputs the Fused recorder holds (a storage helper's on a queued value: a view's gather, a cast) come from
    a cluster cut now, queued (or run) before the op."""
    recorded = [x for x in leaves if type(x) is Pending and x.value is None and not x.sealed]
    if recorded:
        fused.flush(extra=recorded, urgent=False)


@compat.without_dynamo_frames
def _start(runner: Any, meta_op: OpOverload, key: Hashable, call: tuple, leaves: list) -> Entry | None:
    """Trace and lower a cold op's program here (its lowering reads settings), start compiling it and cache its
    entry; None where it must compile now (64-bit floats on a TPU: XLA may refuse them)."""
    args, kwargs, template = call
    traced, dtypes = runner.trace_checked(meta_op, args, kwargs, template, leaves)
    if float64.applies(dtypes):
        return None
    lowered = jax.jit(traced).lower(*programs.lowering_avals(leaves))
    checked = type(lowered.out_info) is device_checks.Checked  # (an embedding's indices, checked on the device)
    entry = Entry(str(meta_op), lambda *leaves: program.executable()(*leaves), source="compiling")
    entry.describe(lowered.out_info.result if checked else lowered.out_info)
    soon = persistent.compile_soon(lowered, fused.compiler(), eager=True)
    program = entry.compiling = _Program(key, entry, soon, checked)
    executables.insert(key, entry)
    return entry


def _enqueue(key: Hashable, entry: Entry, leaves: list) -> tuple[Any, list[Pending]]:
    """Queue the op; its result's structure and its outputs, sealed."""
    avals, tree = jax.tree_util.tree_flatten(entry.out_avals)
    outputs = [Pending(aval, (-1, i)) for i, aval in enumerate(avals)]
    for pending in outputs:
        pending.sealed = True
    fused._sealed.append(Queued(key, entry.compiling or entry, list(leaves), outputs))
    return tree, outputs


def _run_ready() -> None:
    """Run the queue up to the first op still compiling. Once it is empty, what the Fused recorder took meanwhile
    runs too: in Strict eager no buffer holds a value to compute while nothing is queued."""
    fused.drain(ready_only=True)
    if not fused._sealed and fused.recorder.plan and not modes.state.fused:
        fused.flush()
