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

from torch_tpu.ops.registry import graph_lowering


@functools.cache
def core_aten() -> dict[OpOverload, Callable]:
    """PyTorch's core-ATen decompositions, all of them (eager's fallback before giving up on an op)."""
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


@functools.cache
def for_graphs() -> dict[OpOverload, Callable]:
    """The core-ATen decompositions of the ops we do not lower whole (what AOTAutograd and export apply)."""
    return {op: fn for op, fn in core_aten().items() if graph_lowering(op) is None}
