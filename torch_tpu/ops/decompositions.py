"""The PyTorch decompositions torch_tpu accepts, in eager and in compiled graphs: one table, two uses.

We take `torch._decomp`'s core-ATen table and nothing else: its entries are written in core ATen ops (not
prims), so every op a decomposition produces has a lowering here, and it is the set PyTorch maintains for
backends. Eager (`eager.fallback`) uses an entry only for an op that reached no kernel (it has no lowering).
Compiled graphs (`compile.backend`, `compile.export`) decompose before lowering, so their table leaves out every
op we lower whole: our lowering is one JAX function, as precise as CPU PyTorch (upcasts of half types included),
where the decomposition would be several ops and intermediate roundings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch._ops import OpOverload

from torch_tpu.ops.registry import GRAPH_LOWERINGS, LOWERINGS


@functools.cache
def core_aten() -> dict[OpOverload, Callable]:
    """PyTorch's core-ATen decompositions, all of them (eager's fallback before giving up on an op)."""
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


def lowered_ops() -> frozenset[OpOverload]:
    """The ops the compiler lowers whole (the registry may grow at run time: a user's lowering)."""
    return frozenset(LOWERINGS) | frozenset(GRAPH_LOWERINGS)


def for_graphs() -> dict[OpOverload, Callable]:
    """The core-ATen decompositions of the ops we do not lower whole (what AOTAutograd and export apply), as the
    registry stands now: a lowering registered later takes its op out."""
    return _without(lowered_ops())


@functools.cache
def _without(lowered: frozenset[OpOverload]) -> dict[OpOverload, Callable]:
    return {op: fn for op, fn in core_aten().items() if op not in lowered}
