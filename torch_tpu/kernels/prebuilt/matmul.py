"""`torch.matmul` of two batched tpu tensors as one program in Strict and Debug eager (one op in Fused).

PyTorch's composite `matmul` reshapes each operand to three dimensions for `bmm`, and a transposed operand (an
attention's heads, `q @ k.transpose(-2, -1)`) cannot be reshaped as a view: it is copied, and in Strict eager each
copy is a program launch of its own (in a small GPT step, 28 of 205, ~300 µs of host time each on a v5e), in the
backward as well. `torch_tpu::matmul` takes the operands as they are stored (the dispatcher reads a view inside the
program) and its backward is two more of it, each gradient laid out as its input (`torch_tpu::matmul_ordered`: the
product with its axes permuted in the program), so that the transposes and reshapes between the heads and the
tensor they came from stay views in the backward too. The route calls their tpu kernels without the dispatcher
(`library.eager_function`). A call it does not serve runs PyTorch's composite (its C++ kernel, not the Python
decomposition PyTorch registers over it for tracing, which cost ~60 µs a call more: tracing keeps that one): other
ranks or batch shapes, broadcasting, dtypes other than float32/bfloat16/float16, math bits, tensor subclasses
(AOTAutograd's tracing among them, so compiled graphs keep PyTorch's decomposition) and torch.func's transforms.
Fused eager takes it too (`FUSED`): its clusters would fuse the copies anyway, but it records one op where the
composite records several.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from torch_tpu.eager import modes
from torch_tpu.kernels.prebuilt import library
from torch_tpu.ops import linalg
from torch_tpu.runtime import compat

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FUSED = os.environ.get("TORCH_TPU_FUSED_PRODUCTS", "1") != "0"
"""Whether Fused eager records these products and `F.linear` (kernels/prebuilt/linear.py) as one op each way (0:
PyTorch's composites, whose copies a cluster fuses into the same products). Recording is host time a Fused step's
device waits for: a 12-layer GPT's forward records 199 ops instead of 235 and its backward 213 instead of 345, and
`bench/eager_overhead.py`'s pass of it took 28.9-44.7 ms against 42.4-56.2 on the CPU machine; the cluster's
matrix products are the same (39). On a v5e the large GPT Fused step took 70.35 ms against 87.09 (each at its best
cut), the small one 17.11 against 21.18."""
_MATMUL = torch.ops.aten.matmul.default
_composite = compat.cpp_composite(_MATMUL)
_library: list[torch.library.Library] = []
_eager: list = []  # the route's `torch_tpu::matmul` under autograd, without the dispatcher (set by `install`)


def eager_operands(tensors: tuple, plain: tuple[type, ...] = (torch.Tensor,)) -> bool:
    """Whether an op of ours with autograd may take `tensors` (None for an absent one): of the `plain` types (no
    subclass: AOTAutograd traces FakeTensors), of one dtype of DTYPES, without a conjugate or negative bit, outside
    torch.func's transforms (whose wrapped tensors are plain to Python) and, unless `FUSED`, Fused eager."""
    given = [t for t in tensors if t is not None]
    if any(type(t) not in plain for t in given) or compat.functorch_transforming() or modes.state.fused and not FUSED:
        return False
    if given[0].dtype not in DTYPES or any(t.dtype != given[0].dtype for t in given):
        return False
    return not any(t.is_conj() or t.is_neg() for t in given)


def serves(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether `torch_tpu::matmul` takes `self @ other`: `eager_operands` of one rank of at least 3, one batch
    shape."""
    if not eager_operands((self, other)):
        return False
    if self.ndim < 3 or self.ndim != other.ndim or self.shape[:-2] != other.shape[:-2]:
        return False
    return self.shape[-1] == other.shape[-2]


def _route(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if serves(self, other):
        return _eager[0](self, other)
    if type(self) is torch.Tensor and type(other) is torch.Tensor and not compat.functorch_transforming():
        return _composite(self, other)  # C++: Fused eager's products, and the calls not served
    return _MATMUL.decompose(self, other)  # tracing (symbolic shapes) takes PyTorch's Python decomposition


def _fake(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return self.new_empty((*self.shape[:-1], other.shape[-1]))


def _ordered(a, b, order: list[int]):
    return linalg.batched_product(a, b).transpose(order)


def _ordered_reference(self: torch.Tensor, other: torch.Tensor, order: list[int]) -> torch.Tensor:
    return torch.matmul(self, other).permute(order).contiguous()


def _ordered_fake(self: torch.Tensor, other: torch.Tensor, order: list[int]) -> torch.Tensor:
    shape = (*self.shape[:-1], other.shape[-1])
    return self.new_empty([shape[d] for d in order])


def _memory_order(tensor: torch.Tensor) -> list[int] | None:
    """`tensor`'s dimensions from the outermost in memory to the innermost (by stride; an attention's transposed
    heads: batch, sequence, head, feature), or None where that is their own order."""
    order = sorted(range(tensor.ndim), key=lambda d: -tensor.stride(d))
    return None if order == sorted(order) else order


def _inverse(order: list[int]) -> list[int]:
    return sorted(range(len(order)), key=order.__getitem__)


class _Products(NamedTuple):
    """How a backward computes its products: `torch_tpu::matmul` and `matmul_ordered` by the dispatcher, or their
    tpu kernels directly."""

    plain: Callable
    ordered: Callable


def _product_like(a: torch.Tensor, b: torch.Tensor, like: torch.Tensor, products: _Products) -> torch.Tensor:
    """`a @ b` laid out in memory as `like` is: an input's gradient, so that the views between it and the tensor
    it was taken from (a transpose, then a reshape) stay views in the backward instead of copies."""
    order = _memory_order(like)
    if order is None:
        return products.plain(a, b)
    return products.ordered(a, b, order).permute(_inverse(order))


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:2])
    ctx.order = inputs[2] if len(inputs) > 2 else None


def _differentiation(direct: _Products, dispatched: _Products) -> Callable:
    """The backward of `torch_tpu::matmul` and `matmul_ordered`: two more products, `direct` unless it makes a
    graph (`create_graph`: the dispatched ops, whose autograd records it)."""

    def differentiate(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        self, other = ctx.saved_tensors
        products = dispatched if torch.is_grad_enabled() else direct
        if ctx.order is not None:  # matmul_ordered's: the product's gradient in the product's own axes
            grad = grad.permute(_inverse(ctx.order))
        grad_self = _product_like(grad, other.mT, self, products) if ctx.needs_input_grad[0] else None
        grad_other = _product_like(self.mT, grad, other, products) if ctx.needs_input_grad[1] else None
        return (grad_self, grad_other) if ctx.order is None else (grad_self, grad_other, None)

    return differentiate


def install() -> None:
    """Define `torch_tpu::matmul` and route `aten::matmul` of tpu tensors through `serves` (once)."""
    if _library:
        return
    op = library.define("matmul(Tensor self, Tensor other) -> Tensor", linalg.batched_product, torch.matmul, _fake)
    schema = "matmul_ordered(Tensor self, Tensor other, int[] order) -> Tensor"
    ordered = library.define(schema, _ordered, _ordered_reference, _ordered_fake)
    dispatched = _Products(op, ordered)
    by_dispatcher = _differentiation(dispatched, dispatched)
    library.differentiable(op, by_dispatcher, _setup)
    library.differentiable(ordered, by_dispatcher, _setup)
    direct = _Products(library.eager_kernel(op), library.eager_kernel(ordered))
    _eager.append(library.eager_function("MatmulFunction", op, _setup, _differentiation(direct, dispatched)))
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("matmul", _route, "AutogradPrivateUse1")
    lib.impl("matmul", _route, "PrivateUse1")  # reached when autograd is off (inference mode)
    _library.append(lib)
