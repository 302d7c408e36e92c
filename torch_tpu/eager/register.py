"""Install the registry into PyTorch's dispatcher: one PrivateUse1 kernel per lowered overload and its
derived in-place, `out=` and argument-updating (`writes=`) variants, plus a fallback for every other op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

from torch_tpu.eager import dispatch, fallback, validation
from torch_tpu.ops.registry import KERNELS, LOWERINGS, Lowering, inplace_variant, mutated_args, out_variant
from torch_tpu.runtime import storage

_libraries: list[torch.library.Library] = []


def _is_factory(op: torch._ops.OpOverload) -> bool:
    """An op making a tensor from sizes and numbers alone, or writing them into its `out=`."""
    writes = mutated_args(op)
    if writes and not all(a.kwarg_only for a in writes):
        return False
    return not any("Tensor" in str(a.type) for a in op._schema.arguments if a not in writes)


def install() -> None:
    """Register every kernel for the `tpu` device (idempotent)."""
    if _libraries:
        return
    import torch_tpu.ops  # noqa: F401  (every op family fills the registry as it is imported)

    lib = torch.library.Library("aten", "IMPL")
    registered = set()
    for op, fn in KERNELS.items():
        if _is_factory(op):  # e.g. eye, arange, empty: raise CPU's errors for bad sizes, not JAX's
            fn = validation.with_cpu_errors(op, fn)
            if mutated_args(op):  # and an `out` that CPU refuses to write (`check_writes`)
                fn = validation.with_out_checks(op, fn)
        lib.impl(op, fn, "PrivateUse1")
        registered.add(op)
    for op, lowering in LOWERINGS.items():
        writes = mutated_args(op)
        if writes and [a.name for a in writes] == ["self"]:
            lib.impl(op, dispatch.inplace_kernel(lowering, op), "PrivateUse1")
            registered.add(op)
            continue
        if lowering.mutating is None or not _returns_lists(op):  # else PyTorch's kernel: clones, calls `mutating`
            lib.impl(op, dispatch.functional_kernel(lowering), "PrivateUse1")
            registered.add(op)
        if lowering.mutating is not None:
            lib.impl(lowering.mutating, writing_kernel(lowering), "PrivateUse1")
            registered.add(lowering.mutating)
        # (a list output's `out=` form, e.g. foreach's, keeps PyTorch's kernel, which calls ours per tensor)
        out = out_variant(op) if str(op._schema.returns[0].type) != "List[Tensor]" else None
        for variant, make in ((inplace_variant(op), dispatch.inplace_kernel), (out, dispatch.out_kernel)):
            if variant is not None and variant not in registered and variant not in LOWERINGS:
                lib.impl(variant, make(lowering, variant), "PrivateUse1")
                registered.add(variant)
    global_lib = torch.library.Library("_", "IMPL")
    global_lib.fallback(fallback.unimplemented, "PrivateUse1")
    _libraries.extend([lib, global_lib])


def _returns_lists(op: OpOverload) -> bool:
    """Whether `op` returns several results, one a list of tensors (a fused optimizer's functional form)."""
    returns = [str(r.type) for r in op._schema.returns]
    return len(returns) > 1 and "List[Tensor]" in returns


def writing_kernel(lowering: Lowering) -> Callable:
    """The kernel of `lowering.mutating`: the functional lowering runs on its arguments, its trailing outputs are
    written into the arguments `lowering.writes` and the others are returned."""
    runner = dispatch.Runner(lowering, lowering.mutating)
    op: OpOverload = lowering.op
    names = lowering.writes
    positions = {a.name: i for i, a in enumerate(lowering.mutating._schema.arguments) if not a.kwarg_only}
    returns = len(lowering.mutating._schema.returns)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        values = list(runner.run(op, args, kwargs))
        kept, new = values[: -len(names)], values[-len(names) :]
        for name, value in zip(names, new, strict=True):
            target = args[positions[name]] if positions.get(name, len(args)) < len(args) else kwargs[name]
            for tensor, array in zip(target, value, strict=True) if isinstance(target, list) else [(target, value)]:
                if array is not None:  # None: left as it is
                    storage.write(tensor, array)
        if not returns:
            return None
        result = [None if r is None else storage.wrap(r) for r in kept]
        return result[0] if returns == 1 else tuple(result)

    return kernel
