"""A recorded Fused cluster as programs: its nodes replayed as one function of its leaves, traced for their avals
where they are placed, split into independent parts where it can be (`eager.parts`), compiled (a quick program
first where XLA's own effort would keep a cold step waiting, `persistent.compile_tiered`), and switched to the
full-effort program once that is compiled."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import jax

from torch_tpu.eager import parts
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.runtime import compat, persistent
from torch_tpu.runtime.deferred import Pending


@compat.without_dynamo_frames
def compile_cluster(
    replay: Callable, donated: tuple[int, ...], leaves: list, pool: Executor
) -> tuple[Any, bool, persistent.Soon | None]:
    """A cluster's executable (from disk or compiled: then True, False) as it is called, and the program to switch
    to once compiled (`persistent.compile_tiered`), or None."""
    program = lower(replay, donated, leaves, parts.MAX_PARTS)
    better = None
    if isinstance(program, list):  # its parts, compiled side by side
        executable, from_disk, _ = parts.compile_soon(program, pool)()
        return executable, from_disk, None
    if persistent.tiering():
        first, better = persistent.compile_tiered(program, pool)
        executable, from_disk, _ = first()
    else:
        executable, from_disk = persistent.compile_lowered(program, cluster=True)
    return persistent.fast_call(executable), from_disk, better


def switch(fingerprint: tuple, entry: Entry) -> None:
    """Run a cluster with its program at XLA's own effort from now on, compiled while a quick one ran. Should that
    compile have failed, the quick program, which computes the same, stays."""
    better, entry.better = entry.better, None
    try:
        compiled, _, _ = better()
    except Exception as error:
        warnings.warn(
            f"torch_tpu: {entry.name} keeps its quick program: XLA's own effort failed ({error})", stacklevel=3
        )
        return
    entry.executable = persistent.fast_call(compiled)
    executables.refit(fingerprint, entry)


def finish_compiles() -> None:
    """Wait for the clusters' programs compiling at XLA's own effort while quick ones run (`persistent.
    compile_tiered`), and switch to them: a benchmark's steady state, after its warm-up steps."""
    for fingerprint, entry in list(executables.entries.items()):
        if entry.better is not None:
            switch(fingerprint, entry)


@compat.without_dynamo_frames
def lower(
    replay: Callable, donated: tuple[int, ...], leaves: list, max_parts: int = 1
) -> jax.stages.Lowered | list[parts.Part]:
    """A cluster's program, traced (on this thread: its lowerings read settings) for `leaves` (arrays, Pending
    values or avals); or its independent parts, up to `max_parts` (`eager.parts`), where it splits."""
    avals = lowering_avals(leaves)
    with warnings.catch_warnings():  # a donated buffer no output could reuse: consumed all the same
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        traced = jax.jit(replay, donate_argnums=donated).trace(*avals)
        return parts.split(traced, donated, avals, max_parts, replay.__name__) or traced.lower()


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


def replay(nodes: list[tuple[Callable, list]], out_refs: tuple) -> Callable:
    """The cluster as one function of all its leaves (unused ones are dropped by `jax.jit`); `nodes` holds each
    node's function and inputs: (node, index) of a recorded value, None for the next leaf, an int for the leaf at
    that position again."""
    live = _live(nodes, out_refs)

    def cluster(*leaves: Any) -> tuple:
        results: list[list | None] = []
        remaining = iter(leaves)
        for (fn, refs), needed in zip(nodes, live, strict=True):
            args = [next(remaining) if r is None else None for r in refs]
            if not needed:
                results.append(None)
                continue
            args = [
                a if r is None else leaves[r] if type(r) is int else results[r[0]][r[1]]
                for a, r in zip(args, refs, strict=True)
            ]
            with jax.named_scope(getattr(fn, "__name__", "op")):  # per op in the HLO's metadata (traced once)
                results.append(jax.tree_util.tree_leaves(fn(*args)))
        return tuple(results[node][index] for node, index in out_refs)

    cluster.__name__ = cluster.__qualname__ = f"fused_cluster_{len(nodes)}_ops"  # its module: jit_fused_cluster_N_ops
    return cluster
