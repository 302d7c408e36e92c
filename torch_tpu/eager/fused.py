"""Fused eager (`DEFER_AND_FUSE`): ops are recorded into a DAG of pending values instead of running.

A storage's buffer may hold a `Pending` value (`runtime.deferred`: shape and dtype known, data not computed yet).
When data is needed on the host (`.item()`, `.cpu()`, `print`, `torch.save`, Python control flow on values), at
`torch.tpu.synchronize()`, on leaving the mode, before a compiled graph or a data-dependent op runs, before and
after every `optimizer.step()` (`eager.steps`), where a large forward's backward begins, or past
`TORCH_TPU_FUSED_MAX_OPS` ops, the recorded cluster runs as one executable. A cut where nothing waits for a value
(the last four) of a cluster without a program yet seals it instead: its program compiles on a background thread
while Python records on, and it runs before the next cluster does or a value is read (`ASYNC_COMPILE`).
A cluster's fingerprint — the op sequence with shapes, dtypes and static arguments, and which values live storages
still hold — is built while recording and keys the executable cache; scalars and PRNG keys are run-time inputs, so
a training loop's steady state replays the same cached executables every step. Values no live storage holds are
dead: the executable neither computes nor returns them.

The cuts are placed so that clusters repeat. The optimizer's keep them aligned with training steps and pipeline a
step: the forward-and-backward cluster computes while Python records the optimizer's ops, and the optimizer's while
it records the next step's forward; a large forward with the start of its backward (`BACKWARD_CUT_BYTES`,
`BACKWARD_CUT_AT`) computes while Python records the rest of the backward. The size bound cuts a cluster before the
next op that begins as the cluster began (at the latest at twice the bound), so a loop that never synchronises
replays one cluster instead of starting each at another point of the loop's body and compiling it anew.

Recording is on the eager hot path, so each op costs a few dictionary look-ups: its `Trace` (function and
output avals) is found by the dispatcher's cache key, and the node (trace, input refs) is interned as a small
int, which makes the cluster's fingerprint a tuple of ints.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import torch

from torch_tpu import metrics
from torch_tpu.eager import modes, op_by_op, parts, programs
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.runtime import checks, deferred, memory, persistent, storage, trace_context
from torch_tpu.runtime.deferred import Pending
from torch_tpu.runtime.deferred import concrete as concrete  # re-exported: the dispatcher's name for it
from torch_tpu.runtime.deferred import is_pending as is_pending  # re-exported: the dispatcher's name for it
from torch_tpu.runtime.hooks import hooks

MAX_CLUSTER_OPS = int(os.environ.get("TORCH_TPU_FUSED_MAX_OPS", "1024"))
ASYNC_COMPILE = os.environ.get("TORCH_TPU_FUSED_ASYNC_COMPILE", "1") != "0"
"""A cluster cut where nothing waits for its values (a large forward's end, an optimizer step's edges, the size
bound) and without a program yet compiles on a background thread while Python records on; it runs when a value
is needed or a cluster with a program runs, in the order they were cut. A cold first step's clusters then compile
side by side instead of one after another (0: each compiles where it is cut)."""
COMPILE_THREADS = max(4, min(parts.MAX_PARTS + 1, os.cpu_count() or 4))
"""A thread per part of a split cluster (`eager.parts`) and one for its whole program, as the host's cores allow,
and at least 4."""
BACKWARD_CUT_BYTES = int(os.environ.get("TORCH_TPU_FUSED_BACKWARD_CUT_BYTES", str(1 << 30)))
"""Where the recording moves into or out of a backward pass (run on the thread that calls it,
`runtime/backward_thread.py`, or on the autograd engine's device thread) a cluster whose values total at least this
many bytes is cut (0: never; where: `BACKWARD_CUT_AT`), so that the device computes the forward while Python
records the backward. The default, 1 GiB (over a millisecond of a TPU's memory traffic), cuts the large GPT step's
forward (8.8 GiB of values) and not the small one's (139 MiB), which is bound by the host: there a cut costs more
than the overlap saves."""


def _ops_per_forward_op(text: str) -> float:
    """`TORCH_TPU_FUSED_BACKWARD_CUT_AT`'s value: a number of ops, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # NaN too
        setting = f"TORCH_TPU_FUSED_BACKWARD_CUT_AT={text!r}"
        raise ValueError(f"torch_tpu: {setting} is not a number of backward ops per forward op (0 or more)")
    return value


BACKWARD_CUT_AT = _ops_per_forward_op(os.environ.get("TORCH_TPU_FUSED_BACKWARD_CUT_AT", "0.5"))
"""Where in the backward `BACKWARD_CUT_BYTES` cuts: once the backward has recorded this many ops per op of the
forward (0: where it begins). What the backward's first ops read of the forward's values then stays inside one
program, where XLA recomputes or lays it out as it likes; crossing between programs, the attention probabilities
and activations of each layer went out and back in the default layout (copies) and without recomputation. On a
v5e the large GPT step's device time was 102.9 ms cut where the backward begins, 64.3 + 3.5 uncut, and the step
102.92, 92.07, 88.68, 87.48, 89.62 and 97.08 ms at 0, 0.5, 0.6, 0.7, 0.8 and 1.0 (with PyTorch's composite
products, 235 forward and 345 backward ops: 0.7 cut 164 ops, 48%, into the backward): later, the host records
more before the device starts; earlier, more crosses. With the products one op each way (`matmul.FUSED`: 199 and
213 ops), 0.3, 0.4, 0.5, 0.6, 0.7 and 0.9 took 72.67, 71.77, 70.35, 74.23, 80.03 and 88.03 ms (0.5: 99 ops, 47%,
into the backward)."""


class Trace:
    """A recordable function under one key (which fixes its inputs' avals): its output avals, flattened with
    their tree, and `id`, which stands for it in node fingerprints. `layout` is for the dispatcher: the storage
    layout of a single tensor output."""

    __slots__ = ("fn", "avals", "tree", "single", "id", "layout", "checks", "flags", "nbytes")

    def __init__(self, fn: Callable, out_avals: Any, id: int) -> None:
        self.fn = fn
        self.checks = self.flags = None
        if type(out_avals) is checks.Checked:  # device-side checks: their packed values follow the result
            self.checks, self.flags, out_avals = out_avals.checks, out_avals.flags, out_avals.result
        self.avals, self.tree = jax.tree_util.tree_flatten(out_avals)
        self.single = jax.tree_util.treedef_is_leaf(self.tree) and len(self.avals) == 1 and self.checks is None
        self.nbytes = sum(aval.size * aval.dtype.itemsize for aval in self.avals)
        self.id = id
        self.layout: Any = None


class _Recorder:
    """The cluster being recorded — its plan (per node, the interned id of (trace, input refs)), its concrete
    leaves and weak references to the buffers whose values it must produce, by id (one dict for good: a dying
    buffer removes itself) — and the tables that outlive clusters: traces by key, node ids, and per node id its
    function and input refs."""

    def __init__(self) -> None:
        self.plan: list[int] = []
        self.leaves: list[Any] = []
        self.positions: dict[int, int] = {}  # a device array's position in `leaves`, by id (it is there once)
        self.buffers: dict[int, weakref.ref] = deferred.buffers
        self.traces: dict[Hashable, Trace] = {}
        self.nodes: dict[tuple, int] = {}
        self.node_table: list[tuple[Callable, list]] = []
        self.first = -1  # the trace id of the cluster's first op
        self.checks: list[tuple[tuple, Pending]] = []  # per node that makes device-side checks: those, its flags
        self.ranks: tuple[int, ...] | None = None  # the cluster's collectives are over these ranks' devices
        self.nbytes = 0  # the bytes of the values recorded (with BACKWARD_CUT_BYTES)
        self.where = (0, False)  # the thread that recorded the last op, and whether in a backward pass
        self.cut_at = 0  # the cluster is cut once it holds this many ops (with BACKWARD_CUT_AT; 0: no cut due)

    def reset(self) -> tuple[list, list, list, list, tuple[int, ...] | None]:
        """Take the cluster; the buffers of values sealed before it stay tracked until they are computed."""
        references = list(self.buffers.values())
        taken = self.plan, self.leaves, references, self.checks, self.ranks
        self.plan, self.leaves, self.checks, self.ranks, self.nbytes, self.cut_at = [], [], [], None, 0, 0
        self.positions.clear()
        self.buffers.clear()
        if _sealed:
            for reference in references:
                buffer = reference()
                if buffer is not None and type(buffer._array) is Pending and buffer._array.sealed is True:
                    self.buffers[id(buffer)] = reference
        return taken


recorder = _Recorder()


def _signature(value: Any) -> Hashable:
    """An input's aval as a key (shape, dtype; type for Python scalars), never its value."""
    if isinstance(value, (bool, int, float, complex)):
        return type(value)
    if type(value) is Pending:
        return (value.aval.shape, value.aval.dtype)
    return (value.shape, value.dtype)


def _abstract(value: Any) -> Any:
    if type(value) is Pending:
        return value.value if value.value is not None else value.aval
    return value


def output_avals(fn: Callable, inputs: list) -> Any:
    """The shapes and dtypes `fn(*inputs)` would produce (abstract evaluation, nothing runs)."""
    return jax.eval_shape(fn, *[_abstract(x) for x in inputs])


def trace(key: Hashable, fn: Callable, inputs: list) -> Trace:
    """The Trace recorded under `key`, made from `fn` and `inputs` on first use; `key` must fix `fn` and the
    avals of its inputs."""
    found = recorder.traces.get(key)
    if found is None:
        found = recorder.traces[key] = Trace(fn, output_avals(fn, inputs), len(recorder.traces))
    return found


def record(trace: Trace, inputs: list) -> Any:
    """Record `trace.fn(*inputs)`; returns Pending outputs (a pytree like the function's)."""
    rec = recorder
    plan = rec.plan
    if len(plan) >= MAX_CLUSTER_OPS and (trace.id == rec.first or len(plan) >= 2 * MAX_CLUSTER_OPS):
        flush(extra=_unrecorded(inputs), urgent=False)
        plan = rec.plan
    if BACKWARD_CUT_BYTES:
        _cut_at_backward_edges(rec, inputs)
        plan = rec.plan
        rec.nbytes += trace.nbytes
    if not plan:
        rec.first = trace.id
    leaves = rec.leaves
    first_leaf = len(leaves)
    refs = []
    for x in inputs:
        if type(x) is Pending:
            if x.value is None:
                if not x.sealed:
                    refs.append(x.ref)
                    continue
                if isinstance(x.sealed, BaseException):  # its cluster failed: no op can read it
                    _drop_leaves(rec, first_leaf)
                    raise deferred.never_computed(x)
                # else a value of a cluster cut before, whose program compiles: an input, read when it has run
            else:
                x = x.value
        if getattr(x, "ndim", 0):  # an array: once among the leaves, which lets the cluster consume it (donation)
            position = rec.positions.setdefault(id(x), len(leaves))
            if position < len(leaves):
                refs.append(position)  # the leaf at `position` again
                continue
        refs.append(None)  # a leaf: its aval is fixed by the trace's key
        leaves.append(x)
    node = (trace.id, *refs)
    node_id = rec.nodes.get(node)
    if node_id is None:
        node_id = rec.nodes[node] = len(rec.node_table)
        rec.node_table.append((trace.fn, refs))
    index = len(plan)
    plan.append(node_id)
    if trace.single:
        return Pending(trace.avals[0], (index, 0))
    outputs = [Pending(aval, (index, i)) for i, aval in enumerate(trace.avals)]
    if trace.checks is not None:  # the cluster computes its flags too (the node's last output)
        rec.checks.append((trace.checks, Pending(trace.flags, (index, len(outputs)))))
    return jax.tree_util.tree_unflatten(trace.tree, outputs)


def _drop_leaves(rec: _Recorder, first: int) -> None:
    """Take back the leaves an op that is not recorded after all added (from `first`): a node reads its leaves in
    order, so one without its node would shift the inputs of every node after it."""
    for leaf in rec.leaves[first:]:
        if rec.positions.get(id(leaf), -1) >= first:
            del rec.positions[id(leaf)]
    del rec.leaves[first:]


def _unrecorded(inputs: list) -> list[Pending]:
    """The pending inputs of an op about to open a new cluster: values the cluster being cut must produce."""
    return [x for x in inputs if type(x) is Pending and x.value is None and not x.sealed]


def _cut_at_backward_edges(rec: _Recorder, inputs: list) -> None:
    """`BACKWARD_CUT_BYTES`: where the recording moves into a backward pass (or to another thread) with a large
    cluster, cut it there, or `BACKWARD_CUT_AT` into the backward; where it moves out, the backward's rest is cut
    before what follows it."""
    where = (threading.get_ident(), torch._C._current_graph_task_id() != -1)
    if where != rec.where:
        rec.cut_at = 0
        if rec.plan and rec.nbytes >= BACKWARD_CUT_BYTES:
            if BACKWARD_CUT_AT and where[1]:  # the recording enters a backward
                rec.cut_at = int(len(rec.plan) * (1 + BACKWARD_CUT_AT))
            else:
                flush(extra=_unrecorded(inputs), urgent=False)
        rec.where = where
    elif rec.cut_at and len(rec.plan) >= rec.cut_at:
        flush(extra=_unrecorded(inputs), urgent=False)  # which disarms it


def _record_helper(key: Hashable, fn: Callable, inputs: list) -> Any:
    """`deferred.apply`'s recording: the storage helper `fn` under `key` plus its inputs' avals."""
    return record(trace((key, *[_signature(x) for x in inputs]), fn, inputs), inputs)


def flush(extra: list[Pending] = (), urgent: bool = True) -> None:
    """Run the recorded cluster for the values live storages (and `extra`) hold. Not `urgent` (nothing waits
    for a value: a cut), a cluster without a program yet is sealed instead (`ASYNC_COMPILE`)."""
    plan, leaves, references, flagged, ranks = recorder.reset()  # first: work sealed before may fail, this too
    if not plan:
        if urgent:
            drain()
        return
    buffers = [b for b in (r() for r in references) if b is not None]
    flags = [f for _, f in flagged]
    wanted = {p.ref: p for p in [b._array for b in buffers] + list(extra) + flags if is_pending(p) and not p.sealed}
    if wanted:
        out_refs = tuple(sorted(wanted))
        fingerprint = ("fused", tuple(plan), out_refs, trace_context.cache_token(), ranks)
        with _failing(wanted.values()):
            if not urgent and ASYNC_COMPILE and ranks is None and fingerprint not in executables.entries:
                if _seal(fingerprint, plan, leaves, wanted, references, flagged):
                    return
            drain()
            if any(type(leaf) is Pending for leaf in leaves):  # values of clusters sealed before: run by now
                leaves = computed(leaves)
            with errors_named(leaves, buffers):
                results = _run(fingerprint, plan, leaves, ranks, [wanted[ref].aval for ref in out_refs])
        _finish(len(plan), wanted, out_refs, results, flagged)
    elif urgent:
        drain()
    _swap(buffers)


@contextlib.contextmanager
def _failing(values: Iterable[Pending]) -> Iterator[None]:
    """A cluster that raises leaves its values without one for good: each keeps the error (`Pending.sealed`), so
    that no later cluster takes it for one of its own nodes and a read names the failure."""
    try:
        yield
    except BaseException as error:
        kept = _detached(error)
        for pending in values:
            pending.sealed = kept
        raise


def _detached(error: BaseException) -> BaseException:
    """`error` without its traceback, whose frames hold the failed values' tensors: kept by their Pending, it
    would make a cycle that holds their memory until Python's collector runs."""
    try:
        kept = copy.copy(error)
    except Exception:  # an exception that cannot be rebuilt from its arguments: its name and message
        kept = RuntimeError(f"{type(error).__name__}: {error}")
    kept.__traceback__ = kept.__cause__ = kept.__context__ = None
    return kept


def computed(leaves: list) -> list:
    """A cluster's inputs with the values of the clusters sealed before it, which have run."""
    return [_value(leaf) if type(leaf) is Pending else leaf for leaf in leaves]


def _value(pending: Pending) -> Any:
    if pending.value is None:
        raise deferred.never_computed(pending)
    return pending.value


@contextlib.contextmanager
def errors_named(leaves: list, buffers: list, queued: Iterable[Pending] = ()) -> Iterator[None]:
    """A cluster's run: running out of memory is torch's error (with the bytes pending: `buffers`' values, and
    `queued` ones not computed), an input a jax_op's donation consumed says so."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if memory.is_oom(error):
            pending = sum(b.nbytes for b in buffers if is_pending(b._array))
            pending += sum(value.nbytes for value in queued if value.value is None)
            raise memory.out_of_memory(error, pending=pending) from error
        raise
    except RuntimeError as error:
        donated = next((e for e in map(storage.donated_error, leaves) if e is not None), None)
        if donated is not None:
            raise donated from error
        raise


def _finish(ops: int, wanted: dict, out_refs: tuple, results: Any, flagged: list) -> None:
    """A cluster has run: its values into their Pending, its device-side checks' flags to `checks`."""
    metrics.fused_clusters[ops] += 1
    for ref, value in zip(out_refs, results, strict=True):
        wanted[ref].value = value
    for found, flag in flagged:
        checks.stash(found, flag.value)


def _swap(buffers: list) -> None:
    """The buffers holding computed values hold the arrays themselves from now on."""
    tracked = deferred.buffers
    for buffer in buffers:
        value = buffer._array
        if type(value) is Pending and value.value is not None:
            buffer._array = value.value
            tracked.pop(id(buffer), None)


def _swap_tracked() -> None:
    """`_swap` for every buffer still tracked: Strict eager's kernels take arrays from storages as they are."""
    _swap([b for b in (r() for r in list(deferred.buffers.values())) if b is not None])


class _Sealed:
    """A cluster cut while its program compiles on `_compiler` (`ASYNC_COMPILE`): what running it takes."""

    def __init__(
        self, fingerprint: tuple, plan: list[int], leaves: list, wanted: dict, references: list, flagged: list
    ) -> None:
        self.fingerprint, self.ops, self.leaves, self.wanted = fingerprint, len(plan), leaves, wanted
        self.out_refs = fingerprint[2]
        self.references = references  # weak: a storage that dies meanwhile need not be kept
        self.flagged = flagged
        self.undonated = tuple(i for i, leaf in enumerate(leaves) if type(leaf) is Pending)
        self.donated: tuple[int, ...] = ()
        self.compiled: Any = None  # a `persistent.Soon` or `parts.Compiling`, set by `_seal` before it joins the queue
        self.better: persistent.Soon | None = None  # the program to switch to later (`programs.compile_soon`)

    def ready(self) -> bool:
        """Whether its program has compiled (it can run without waiting)."""
        return self.compiled.done()

    def run(self) -> None:
        _run_sealed(self)


_sealed: list[Any] = []  # in the order they were cut, which is the order they run: `_Sealed`, `warmup.Queued`
_compiler: list[ThreadPoolExecutor] = []  # made on first use
queue_lock = threading.RLock()
"""Held while the queue of sealed work changes or runs: two threads issuing Strict ops while it holds cold ops'
(`eager.warmup`) take turns instead of running one entry twice."""


def _forget_in_child() -> None:
    """A forked child has none of the parent's threads: a pool of its own, and none of the parent's clusters."""
    global queue_lock
    _compiler.clear()
    _sealed.clear()
    queue_lock = threading.RLock()  # another thread may have held the parent's


os.register_at_fork(after_in_child=_forget_in_child)


def _seal(fingerprint: tuple, plan: list[int], leaves: list, wanted: dict, references: list, flagged: list) -> bool:
    """Start compiling a cut cluster that has no program yet and keep it to run later (`drain`), its values
    sealed; False where the same cluster is compiling already (then it runs now, after those before it)."""
    if any(s.fingerprint == fingerprint for s in _sealed):
        return False
    sealed = _Sealed(fingerprint, plan, leaves, wanted, references, flagged)
    out_refs = sealed.out_refs
    out_avals = [wanted[ref].aval for ref in out_refs]
    # a sealed value (a Pending) is never consumed; an array the work queued ahead still reads is, as it will have
    # read it by then (the program is then the one later steps use, not one consuming less)
    sealed.donated = _donatable(leaves, out_avals, _alone(), _queue_references())
    replay = programs.replay([recorder.node_table[n] for n in plan], out_refs)
    sealed.compiled, sealed.better = programs.compile_soon(
        replay, sealed.donated, leaves, compiler(), op_by_op.stand_in()
    )
    for pending in wanted.values():
        pending.sealed = True
    _sealed.append(sealed)
    return True


def drain(ready_only: bool = False) -> None:
    """Run the sealed clusters (and Strict eager's queued ops), in order, each once its program is ready; with
    `ready_only`, only up to the first whose program is still compiling."""
    ran = False
    with queue_lock:
        while _sealed and (not ready_only or _sealed[0].ready()):
            try:
                with _failing(value for sealed in _sealed for value in sealed.wanted.values()):
                    _sealed[0].run()
            except BaseException:
                _sealed.clear()  # failed with it: the clusters after it read its values
                raise
            _sealed.pop(0)
            ran = True
        if ran:  # a storage that took a sealed value after its cut (a copy, an op queued in Strict eager) too
            _swap_tracked()


def compiler() -> ThreadPoolExecutor:
    """The pool sealed clusters (and Strict eager's cold ops) compile on, made on first use."""
    if not _compiler:
        _compiler.append(ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="torch_tpu_fused_compile"))
    return _compiler[0]


def _run_sealed(sealed: _Sealed) -> None:
    """Run a sealed cluster once its program is ready (the clusters sealed before it have run: its sealed inputs
    are computed), and cache the program as `_run` would have."""
    leaves = computed(sealed.leaves)
    sealed.leaves = []  # a consumed (donated) input is held by `leaves` alone
    _copy_held(leaves, sealed.donated, _alone())  # unless something the queue did not count still holds it
    buffers = [b for b in (r() for r in sealed.references) if b is not None]
    executable, from_disk, seconds = sealed.compiled()
    executable = persistent.fast_call(executable)
    with errors_named(leaves, buffers):
        results = jax.block_until_ready(executable(*leaves))
    entry = Entry(f"fused cluster of {sealed.ops} ops", executable, seconds, "fused")
    entry.donated, entry.undonated, entry.better = sealed.donated, sealed.undonated, sealed.better
    executables.insert(sealed.fingerprint, entry)
    metrics.compiled("fused", "disk" if from_disk else "compiled", seconds)
    _finish(sealed.ops, sealed.wanted, sealed.out_refs, results, sealed.flagged)
    _swap(buffers)


def _donatable(leaves: list, out_avals: list, alone: int, queued: Counter | None = None) -> tuple[int, ...]:
    """The positions of leaves a cluster's new executable will consume (`donate_argnums`): device arrays nothing
    but `leaves` holds — an in-place op's old value, which its storage has already let go of (a parameter, an
    optimizer's moment) — each with an output of its shape and dtype whose memory it can become, so that an
    optimizer step updates its state in place instead of holding two copies. `alone`: `_alone()`'s count;
    `queued`: the references the queue ahead holds, by id (`_queue_references`)."""
    free = Counter((aval.shape, aval.dtype) for aval in out_avals)
    donated = []
    for position in range(len(leaves)):
        leaf = leaves[position]
        held = alone + queued[id(leaf)] if queued else alone
        if _owned(leaf, held) and free[(leaf.shape, leaf.dtype)] > 0:
            free[(leaf.shape, leaf.dtype)] -= 1
            donated.append(position)
    return tuple(donated)


def _owned(leaf: Any, alone: int) -> bool:
    """Whether `leaf` is a device array only its one place in a cluster's leaves holds: no storage, view, cache,
    Pending or user's `to_jax`. The caller holds it in one variable, as `_alone` counts (`alone`)."""
    return isinstance(leaf, jax.Array) and sys.getrefcount(leaf) == alone


def _alone() -> int:
    """The count `_owned` sees for an object a list and one caller's variable hold, measured now: interpreters
    differ in the references they count for frames and arguments, and so does one process once Dynamo's frame
    evaluation hook has been installed (one more)."""

    def count(leaf: Any) -> int:  # a frame like `_owned`'s
        return sys.getrefcount(leaf)

    leaves = [object()]
    leaf = leaves[0]
    return count(leaf)


def _queue_references() -> Counter:
    """How many times the work queued so far (`_sealed`: clusters, Strict ops) holds each of its inputs, by id: it
    lets go of them as it runs, before anything queued after it."""
    return Counter(id(leaf) for item in _sealed for leaf in item.leaves)


def _copy_held(leaves: list, donated: tuple[int, ...], alone: int) -> None:
    """A cached executable consumes the same positions every run: one whose array is held elsewhere this time
    gets a copy, so that the donation never deletes a live value and the fingerprint never depends on it (the
    positions only grow: `_run` recompiles once when more are free than when it compiled)."""
    for position in donated:
        leaf = leaves[position]
        if not _owned(leaf, alone):
            leaves[position] = storage.copy_array(leaf)


def _run(fingerprint: tuple, plan: list[int], leaves: list, ranks: tuple[int, ...] | None, out_avals: list) -> Any:
    """The cluster's results: its cached executable, else compiled (or loaded) and cached under `fingerprint`
    (the op sequence, the values it returns, the trace context, the ranks)."""
    out_refs = fingerprint[2]
    entry = executables.lookup(fingerprint)
    if entry is not None and entry.better is not None and entry.better.done():
        programs.switch(fingerprint, entry)
    alone = _alone()
    donated = () if ranks is not None else _donatable(leaves, out_avals, alone)
    if entry is not None:
        if entry.undonated:  # compiled sealed: those inputs were values still to compute, never consumed
            donated = tuple(p for p in donated if p not in entry.undonated)
        if set(donated) <= set(entry.donated):
            _copy_held(leaves, entry.donated, alone)
            return entry.executable(*leaves)
        # more to consume than when it was compiled (an array held then is free now): once more, consuming both
        donated = tuple(sorted({*donated, *entry.donated}))
        _copy_held(leaves, donated, alone)
    start = time.perf_counter()
    replay = programs.replay([recorder.node_table[n] for n in plan], out_refs)
    from_disk, better = False, None
    if ranks is None:  # compiled as every executable is: XLA options (excess precision), persistent tier
        executable, from_disk, better = programs.compile_cluster(
            replay, donated, leaves, compiler(), op_by_op.stand_in()
        )
    else:
        executable = hooks.spmd_cluster(ranks).compile(replay, leaves)
    results = jax.block_until_ready(executable(*leaves))
    entry = Entry(f"fused cluster of {len(plan)} ops", executable, time.perf_counter() - start, "fused")
    entry.donated, entry.better = donated, better
    executables.insert(fingerprint, entry)
    metrics.compiled("fused", "disk" if from_disk else "compiled", entry.compilation_duration)
    return results


def install() -> None:
    """Record the storage helpers' computations (`runtime.hooks`: `eager_state`, `record`, `flush`)."""
    hooks.eager_state, hooks.record, hooks.flush = modes.state, _record_helper, flush
