"""`F.linear` on tpu tensors as one program each way in Strict and Debug eager (one op each way in Fused).

PyTorch's `linear` is a composite (`addmm`, or `matmul` and `add`) whose backward launches a program for each
gradient: the input's and the weight's products and the bias's sum, three launches of ~300 µs of host time each on a
v5e for every layer of a step. `torch_tpu::linear` computes the layer as `addmm` does and its backward,
`torch_tpu::linear_backward`, the wanted gradients in one program; the route calls their tpu kernels without the
dispatcher (`library.eager_function`: ~50 µs less host time a call on the CPU machine). A call it does not serve
runs PyTorch's composite: a 1-d input, other dtypes or shapes, math bits, tensor subclasses (AOTAutograd's tracing
among them, so compiled graphs keep PyTorch's decomposition) and torch.func's transforms. Fused eager records it
as one op each way (`matmul.FUSED`). A backward that makes a graph (`create_graph=True`) computes the gradients with
PyTorch's differentiable ops instead, so that second derivatives are PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_tpu.kernels.prebuilt import library, matmul
from torch_tpu.ops import linalg

_LINEAR = torch.ops.aten.linear.default
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_library: list[torch.library.Library] = []
_eager: list = []  # the route's `torch_tpu::linear` under autograd, without the dispatcher (set by `install`)


def serves(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `torch_tpu::linear` takes the call: `matmul.eager_operands` (parameters too), an input of at least
    2 dimensions, a 2-d weight and a bias of its rows or none."""
    if not matmul.eager_operands((x, weight, bias), _PLAIN):
        return False
    if x.ndim < 2 or weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        return False
    return bias is None or (bias.ndim == 1 and bias.shape[0] == weight.shape[0])


def _route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if serves(x, weight, bias):
        return _eager[0](x, weight, bias)
    return _LINEAR.decompose(x, weight, bias)


def _fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _gradients_reference(grad, x, weight, wanted):
    """The CPU kernel of `linear_backward`: PyTorch's own gradients of `F.linear`."""
    with torch.enable_grad():
        inputs = [x.detach().requires_grad_(), weight.detach().requires_grad_()]
        bias = torch.zeros(weight.shape[0], dtype=x.dtype).requires_grad_()
        found = torch.autograd.grad(torch.nn.functional.linear(*inputs, bias), [*inputs, bias], grad)
    return tuple(g if w else g.new_empty(0) for g, w in zip(found, wanted, strict=True))


def _gradients_fake(grad, x, weight, wanted):
    shapes = (x.shape, weight.shape, weight.shape[:1])
    return tuple(grad.new_empty(shape if w else (0,)) for shape, w in zip(shapes, wanted, strict=True))


def _setup(ctx, inputs, output) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _differentiation(gradients: Callable) -> Callable:
    """The backward of `torch_tpu::linear` that computes the gradients with `gradients` (`linear_backward`, by
    the dispatcher or its tpu kernel directly)."""

    def differentiate(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        wanted = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        if torch.is_grad_enabled():  # create_graph: PyTorch's differentiable ops
            rows = grad.reshape(-1, grad.shape[-1])
            found = (grad @ weight, rows.mT @ x.reshape(-1, x.shape[-1]), rows.sum(0))
        else:
            found = gradients(grad, x, weight, wanted)
        return tuple(g if w else None for g, w in zip(found, wanted, strict=True))

    return differentiate


def install() -> None:
    """Define `torch_tpu::linear` and its backward, and route `aten::linear` of tpu tensors through `serves`."""
    if _library:
        return
    schema = "linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor"
    op = library.define(schema, linalg.linear_product, torch.nn.functional.linear, _fake)
    schema = "linear_backward(Tensor grad, Tensor input, Tensor weight, bool[] wanted) -> (Tensor, Tensor, Tensor)"
    gradients = library.define(schema, linalg.linear_gradients, _gradients_reference, _gradients_fake)
    library.differentiable(op, _differentiation(gradients), _setup)
    backward = _differentiation(library.eager_kernel(gradients))
    _eager.append(library.eager_function("LinearFunction", op, _setup, backward))
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("linear", _route, "AutogradPrivateUse1")
    lib.impl("linear", _route, "PrivateUse1")  # reached when autograd is off (inference mode)
    _library.append(lib)
