"""Run the same computation on CPU and on `tpu` and compare, with tolerances a numerics engineer would defend.

fp32 tolerances allow XLA's different (but correctly rounded per op) reduction orders and fused transcendental
approximations; bf16/fp16 allow one or two units in the last place of the narrow format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torch_tpu.eager.modes import EagerMode
from torch_tpu.runtime import platform

# (rtol, atol). fp32: rtol 1.3e-5 is about 100 ulp, ten times PyTorch's same-device default (1.3e-6), since
# XLA sums in another order and uses its own transcendental approximations; atol is PyTorch's 1e-5.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-5, 1e-5),
    torch.complex64: (1.3e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


# The three eager modes by the names tests parametrize over.
EAGER_MODES = {
    "strict": EagerMode.DEFER_NEVER,
    "debug": EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
    "fused": EagerMode.DEFER_AND_FUSE,
}


# float32 on a TPU: XLA's TPU backend computes float32 transcendentals with its own approximations, measured on a v5e
# (docs/numerics.md, bench/tpu_numerics.py) at up to ~1.6e-4 relative error near a function's zeros (tanh 1.3e3 ulp,
# log1p 4e3 ulp near 0) and ~1e-5 elsewhere (exp 102 ulp); results that pass through them, and training steps built on
# them, differ from CPU's by up to that much (3e-5 absolute in the model and optimizer tests' parameters).
TPU_FLOAT32: tuple[float, float] = (2e-4, 5e-5)
# float32 gradients on a TPU: a derivative through a transcendental cancels its error into an absolute one (tanh's
# 1.3e3 ulp is ~8e-5 near |tanh| = 1, which 1 - tanh^2 doubles), scaled by the upstream gradient (randn seeds, up to
# ~2.5); measured on a v5e up to 1.6e-4 (gelu, log_softmax, tanh in tests/test_opinfo.py).
TPU_FLOAT32_GRADIENT: tuple[float, float] = (2e-4, 4e-4)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results of `dtype` on this platform; exact for integers and bool."""
    if dtype in (torch.float32, torch.complex64):
        return float32_tolerance(*TOLERANCES[dtype])
    return TOLERANCES.get(dtype, (0.0, 0.0))


def float32_tolerance(rtol: float, atol: float) -> tuple[float, float]:
    """(rtol, atol) for float32 results: the given ones, or on a TPU the chip's (`TPU_FLOAT32`)."""
    return TPU_FLOAT32 if platform.platform() == "tpu" else (rtol, atol)


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


def check_op(
    fn: Callable[..., Any],
    *args: Any,
    rtol: float | None = None,
    atol: float | None = None,
    grad: bool = False,
    reference64: bool = False,
    **kwargs: Any,
) -> Any:
    """Run `fn` on CPU args and on `tpu` copies; assert the outputs (and, with `grad`, input grads) match.

    With `reference64`, a float result that misses the fixed tolerance is judged by a float64 CPU run instead
    (`assert_as_accurate_as_cpu`): for ops whose long reductions round differently on each device.
    """
    expected = _reference(fn, args, kwargs)
    tpu_args, tpu_kwargs = to_tpu(args), to_tpu(kwargs)
    actual = fn(*tpu_args, **tpu_kwargs)
    for value in _flatten(actual):
        if isinstance(value, torch.Tensor):
            assert value.device.type == "tpu", f"output on {value.device}, expected tpu"
    wide_args, wide_kwargs = (_widened(args), _widened(kwargs)) if reference64 else (None, None)
    _compare(actual, expected, rtol, atol, lambda: fn(*wide_args, **wide_kwargs) if reference64 else None)
    if grad:
        seeds = [torch.randn_like(o) if o.is_floating_point() else None for o in _differentiable(expected)]
        grads_cpu = _grads(expected, args, seeds)
        grads_tpu = _grads(actual, tpu_args, to_tpu(seeds))
        _compare(
            grads_tpu,
            grads_cpu,
            *_gradient_tolerance(grads_cpu, rtol, atol),
            lambda: _grads(fn(*wide_args, **wide_kwargs), wide_args, seeds) if reference64 else None,
        )
    return actual


def _reference(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`fn` on CPU. Where the running PyTorch has no CPU kernel for a dtype (older releases: bfloat16 `trace`
    before 2.13) there is nothing to compare with, so the test is skipped, naming the release; it never passes."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, NotImplementedError) as error:
        if "not implemented for" not in str(error):
            raise
        import pytest

        pytest.skip(f"CPU PyTorch {torch.__version__} has no reference for this case: {error}")


def _differentiable(outputs: Any) -> list[torch.Tensor]:
    return [o for o in _flatten(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]


def _grads(outputs: Any, inputs: Any, seeds: list[Any]) -> list[Any]:
    wrt = [t for t in _flatten(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = _differentiable(outputs)
    seeds = [s if s is None else s.to(device=o.device, dtype=o.dtype) for s, o in zip(seeds, outs, strict=True)]
    return list(torch.autograd.grad(outs, wrt, seeds, allow_unused=True))


def _gradient_tolerance(grads: list[Any], rtol: float | None, atol: float | None) -> tuple[float | None, float | None]:
    """The tolerance for gradients: the one given, else on a TPU `TPU_FLOAT32_GRADIENT` for float32 ones."""
    tensors = [g for g in grads if isinstance(g, torch.Tensor)]
    single = tensors and all(g.dtype in (torch.float32, torch.complex64) for g in tensors)
    if rtol is None and atol is None and single and platform.platform() == "tpu":
        return TPU_FLOAT32_GRADIENT
    return rtol, atol


def _compare(actual: Any, expected: Any, rtol: float | None, atol: float | None, reference: Callable[[], Any]) -> None:
    try:
        assert_close(actual, expected, rtol, atol)
    except AssertionError:
        wide = reference()
        if wide is None:
            raise
        assert_as_accurate_as_cpu(actual, expected, wide, rtol, atol)


def _widened(value: Any) -> Any:
    """Floating tensors as float64 leaves (complex as complex128), keeping requires_grad."""

    def widen(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            wide = torch.complex128 if t.is_complex() else torch.float64
            return t.detach().to(wide).requires_grad_(t.requires_grad)
        return t

    return tree_map(widen, value)


def assert_as_accurate_as_cpu(
    actual: Any, expected: Any, reference: Any, rtol: float | None = None, atol: float | None = None
) -> None:
    """Judge a `tpu` result by a float64 `reference` where CPU's own result (`expected`) is not exact enough to
    compare with: floating outputs must be within the fixed tolerance (or `rtol`/`atol`) of the reference, widened
    by twice CPU's largest error against it (long reductions round differently on each device); other outputs as
    CPU's."""
    flat_a, flat_e, flat_r = _flatten(to_cpu(actual)), _flatten(expected), _flatten(reference)
    assert len(flat_a) == len(flat_e) == len(flat_r), "outputs differ in number"
    for a, e, r in zip(flat_a, flat_e, flat_r, strict=True):
        if not isinstance(e, torch.Tensor) or not (e.is_floating_point() or e.is_complex()):
            assert_close(a, e)
            continue
        assert isinstance(a, torch.Tensor) and a.dtype == e.dtype and a.shape == e.shape == r.shape, (
            f"expected {e.dtype} {tuple(e.shape)}, got {getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
        )
        r = r.detach().to(torch.complex128 if r.is_complex() else torch.float64)
        cpu_error = (e.to(r.dtype) - r).abs().nan_to_num(0.0).max().item() if e.numel() else 0.0
        fixed_rtol, fixed_atol = tolerance(e.dtype)
        fixed_rtol, fixed_atol = fixed_rtol if rtol is None else rtol, fixed_atol if atol is None else atol
        torch.testing.assert_close(a.to(r.dtype), r, rtol=fixed_rtol, atol=fixed_atol + 2 * cpu_error, equal_nan=True)


def has_derivative(fn: Callable[..., Any], *shapes: tuple[int, ...]) -> bool:
    """Whether the installed torch's autograd differentiates `fn` (on CPU float32 inputs of `shapes`): releases
    differ (torch 2.11 has no formula for aminmax or narrow_copy), and a test then checks values only."""
    inputs = [torch.ones(shape, requires_grad=True) for shape in shapes]
    try:
        outputs = [t for t in torch.utils._pytree.tree_leaves(fn(*inputs)) if isinstance(t, torch.Tensor)]
        torch.stack([t.float().sum() for t in outputs if t.is_floating_point()]).sum().backward()
    except RuntimeError as error:
        if "derivative for" in str(error) and "is not implemented" in str(error):
            return False
        raise
    return True
