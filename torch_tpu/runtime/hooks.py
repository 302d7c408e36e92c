"""The late-bound hooks: every call a lower layer makes into a layer above it, in one typed place.

Imports run one way (runtime -> ops -> eager -> compile -> (distributed, kernels, profiler) -> kit), yet a few
calls must go the other way: the storage helpers record into Fused eager's cluster, Fused eager compiles a
cluster of collectives as distributed's SPMD program, a compiled graph with collectives runs as distributed
plans it, and a kernel over a mesh of ranks runs as distributed's program for that mesh. Each such call is a slot
here, empty until the layer that provides it fills it while torch_tpu registers (`torch_tpu.wiring`, which lists
who fills what); a reader finds a slot empty only when that layer is not in use (no process group: no SPMD).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

# A mesh of global ranks: (ranks laid out row-major in shape, shape, axis names).
Mesh = tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]


class _NeverFused:
    """The eager state before Fused eager fills its slot: never recording."""

    fused = False


@dataclass
class Hooks:
    """The slots, each with the layer that fills it and who calls it."""

    # eager.fused: the eager state (`.fused` while Fused mode records); `record(key, fn, inputs)` records a storage
    # helper's computation into the pending cluster and `flush(extra)` runs the cluster (computing `extra` too).
    # Read by runtime.deferred (view gathers, scatters, casts) and eager.modes (leaving Fused mode flushes).
    eager_state: Any = field(default_factory=_NeverFused)
    record: Callable[[Hashable, Callable, list], Any] | None = None
    flush: Callable[[list], None] | None = None
    # distributed.spmd: `spmd_cluster(ranks).compile(fn, leaves)` is a Fused cluster holding collectives, one SPMD
    # program over those ranks' devices (read by eager.fused).
    spmd_cluster: Callable[[tuple[int, ...]], Any] | None = None
    # distributed.spmd: `spmd_plan(gm)` is None for a compiled graph without collectives, else the program over the
    # group's devices it runs as (`lower`, `call`, `agree`; read by compile.backend).
    spmd_plan: Callable[[Any], Any] | None = None
    # distributed.spmd: `mesh_program(ranks, shape, names)`, the SPMD program over a mesh of ranks
    # (`compile(fn, arrays)`, `output_avals`), which a kernel over several ranks runs as (read by kernels.meshed).
    mesh_program: Callable[[tuple[int, ...], tuple[int, ...], tuple[str, ...]], Any] | None = None
    # kernels.jax_op writes, distributed.spmd reads: the ops of kernels over a mesh of several ranks -> that mesh; a
    # compiled graph holding one runs as one SPMD program over the mesh.
    mesh_ops: dict[Any, Mesh] = field(default_factory=dict)


hooks = Hooks()
