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
