"""What happens to an op with no lowering: a PyTorch decomposition if one exists, else a clear
NotImplementedError, or, behind the visible switch TORCH_TPU_CPU_FALLBACK=1 / `set_cpu_fallback(True)`,
a counted run on the CPU with a one-time warning."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_map

from torch_tpu import metrics
from torch_tpu.ops import decompositions

_enabled = os.environ.get("TORCH_TPU_CPU_FALLBACK") == "1"
_warned: set[str] = set()


def set_cpu_fallback(enabled: bool) -> None:
    """Allow (or forbid) running ops that have no tpu lowering on the CPU."""
    global _enabled
    _enabled = bool(enabled)


def cpu_fallback_enabled() -> bool:
    return _enabled


_active: set[OpOverload] = set()


def unimplemented(op: OpOverload, *args: Any, **kwargs: Any) -> Any:
    decomposition = decompositions.core_aten().get(op)
    if decomposition is not None and op not in _active:
        metrics.decompositions[str(op)] += 1
        _active.add(op)
        try:
            return decomposition(*args, **kwargs)
        finally:
            _active.discard(op)
    if not _enabled:
        raise NotImplementedError(
            f"'{op}' is not implemented for TPU (torch_tpu has no lowering for this ATen overload). "
            "Set TORCH_TPU_CPU_FALLBACK=1 or call torch_tpu.set_cpu_fallback(True) to run it on the CPU."
        )
    return run_on_cpu(op, args, kwargs)


def run_on_cpu(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run `op` on CPU copies of its `tpu` tensors; write mutated arguments back; move results to `tpu`."""
    name = str(op)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"'{name}' is not implemented for TPU. Falling back to CPU", stacklevel=3)
    metrics.cpu_fallbacks[name] += 1
    originals: dict[int, torch.Tensor] = {}

    def to_cpu(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            copy = value.cpu()
            originals[id(copy)] = value
            return copy
        if isinstance(value, torch.device) and value.type == "tpu":
            return torch.device("cpu")
        return value

    cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
    result = op(*cpu_args, **cpu_kwargs)
    for argument, value in zip(op._schema.arguments, _by_schema(op, cpu_args, cpu_kwargs), strict=False):
        if argument.alias_info is not None and argument.alias_info.is_write and id(value) in originals:
            original = originals[id(value)]
            if original.shape != value.shape:
                original.resize_(value.shape)
            original.copy_(value)

    def to_tpu(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return originals[id(value)] if id(value) in originals else value.to("tpu")
        return value

    return tree_map(to_tpu, result)


def _by_schema(op: OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    values = list(args) + [None] * (len(positional) - len(args))
    return values + [kwargs.get(a.name) for a in op._schema.arguments if a.kwarg_only]
