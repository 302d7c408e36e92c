"""Fused eager (`DEFER_AND_FUSE`): ops are recorded into a DAG of pending values instead of running.

A storage's buffer may hold a `Pending` value (shape and dtype known, data not computed yet). When data is
needed on the host (`.item()`, `.cpu()`, `print`, `torch.save`, Python control flow on values), at
`torch.tpu.synchronize()`, on leaving the mode, before a compiled graph or a data-dependent op runs, or when a
cluster reaches `TORCH_TPU_FUSED_MAX_OPS` ops, the recorded cluster runs as one executable. Its fingerprint —
the op sequence with shapes, dtypes and static arguments, and which values live storages still hold — is
built while recording and keys the executable cache; scalars and PRNG keys are run-time inputs, so a training
loop's steady state replays one cached executable per step. Values no live storage holds are dead: the
executable neither computes nor returns them.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax

from torch_tpu.eager.cache import Entry, executables

MAX_CLUSTER_OPS = int(os.environ.get("TORCH_TPU_FUSED_MAX_OPS", "4096"))


class Pending:
    """Output `index` of recorded node `node`; `value` is set once its cluster has run."""

    __slots__ = ("aval", "node", "index", "value")

    def __init__(self, aval: jax.ShapeDtypeStruct, node: int, index: int) -> None:
        self.aval = aval
        self.node = node
        self.index = index
        self.value: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def dtype(self) -> Any:
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.aval.shape)

    @property
    def size(self) -> int:
        return self.aval.size

    @property
    def nbytes(self) -> int:
        return self.aval.size * self.aval.dtype.itemsize


class _Recorder:
    """The cluster being recorded: per node its function and (key, input refs); the concrete leaves; and the
    buffers whose values it must produce."""

    def __init__(self) -> None:
        self.functions: list[Callable] = []
        self.plan: list[tuple] = []
        self.leaves: list[Any] = []
        self.buffers: weakref.WeakSet = weakref.WeakSet()
        self.traces: dict[Hashable, tuple[Callable, Any]] = {}
        self.avals: dict[Hashable, tuple[list, Any]] = {}

    def reset(self) -> tuple[list, list, list, list]:
        taken = self.functions, self.plan, self.leaves, list(self.buffers)
        self.functions, self.plan, self.leaves, self.buffers = [], [], [], weakref.WeakSet()
        return taken


recorder = _Recorder()


def is_pending(value: Any) -> bool:
    """Whether `value` is a recorded value not computed yet."""
    return type(value) is Pending and value.value is None


def _signature(value: Any) -> Hashable:
    """A leaf's part of the fingerprint: its aval (shape, dtype; type for Python scalars), never its value."""
    if isinstance(value, (bool, int, float, complex)):
        return type(value)
    return (value.shape, value.dtype)


def _abstract(value: Any) -> Any:
    if type(value) is Pending:
        return value.value if value.value is not None else value.aval
    return value


def output_avals(fn: Callable, inputs: list) -> Any:
    """The shapes and dtypes `fn(*inputs)` would produce (abstract evaluation, nothing runs)."""
    return jax.eval_shape(fn, *[_abstract(x) for x in inputs])


def record(key: Hashable, fn: Callable, inputs: list, out_avals: Any | None = None) -> Any:
    """Record `fn(*inputs)` (a pure JAX function); returns Pending outputs (a pytree like `fn`'s)."""
    refs = []
    for x in inputs:
        if type(x) is Pending:
            if x.value is None:
                refs.append((x.node, x.index))
                continue
            x = x.value
        refs.append(_signature(x))
        recorder.leaves.append(x)
    refs = tuple(refs)
    shapes = recorder.avals.get((key, refs))
    if shapes is None:
        flat, tree = jax.tree_util.tree_flatten(output_avals(fn, inputs) if out_avals is None else out_avals)
        shapes = recorder.avals[key, refs] = (flat, tree)
    index = len(recorder.plan)
    recorder.plan.append((key, refs))
    recorder.functions.append(fn)
    outputs = [Pending(aval, index, i) for i, aval in enumerate(shapes[0])]
    if index + 1 >= MAX_CLUSTER_OPS:
        flush(extra=outputs)
        outputs = [p.value for p in outputs]
    return jax.tree_util.tree_unflatten(shapes[1], outputs)


def apply(key: Hashable, fn: Callable, *inputs: Any) -> Any:
    """`fn(*inputs)` now if every input is computed, else recorded (storage helpers use this)."""
    if any(type(x) is Pending and x.value is None for x in inputs):
        return record(key, fn, list(inputs))
    return fn(*[x.value if type(x) is Pending else x for x in inputs])


def track(buffer: Any) -> None:
    """`buffer` holds a Pending value: the next cluster must produce it."""
    recorder.buffers.add(buffer)


def concrete(value: Any) -> Any:
    """The computed value of `value`, running the pending cluster if needed."""
    if type(value) is not Pending:
        return value
    if value.value is None:
        flush(extra=[value])
    return value.value


def flush(extra: list[Pending] = ()) -> None:
    """Run the recorded cluster for the values live storages (and `extra`) hold."""
    functions, plan, leaves, buffers = recorder.reset()
    if not plan:
        return
    wanted = {(p.node, p.index): p for p in [b._array for b in buffers] + list(extra) if is_pending(p)}
    if wanted:
        out_refs = tuple(sorted(wanted))
        fingerprint = ("fused", tuple(plan), out_refs)
        entry = executables.lookup(fingerprint)
        if entry is None:
            start = time.perf_counter()
            executable = jax.jit(_replay(functions, plan, out_refs))
            results = jax.block_until_ready(executable(*leaves))
            name = f"fused cluster of {len(plan)} ops"
            executables.insert(fingerprint, Entry(name, executable, None, time.perf_counter() - start, "fused"))
        else:
            results = entry.executable(*leaves)
        for ref, value in zip(out_refs, results, strict=True):
            wanted[ref].value = value
    for buffer in buffers:
        if type(buffer._array) is Pending:
            buffer._array = buffer._array.value


def _live(plan: list[tuple], out_refs: tuple) -> list[bool]:
    """Which nodes the outputs depend on; the rest are dead and never traced."""
    live = [False] * len(plan)
    stack = [node for node, _ in out_refs]
    while stack:
        node = stack.pop()
        if not live[node]:
            live[node] = True
            stack.extend(ref[0] for ref in plan[node][1] if type(ref) is tuple and type(ref[0]) is int)
    return live


def _replay(functions: list[Callable], plan: list[tuple], out_refs: tuple) -> Callable:
    """The cluster as one function of all its leaves (unused ones are dropped by `jax.jit`)."""
    live = _live(plan, out_refs)

    def cluster(*leaves: Any) -> tuple:
        results: list[list | None] = []
        remaining = iter(leaves)
        for fn, (_, refs), needed in zip(functions, plan, live, strict=True):
            args = [None if type(r) is tuple and type(r[0]) is int else next(remaining) for r in refs]
            if not needed:
                results.append(None)
                continue
            args = [results[r[0]][r[1]] if a is None and type(r) is tuple and type(r[0]) is int else a
                    for a, r in zip(args, refs, strict=True)]
            results.append(jax.tree_util.tree_leaves(fn(*args)))
        return tuple(results[node][index] for node, index in out_refs)

    return cluster
