"""Fused eager (`DEFER_AND_FUSE`): ops are recorded into a DAG of pending values instead of running.

A storage's buffer may hold a `Pending` value (shape and dtype known, data not computed yet). When data is
needed on the host (`.item()`, `.cpu()`, `print`, `torch.save`, Python control flow on values), at
`torch.tpu.synchronize()`, on leaving the mode, before a compiled graph or a data-dependent op runs, or when a
cluster reaches `TORCH_TPU_FUSED_MAX_OPS` ops, the recorded ops that live storages still need are compiled as
one cluster and run. Clusters are cached by a fingerprint of their op sequence, shapes, dtypes and static
arguments; scalars and PRNG keys are run-time inputs, so a training loop's steady state replays one cached
executable per step. Dead intermediates (values no live storage holds) are neither computed nor kept.
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

    __slots__ = ("aval", "node", "index", "value", "__weakref__")

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


class _Node:
    __slots__ = ("key", "fn", "inputs")

    def __init__(self, key: Hashable, fn: Callable, inputs: list) -> None:
        self.key = key
        self.fn = fn
        self.inputs = inputs


class _Recorder:
    """The cluster being recorded, and the buffers whose values it must produce."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.buffers: weakref.WeakSet = weakref.WeakSet()
        self.traces: dict[Hashable, tuple[Callable, Any]] = {}


recorder = _Recorder()


def is_pending(value: Any) -> bool:
    """Whether `value` is a recorded value not computed yet."""
    return type(value) is Pending and value.value is None


def _aval(value: Any) -> Any:
    if type(value) is Pending:
        return value.value if value.value is not None else value.aval
    return value


def output_avals(fn: Callable, inputs: list) -> Any:
    """The shapes and dtypes `fn(*inputs)` would produce (abstract evaluation, nothing runs)."""
    return jax.eval_shape(fn, *[_aval(x) for x in inputs])


def record(key: Hashable, fn: Callable, inputs: list, out_avals: Any | None = None) -> Any:
    """Record `fn(*inputs)` (a pure JAX function); returns Pending outputs (a pytree like `fn`'s)."""
    if out_avals is None:
        out_avals = output_avals(fn, inputs)
    flat, tree = jax.tree_util.tree_flatten(out_avals)
    index = len(recorder.nodes)
    recorder.nodes.append(_Node(key, fn, [x.value if type(x) is Pending and x.value is not None else x
                                          for x in inputs]))
    outputs = [Pending(aval, index, i) for i, aval in enumerate(flat)]
    if len(recorder.nodes) >= MAX_CLUSTER_OPS:
        flush(extra=outputs)
        outputs = [p.value for p in outputs]
    return jax.tree_util.tree_unflatten(tree, outputs)


def apply(key: Hashable, fn: Callable, *inputs: Any) -> Any:
    """`fn(*inputs)` now if every input is computed, else recorded (storage helpers use this)."""
    if any(is_pending(x) for x in inputs):
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
    """Compile (or reuse) and run the cluster that live storages (and `extra`) still need."""
    nodes, buffers = recorder.nodes, list(recorder.buffers)
    recorder.nodes, recorder.buffers = [], weakref.WeakSet()
    if not nodes:
        return
    wanted: dict[int, Pending] = {}
    for pending in [b._array for b in buffers] + list(extra):
        if is_pending(pending):
            wanted[id(pending)] = pending
    if wanted:
        _run(nodes, list(wanted.values()))
    for buffer in buffers:
        if type(buffer._array) is Pending:
            buffer._array = buffer._array.value


def _run(nodes: list[_Node], wanted: list[Pending]) -> None:
    needed = _needed(nodes, wanted)
    position = {index: i for i, index in enumerate(needed)}
    plan, leaves = [], []
    for index in needed:
        refs = []
        for x in nodes[index].inputs:
            if is_pending(x):
                refs.append((position[x.node], x.index))
            else:
                refs.append(("leaf", _signature(x)))
                leaves.append(x)
        plan.append((nodes[index].key, tuple(refs)))
    wanted.sort(key=lambda p: (position[p.node], p.index))
    out_refs = tuple((position[p.node], p.index) for p in wanted)
    fingerprint = ("fused", tuple(plan), out_refs)
    entry = executables.lookup(fingerprint)
    if entry is None:
        start = time.perf_counter()
        executable = jax.jit(_replay([nodes[i].fn for i in needed], plan, out_refs))
        results = jax.block_until_ready(executable(*leaves))
        name = f"fused cluster of {len(needed)} ops"
        executables.insert(fingerprint, Entry(name, executable, None, time.perf_counter() - start, source="fused"))
    else:
        results = entry.executable(*leaves)
    for pending, value in zip(wanted, results, strict=True):
        pending.value = value


def _needed(nodes: list[_Node], wanted: list[Pending]) -> list[int]:
    """The nodes `wanted` depends on, in recording order; everything else is dead and skipped."""
    needed: set[int] = set()
    stack = [p.node for p in wanted]
    while stack:
        index = stack.pop()
        if index not in needed:
            needed.add(index)
            stack.extend(x.node for x in nodes[index].inputs if is_pending(x))
    return sorted(needed)


def _signature(value: Any) -> Hashable:
    """A leaf's part of the fingerprint: its aval (shape, dtype, weak type), never its value."""
    if isinstance(value, (bool, int, float, complex)):
        return type(value)
    return (tuple(value.shape), str(value.dtype))


def _replay(functions: list[Callable], plan: list, out_refs: tuple) -> Callable:
    """The cluster as one function of its leaves (traced once per fingerprint by `jax.jit`)."""

    def cluster(*leaves: Any) -> tuple:
        results: list[list] = []
        remaining = iter(leaves)
        for fn, (_, refs) in zip(functions, plan, strict=True):
            args = [next(remaining) if r[0] == "leaf" else results[r[0]][r[1]] for r in refs]
            results.append(jax.tree_util.tree_leaves(fn(*args)))
        return tuple(results[i][j] for i, j in out_refs)

    return cluster
