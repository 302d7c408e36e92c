"""An eager optimizer step as one program, in Strict eager as in Fused eager.

`optimizer.step()` of a torch.optim optimizer is a few dozen eager ops over every parameter (foreach or not): in
Strict eager a dozen or more executables per step, each reading and writing the parameters and their state again.
torch.optim's global step hooks bracket every step. In Fused eager they cut the cluster before and after it, so
that clusters align with training steps. In Strict eager they record the step into one Fused cluster
(`eager.fused`), which runs as one cached executable when the step ends: one program and one pass over the
optimizer state per step, while the user's mode stays Strict. Debug eager runs the step op by op, as every op; so
does a step given a closure (LBFGS: forward and backward inside the step, with host reads between them), and
every step with TORCH_TPU_FUSE_OPTIMIZER_STEP=0.
"""

from __future__ import annotations

import os

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from torch_tpu.eager import fused, modes

FUSE_OPTIMIZER_STEP = os.environ.get("TORCH_TPU_FUSE_OPTIMIZER_STEP", "1") != "0"


class _Scope:
    """The optimizer whose step Strict eager is recording (None: none)."""

    optimizer: torch.optim.Optimizer | None = None


scope = _Scope()
_installed: list[bool] = []


def _step_begins(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    """Pre-hook: cut Fused eager's cluster, or begin recording Strict eager's step."""
    if torch.compiler.is_compiling():  # a compiled optimizer step is a graph of its own
        return
    _end_scope()  # a step that raised never reached its post-hook
    state = modes.state
    if state.fused:
        fused.flush(urgent=False)
    elif FUSE_OPTIMIZER_STEP and not state.blocking and _without_closure(args, kwargs) and _on_tpu(optimizer):
        scope.optimizer = optimizer
        state.record_step(True)


def _step_ends(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    """Post-hook: run the step's cluster (Strict eager's, or Fused eager's so far), asynchronously."""
    if torch.compiler.is_compiling():
        return
    if scope.optimizer is optimizer:
        _end_scope()
    elif modes.state.fused:
        fused.flush(urgent=False)


def _end_scope() -> None:
    if scope.optimizer is None:
        return
    scope.optimizer = None
    try:
        fused.flush(urgent=False)  # a step without a program yet compiles while the next ops queue (`eager.warmup`)
    finally:  # the user's mode again, even where the step's cluster failed
        modes.state.record_step(False)


def _without_closure(args: tuple, kwargs: dict) -> bool:
    """Whether `step` was called without a closure (`args` holds the optimizer, then step's own arguments)."""
    return len(args) <= 1 and kwargs.get("closure") is None


def _on_tpu(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer updates tpu parameters (its groups' first ones tell)."""
    return any(group["params"] and group["params"][0].device.type == "tpu" for group in optimizer.param_groups)


def install() -> None:
    """Register the step hooks with torch.optim (once)."""
    if _installed:
        return
    register_optimizer_step_pre_hook(_step_begins)
    register_optimizer_step_post_hook(_step_ends)
    _installed.append(True)
