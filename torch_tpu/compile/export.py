"""`export_stablehlo`: the StableHLO text of a model, through the same lowerings as eager and compile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch

from torch_tpu import random as tpu_random
from torch_tpu.compile import graph
from torch_tpu.compile.backend import decompositions
from torch_tpu.runtime import checks, storage


class _Function(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def export_stablehlo(model: torch.nn.Module | Callable, example_inputs: Sequence[Any]) -> str:
    """The StableHLO (MLIR text) of `model(*example_inputs)` as torch_tpu compiles it.

    Parameters and buffers become inputs of the module's `main` function, followed by the example inputs.

    Example:
        >>> text = torch_tpu.export_stablehlo(torch.nn.Linear(4, 2).to("tpu"), (torch.ones(3, 4, device="tpu"),))
        >>> "stablehlo.dot_general" in text
        True
    """
    module = model if isinstance(model, torch.nn.Module) else _Function(model)
    exported = torch.export.export(module, tuple(example_inputs)).run_decompositions(decompositions())
    gm = exported.graph_module
    state = {**exported.state_dict, **exported.constants}
    lifted = [state[spec.target] for spec in exported.graph_signature.input_specs if spec.target is not None]
    values = [
        storage.value(t) if t.device.type == "tpu" else storage.to_device(t)
        for t in [*lifted, *example_inputs]
        if isinstance(t, torch.Tensor)
    ]
    fn, _ = graph.to_jax(gm, program_returns_inputs=True)
    with checks.index_checks_set(False):  # no device-side checks: the program's outputs are the model's alone
        return jax.jit(fn).lower(tpu_random.next_key(), *values).as_text()
