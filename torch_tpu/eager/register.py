"""Install the registry into PyTorch's dispatcher: one PrivateUse1 kernel per lowered overload and its
derived in-place and `out=` variants, plus a fallback for every other op."""

from __future__ import annotations

import torch

from torch_tpu.eager import dispatch, fallback, validation
from torch_tpu.ops.registry import KERNELS, LOWERINGS, inplace_variant, mutated_args, out_variant

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
    lib = torch.library.Library("aten", "IMPL")
    registered = set()
    for op, fn in KERNELS.items():
        if _is_factory(op):  # e.g. eye, arange, empty: raise CPU's errors for bad sizes, not JAX's
            fn = validation.with_cpu_errors(op, fn)
        lib.impl(op, fn, "PrivateUse1")
        registered.add(op)
    for op, lowering in LOWERINGS.items():
        writes = mutated_args(op)
        if writes and [a.name for a in writes] == ["self"]:
            lib.impl(op, dispatch.inplace_kernel(lowering, op), "PrivateUse1")
            registered.add(op)
            continue
        lib.impl(op, dispatch.functional_kernel(lowering), "PrivateUse1")
        registered.add(op)
        # (a list output's `out=` form, e.g. foreach's, keeps PyTorch's kernel, which calls ours per tensor)
        out = out_variant(op) if str(op._schema.returns[0].type) != "List[Tensor]" else None
        for variant, make in ((inplace_variant(op), dispatch.inplace_kernel), (out, dispatch.out_kernel)):
            if variant is not None and variant not in registered and variant not in LOWERINGS:
                lib.impl(variant, make(lowering, variant), "PrivateUse1")
                registered.add(variant)
    global_lib = torch.library.Library("_", "IMPL")
    global_lib.fallback(fallback.unimplemented, "PrivateUse1")
    _libraries.extend([lib, global_lib])
