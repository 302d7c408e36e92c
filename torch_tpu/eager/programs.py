"""A recorded Fused cluster as programs: its nodes replayed as one function of its leaves, traced for their avals
where they are placed, compiled — where a cold step would wait long for its one program, first as programs that
compile faster (independent parts, `eager.parts`; a quick effort, `persistent.compile_tiered`) — and switched to
its final program once that is compiled."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

import jax

from torch_tpu.eager import parts
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.runtime import compat, persistent
from torch_tpu.runtime.deferred import Pending

StandIn = Callable[[Callable, list, Executor], Any]
"""What a cold cluster runs while its program compiles (`op_by_op.OpByOp`): made from the cluster's `replay`, its
leaves' avals and the pool, waited for like a `persistent.Soon`."""


@compat.without_dynamo_frames
def compile_soon(
    replay: Callable, donated: tuple[int, ...], leaves: list, pool: Executor, stand_in: StandIn | None = None
) -> tuple[Any, Any]:
    """What a cut cluster runs first, from disk or compiling on `pool`, and the program to switch to once that is
    compiled (None: the first is final). The whole program where it is on disk; else, where the cluster splits
    (`eager.parts`), its parts while the whole compiles, so that a cold step need not wait for XLA to compile
    one large program on one thread and a steady step still runs one (where XLA's own effort is the whole's
    setting, the parts at the quickest); else, where XLA's own effort is the whole's setting, `stand_in` or else
    a quick program while that compiles (`persistent.compile_tiered`); else the whole."""
    avals = lowering_avals(leaves)
    with unused_donations_allowed():
        traced = trace(replay, donated, avals)

        def make() -> Any:  # what runs while the whole compiles at XLA's own effort
            pieces = parts.split(traced, donated, avals, parts.MAX_PARTS, replay.__name__)
            if pieces:
                return parts.Compiling(pieces, pool, quick=True)
            return None if stand_in is None else stand_in(replay, avals, pool)

        first, better = persistent.compile_tiered(traced.lower(), pool, make)
        if better is None and not first.done():
            pieces = parts.split(traced, donated, avals, parts.MAX_PARTS, replay.__name__)
            if pieces:
                first.store_when_compiled()  # stored even if this process never switches to it
                return parts.Compiling(pieces, pool), first
    return first, better


def compile_cluster(
    replay: Callable, donated: tuple[int, ...], leaves: list, pool: Executor, stand_in: StandIn | None = None
) -> tuple[Any, bool, persistent.Soon | None]:
    """A cluster's executable (from disk or compiled: then True, False) as it is called, waited for here, and the
    program to switch to once compiled, or None (`compile_soon`)."""
    first, better = compile_soon(replay, donated, leaves, pool, stand_in)
    executable, from_disk, _ = first()
    return persistent.fast_call(executable), from_disk, better


def switch(fingerprint: tuple, entry: Entry) -> None:
    """Run a cluster with its final program from now on (its whole one, or at XLA's own effort), compiled while
    its parts or a quick one ran. Should that compile have failed, the program that ran, which computes the same,
    stays."""
    better, entry.better = entry.better, None
    try:
        compiled, _, _ = better()
    except Exception as error:
        warnings.warn(
            f"torch_tpu: {entry.name} keeps the program it ran: its final one failed to compile ({error})", stacklevel=3
        )
        return
    entry.executable = persistent.fast_call(compiled)
    executables.refit(fingerprint, entry)


_finishers: list[Callable[[], None]] = []


def also_finish(finisher: Callable[[], None]) -> None:
    """Have `finish_compiles` call `finisher` too: a later layer's programs compiling in the background
    (compile/ahead.py)."""
    _finishers.append(finisher)


def finish_compiles() -> None:
    """Wait for the clusters' final programs compiling while their parts or quick ones run (`compile_soon`), and
    switch to them: a benchmark's steady state, after its warm-up steps."""
    for fingerprint, entry in list(executables.entries.items()):
        if entry.better is not None:
            switch(fingerprint, entry)
    for finisher in _finishers:
        finisher()


def trace(replay: Callable, donated: tuple[int, ...], avals: list) -> jax.stages.Traced:
    """A cluster's whole program, traced (on this thread: its lowerings read settings) for `avals`
    (`lowering_avals` of its leaves), consuming the leaves at `donated`."""
    return jax.jit(replay, donate_argnums=donated).trace(*avals)


@contextlib.contextmanager
def unused_donations_allowed() -> Iterator[None]:
    """JAX's warning for a donated buffer no output could reuse, silenced: the cluster consumes it all the same."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        yield


def home() -> jax.sharding.Sharding:
    """Where a single-device cluster runs: this process's device."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def lowering_avals(leaves: list) -> list:
    """`leaves` as a program is lowered for them: each run-time input as its aval (a Python number weakly typed, as
    `encoding._device_scalar`'s array of it is) placed where it is (a Pending value or a host one: `home()`).
    Lowered for the values themselves, JAX places a Python number or an uncommitted array (a storage helper's
    zeros) nowhere and a committed one on its device, and the StableHLO, and so the persistent cache's key, would
    depend on which inputs were still queued or already cached when a program was first made: on a v5e a second
    process compiled the large step's optimizer cluster again (12.9 s) where its ops all loaded from disk."""
    place = home()
    avals = []
    for x in leaves:
        if isinstance(x, jax.ShapeDtypeStruct):
            avals.append(x)
            continue
        aval = x.aval if type(x) is Pending else jax.typeof(x)
        sharding = x.sharding if isinstance(x, jax.Array) else place
        avals.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding))
    return avals


def _live(nodes: list[tuple[Callable, list]], out_refs: tuple) -> list[bool]:
    """Which nodes the outputs depend on; the rest are dead and never traced."""
    live = [False] * len(nodes)
    stack = [node for node, _ in out_refs]
    while stack:
        node = stack.pop()
        if not live[node]:
            live[node] = True
            stack.extend(ref[0] for ref in nodes[node][1] if type(ref) is tuple)
    return live


def node_inputs(refs: list, remaining: Iterator, leaves: Sequence, results: list, needed: bool) -> list | None:
    """A node's inputs (None where it is not `needed`; its leaves are taken from `remaining` all the same): for
    each ref, the next leaf (None), the leaf at a position again (an int) or an earlier node's value (node, index)
    in `results`."""
    taken = [next(remaining) if r is None else None for r in refs]
    if not needed:
        return None
    return [
        a if r is None else leaves[r] if type(r) is int else results[r[0]][r[1]]
        for a, r in zip(taken, refs, strict=True)
    ]


def replay(nodes: list[tuple[Callable, list]], out_refs: tuple) -> Callable:
    """The cluster as one function of all its leaves (unused ones are dropped by `jax.jit`); `nodes` holds each
    node's function and inputs: (node, index) of a recorded value, None for the next leaf, an int for the leaf at
    that position again."""
    live = _live(nodes, out_refs)

    def cluster(*leaves: Any) -> tuple:
        results: list[list | None] = []
        remaining = iter(leaves)
        for (fn, refs), needed in zip(nodes, live, strict=True):
            args = node_inputs(refs, remaining, leaves, results, needed)
            if args is None:
                results.append(None)
                continue
            with jax.named_scope(getattr(fn, "__name__", "op")):  # per op in the HLO's metadata (traced once)
                results.append(jax.tree_util.tree_leaves(fn(*args)))
        return tuple(results[node][index] for node, index in out_refs)

    cluster.__name__ = cluster.__qualname__ = f"fused_cluster_{len(nodes)}_ops"  # its module: jit_fused_cluster_N_ops
    cluster.nodes, cluster.out_refs, cluster.live = nodes, out_refs, live  # for `op_by_op.OpByOp`
    return cluster
