"""A cold cluster run op by op while its one program compiles: each distinct op its own small program.

On a v5e a Fused step's forward-and-backward cluster takes 13-32 s to compile at XLA's own effort and 5.4-6.7 s at
the quickest, one program on one thread: a cold step waited that long before it computed anything, where Strict
eager's first call, whose per-op programs compile side by side and repeat across layers, took 3.6-7.8 s. So a
cluster whose final program compiles at XLA's own effort runs, until that one is ready, as the sequence of its
ops (`persistent.compile_tiered`'s stand-in): one program per distinct op and input avals — a 12-layer
transformer's forward repeats a few dozen — compiled at the quickest effort on the pool, all at once from the cut,
and called in the cluster's order, each value let go after its last use. Nothing is donated, so the cluster's
inputs stay valid whatever the final program consumes. `TORCH_TPU_COLD_CLUSTERS=quick` runs the whole cluster
compiled at the quickest effort instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import jax

from torch_tpu.eager import programs
from torch_tpu.runtime import memory, persistent, trace_context

COLD_CLUSTERS = os.environ.get("TORCH_TPU_COLD_CLUSTERS", "ops")
"""What a cold cluster runs while its program compiles at XLA's own effort: "ops" (its ops, `OpByOp`) or "quick"
(the whole cluster compiled at the quickest effort)."""
if COLD_CLUSTERS not in ("ops", "quick"):
    raise ValueError(f"torch_tpu: TORCH_TPU_COLD_CLUSTERS={COLD_CLUSTERS!r} is neither 'ops' nor 'quick'")

_programs: dict[tuple, tuple[persistent.Soon, list[jax.ShapeDtypeStruct]]] = {}
"""Each op's program, by its function, the trace context and input avals, and its output avals: clusters share
them; at most `_MAX_PROGRAMS` (a steady process runs its clusters' own programs)."""
_MAX_PROGRAMS = 4096
memory.on_empty_cache(_programs.clear)


def stand_in() -> programs.StandIn | None:
    """What `programs.compile_soon` runs in a cold cluster's place (`COLD_CLUSTERS`): `OpByOp`, or None for a
    quick program."""
    return OpByOp if COLD_CLUSTERS == "ops" else None


class OpByOp:
    """A cluster's ops as programs of their own compiling on a pool, waited for like one program's
    `persistent.Soon`: calling it gives (`run`, False, 0.0); `run` computes the cluster from its leaves."""

    def __init__(self, replay: Any, avals: list, pool: Executor) -> None:
        """`replay`: `programs.replay`'s cluster function (its `nodes`, `out_refs` and `live`); `avals`: its leaves'
        (`programs.lowering_avals`)."""
        nodes, out_refs, live = replay.nodes, replay.out_refs, replay.live
        self._nodes = nodes
        self._out_refs = out_refs
        self._soons: list[persistent.Soon | None] = [None] * len(nodes)
        self._calls: list[Callable | None] = [None] * len(nodes)
        self._last_uses = _last_uses(nodes, live, out_refs)
        place = programs.home()  # where the values stay
        values: list[list | None] = []
        remaining = iter(avals)
        for position, ((fn, refs), needed) in enumerate(zip(nodes, live, strict=True)):
            args = programs.node_inputs(refs, remaining, avals, values, needed)
            if args is None:
                values.append(None)
                continue
            self._soons[position], out_avals = _program(fn, args, pool)
            values.append(
                [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type, sharding=place) for a in out_avals]
            )

    def done(self) -> bool:
        return all(soon is None or soon.done() for soon in self._soons)

    def __call__(self) -> tuple[Callable[..., tuple], bool, float]:
        return self.run, False, 0.0

    def run(self, *leaves: Any) -> tuple:
        """The cluster's results from `leaves`, each op by its own program (waited for where still compiling)."""
        results: list[list | None] = []
        remaining = iter(leaves)
        for position, (_, refs) in enumerate(self._nodes):
            call = self._calls[position] or self._ready(position)
            args = programs.node_inputs(refs, remaining, leaves, results, call is not None)
            if args is None:  # dead: no output depends on it
                results.append(None)
                continue
            results.append(jax.tree_util.tree_leaves(call(*args)))
            for done in self._last_uses[position]:
                results[done] = None  # its device memory goes back now, as within one program
        return tuple(results[node][index] for node, index in self._out_refs)

    def _ready(self, position: int) -> Callable | None:
        soon = self._soons[position]
        if soon is None:
            return None
        compiled, _, _ = soon()
        call = self._calls[position] = persistent.fast_call(compiled)
        return call


def _program(fn: Callable, avals: list, pool: Executor) -> tuple[persistent.Soon, list]:
    """The program of one op for its input avals (traced and lowered here, where its settings are read; compiled
    on `pool`), shared by every node and cluster that calls it so, and its output avals."""
    key = (fn, trace_context.cache_token(), *((a.shape, a.dtype, a.weak_type) for a in avals))
    found = _programs.get(key)
    if found is None:
        if len(_programs) >= _MAX_PROGRAMS:
            _programs.clear()
        lowered = jax.jit(fn).trace(*avals).lower()
        found = _programs[key] = persistent.compile_stand_in(lowered, pool), jax.tree_util.tree_leaves(lowered.out_info)
    return found


def _last_uses(nodes: Sequence[tuple[Callable, list]], live: list[bool], out_refs: tuple) -> list[list[int]]:
    """For each node, the nodes whose values no later node reads once it has run (results excepted)."""
    last: dict[int, int] = {}
    for position, (_, refs) in enumerate(nodes):
        if live[position]:
            for ref in refs:
                if type(ref) is tuple:
                    last[ref[0]] = position
    kept = {node for node, _ in out_refs}
    uses: list[list[int]] = [[] for _ in nodes]
    for node, position in last.items():
        if node not in kept:
            uses[position].append(node)
    return uses
