"""A cluster of independent computations — an optimizer step, one chain of updates per parameter — compiled as
several programs side by side, which a cold step runs while the cluster's one program compiles.

XLA compiles a program on one thread. The large GPT step's AdamW (148 parameters, 8,700 equations) took 8.5 s to
compile whole on a v5e host at the quickest effort, the last and longest compile of a cold Strict step (12.3 s
there, beside the step's other compiles); as 12 programs compiled at once on 12 threads it took 1.1 s, and the 12
ran as fast as the one (6.1 against 6.3 ms; an ad hoc probe, docs/performance.md). So a cluster whose equations
fall into independent groups — joined only through inputs they read, none of which the cluster consumes — is
split into up to `MAX_PARTS` programs of about equal size (each at least `PART_EQUATIONS`), run one after the
other as its executable until its whole program, compiling beside them, is ready (`programs.compile_soon`): a
steady step is one program, a cold one waits for the parts only. A cluster that is mostly one group (a forward
and backward) is not split. The split is a function of the traced program alone, so every process splits a
cluster alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, NamedTuple

import jax
import jax.extend.core as jex

from torch_tpu.runtime import persistent

MAX_PARTS = int(os.environ.get("TORCH_TPU_CLUSTER_PARTS", "12"))
"""The most programs a cluster is split into (1: never split). Fixed rather than the host's core count, so that
hosts of any size key and share the same programs."""
PART_EQUATIONS = 512
"""The fewest equations a part is given (a cluster of fewer than twice as many stays one program): ~0.5 s of XLA's
time on a v5e host (8.5 s for the 8,700 of the large step's AdamW), against one more launch a step for each part,
which a host-bound step feels (the small GPT step's AdamW, ~1,900 equations, becomes 3 programs, not 12)."""


class Part(NamedTuple):
    """One program of a split cluster: its lowering, the cluster's leaves it reads and the results it makes
    (positions in the cluster's arguments and results)."""

    lowered: jax.stages.Lowered
    leaves: tuple[int, ...]
    outputs: tuple[int, ...]


def split(
    traced: jax.stages.Traced, donated: tuple[int, ...], avals: Sequence[Any], max_parts: int, name: str
) -> list[Part] | None:
    """`traced` (a cluster traced for `avals`, consuming the leaves at `donated`) as up to `max_parts` independent
    programs of at least `PART_EQUATIONS` equations, named after `name`; or None where it does not split: too
    small, one group mostly, an effect, or a result that is an input or a constant (no part makes it)."""
    closed = traced.jaxpr
    jaxpr = closed.jaxpr
    count = min(max_parts, len(jaxpr.eqns) // PART_EQUATIONS)
    if count < 2 or jaxpr.effects or len(jaxpr.invars) != len(avals):
        return None
    grouped = _groups(jaxpr, donated)
    if grouped is None:
        return None
    groups, output_roots = grouped
    if max(len(group) for group in groups.values()) * 2 > len(jaxpr.eqns):
        return None
    bins = _balance(groups, count)
    bin_of = {root: b for b, roots in enumerate(bins) for root in roots}
    outputs: list[list[int]] = [[] for _ in bins]
    for position, root in enumerate(output_roots):
        outputs[bin_of[root]].append(position)
    return [
        _part(closed, sorted(i for root in roots for i in groups[root]), outputs[b], donated, avals, f"{name}_{b}")
        for b, roots in enumerate(bins)
    ]


class _Joined:
    """Equations joined into groups (union-find over their indices)."""

    def __init__(self, count: int) -> None:
        self._parent = list(range(count))

    def root(self, i: int) -> int:
        parent = self._parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(self, a: int, b: int) -> None:
        self._parent[self.root(a)] = self.root(b)


def _groups(jaxpr: jex.Jaxpr, donated: tuple[int, ...]) -> tuple[dict[int, list[int]], list[int]] | None:
    """The jaxpr's equations by group (its root -> their indices), joined where one reads what another made or
    both read an input the cluster consumes (its buffer becomes a result: one program must hold every reader),
    and each result's group; None where a result is not made by an equation."""
    joined = _Joined(len(jaxpr.eqns))
    consumed = {jaxpr.invars[i] for i in donated}
    made_by: dict[Any, int] = {}  # a variable -> the equation that made it (a consumed input: its first reader)
    for i, eqn in enumerate(jaxpr.eqns):
        for var in eqn.invars:
            if isinstance(var, jex.Literal):
                continue
            j = made_by.get(var)
            if j is not None:
                joined.join(i, j)
            elif var in consumed:
                made_by[var] = i
        for var in eqn.outvars:
            made_by[var] = i
    if any(isinstance(var, jex.Literal) or var not in made_by or var in consumed for var in jaxpr.outvars):
        return None
    groups: dict[int, list[int]] = {}
    for i in range(len(jaxpr.eqns)):
        groups.setdefault(joined.root(i), []).append(i)
    return groups, [joined.root(made_by[var]) for var in jaxpr.outvars]


def _balance(groups: dict[int, list[int]], max_parts: int) -> list[list[int]]:
    """The groups' roots in at most `max_parts` bins of about equal equations: the largest group first, each to the
    lightest bin (ties by the groups' first equations and the bins' order, so that every process bins alike)."""
    bins: list[list[int]] = [[] for _ in range(min(max_parts, len(groups)))]
    load = [0] * len(bins)
    for root, group in sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0])):
        lightest = load.index(min(load))
        bins[lightest].append(root)
        load[lightest] += len(group)
    return bins


def _part(
    closed: jex.ClosedJaxpr, eqns: list[int], outputs: list[int], donated: tuple[int, ...], avals: Sequence, name: str
) -> Part:
    """The program of `eqns` (in the cluster's order) making the results at `outputs`, lowered for the leaves they
    read, consuming those of them the cluster consumes."""
    jaxpr = closed.jaxpr
    chosen = [jaxpr.eqns[i] for i in eqns]
    read = {var for eqn in chosen for var in eqn.invars if not isinstance(var, jex.Literal)}
    leaves = tuple(i for i, var in enumerate(jaxpr.invars) if var in read)
    consts = [(var, value) for var, value in zip(jaxpr.constvars, closed.consts, strict=True) if var in read]
    sub = jex.Jaxpr(
        [var for var, _ in consts],
        [jaxpr.invars[i] for i in leaves],
        [jaxpr.outvars[o] for o in outputs],
        chosen,
        debug_info=jex.DebugInfo("jit", name, None, None),
    )
    run = jex.jaxpr_as_fun(jex.ClosedJaxpr(sub, [value for _, value in consts]))

    def part(*args: Any) -> list:
        return run(*args)

    part.__name__ = part.__qualname__ = name  # its module: jit_<cluster>_<part>
    consumed_leaves = set(donated)
    consumed = tuple(k for k, i in enumerate(leaves) if i in consumed_leaves)
    lowered = jax.jit(part, donate_argnums=consumed).lower(*[avals[i] for i in leaves])
    return Part(lowered, leaves, tuple(outputs))


class Parts:
    """A split cluster's executable: called with all the cluster's leaves, it runs each part on its own, in order,
    and returns the cluster's results in the order the one program would."""

    def __init__(self, calls: list[tuple[Callable, tuple[int, ...], tuple[int, ...]]], results: int) -> None:
        self._calls, self._results = calls, results
        persistent.add_footprint(self, sum(persistent.footprint(call) for call, _, _ in calls))

    def __call__(self, *leaves: Any) -> tuple:
        results: list[Any] = [None] * self._results
        for call, reads, makes in self._calls:
            for position, value in zip(makes, call(*[leaves[i] for i in reads]), strict=True):
                results[position] = value
        return tuple(results)

    def __len__(self) -> int:
        return len(self._calls)


class Compiling:
    """A split cluster's parts compiling side by side on a pool, waited for like one program's
    `persistent.Soon`: calling it gives (`Parts`, whether every part came from disk, XLA's seconds in all).
    `quick`: they stand in while the whole compiles at XLA's own effort (`programs.compile_soon`), compiled at the
    quickest and not stored (a process that has the whole on disk never runs them)."""

    def __init__(self, parts: list[Part], pool: Executor, quick: bool = False) -> None:
        self._parts = parts
        if quick:
            self._soons = [persistent.compile_stand_in(part.lowered, pool) for part in parts]
        else:
            self._soons = [persistent.compile_soon(part.lowered, pool, cluster=True, remember=False) for part in parts]
        self._made: tuple[Parts, bool, float] | None = None

    def done(self) -> bool:
        return all(soon.done() for soon in self._soons)

    def __call__(self) -> tuple[Parts, bool, float]:
        if self._made is None:
            made = [soon() for soon in self._soons]
            calls = [(persistent.fast_call(m[0]), p.leaves, p.outputs) for m, p in zip(made, self._parts, strict=True)]
            results = sum(len(part.outputs) for part in self._parts)
            self._made = Parts(calls, results), all(m[1] for m in made), sum(m[2] for m in made)
        return self._made
