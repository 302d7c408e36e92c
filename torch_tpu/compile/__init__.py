"""Compilation: the `torch.compile` backend "tpu" (`compile.backend`, loaded by Dynamo through the
`torch_dynamo_backends` entry point), its warm-start layers (`compile.warm`) and StableHLO export
(`compile.export`). Nothing here is imported until used (Dynamo is slow to import), except `compile.skips`,
which torch_tpu's import runs without importing Dynamo, and the hooks below, which layers above install at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Installed by torch_tpu.distributed (a layer above): `spmd_plan(gm)` is None for a graph without collectives, else
# the program over the group's devices it runs as (`distributed.spmd.GraphProgram`: `lower`, `call`, `agree`).
# Kept here rather than in `compile.backend` so that installing it does not import Dynamo.
spmd_plan: Callable[[Any], Any] | None = None
# Installed with it: `spmd_program(ranks, shape, names)`, the SPMD program over the devices of global `ranks` laid
# out in `shape` with axes `names` (`distributed.spmd.Program`: `compile(fn, arrays)`, `output_avals`), which a
# kernel over a mesh of several ranks runs as (`kernels.meshed`).
spmd_program: Callable[[tuple[int, ...], tuple[int, ...], tuple[str, ...]], Any] | None = None
# The ops of kernels over a mesh of several ranks -> that mesh (ranks, shape, axis names): a compiled graph holding
# one runs as one SPMD program over the mesh (`distributed.spmd.plan`). Filled by `kernels.jax_op`.
mesh_ops: dict[Any, tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]] = {}
