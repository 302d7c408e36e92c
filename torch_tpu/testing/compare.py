"""Run the same computation on CPU and on `tpu` and compare, with tolerances a numerics engineer would defend.

fp32 tolerances allow XLA's different (but correctly rounded per op) reduction orders and fused transcendental
approximations; bf16/fp16 allow one or two units in the last place of the narrow format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6 * 10, 1e-5),
    torch.complex64: (1.3e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results of `dtype`; exact for integers and bool."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def to_tpu(value: Any) -> Any:
    """Copy every tensor in a pytree to `tpu`, keeping requires_grad on leaves."""

    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            moved = t.detach().to("tpu")
            return moved.requires_grad_(t.requires_grad)
        return t

    return tree_map(move, value)


def to_cpu(value: Any) -> Any:
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, value)


def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None) -> None:
    """Compare a `tpu` result (any pytree) with the CPU one: same dtypes, shapes, values within tolerance."""
    actual = to_cpu(actual)

    def check(a: Any, e: Any) -> None:
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"expected a tensor, got {type(a)}"
            assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
            default_rtol, default_atol = tolerance(e.dtype)
            torch.testing.assert_close(
                a,
                e,
                rtol=default_rtol if rtol is None else rtol,
                atol=default_atol if atol is None else atol,
                equal_nan=True,
            )
        else:
            assert a == e or (a != a and e != e), f"{a!r} != {e!r}"

    flat_actual, flat_expected = _flatten(actual), _flatten(expected)
    assert len(flat_actual) == len(flat_expected), f"{len(flat_actual)} outputs != {len(flat_expected)}"
    for a, e in zip(flat_actual, flat_expected, strict=True):
        check(a, e)


def _flatten(value: Any) -> list[Any]:
    return torch.utils._pytree.tree_leaves(value)


def check_op(fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None,
             grad: bool = False, **kwargs: Any) -> Any:
    """Run `fn` on CPU args and on `tpu` copies; assert the outputs (and, with `grad`, input grads) match."""
    expected = fn(*args, **kwargs)
    tpu_args, tpu_kwargs = to_tpu(args), to_tpu(kwargs)
    actual = fn(*tpu_args, **tpu_kwargs)
    for value in _flatten(actual):
        if isinstance(value, torch.Tensor):
            assert value.device.type == "tpu", f"output on {value.device}, expected tpu"
    assert_close(actual, expected, rtol, atol)
    if grad:
        cpu_inputs = [t for t in _flatten(args) if isinstance(t, torch.Tensor) and t.requires_grad]
        tpu_inputs = [t for t in _flatten(tpu_args) if isinstance(t, torch.Tensor) and t.requires_grad]
        out_cpu = [o for o in _flatten(expected) if isinstance(o, torch.Tensor) and o.requires_grad]
        out_tpu = [o for o in _flatten(actual) if isinstance(o, torch.Tensor) and o.requires_grad]
        seeds = [torch.randn_like(o) if o.is_floating_point() else None for o in out_cpu]
        grads_cpu = torch.autograd.grad(out_cpu, cpu_inputs, seeds, allow_unused=True)
        grads_tpu = torch.autograd.grad(out_tpu, tpu_inputs, to_tpu(seeds), allow_unused=True)
        assert_close(list(grads_tpu), list(grads_cpu), rtol, atol)
    return actual
