"""`torch.tpu.ops.max_pool1d/2d/3d`: max pooling without indices, as one `lax.reduce_window` whose gradient is XLA's
select-and-scatter (what TPUs run well), instead of ATen's `max_pool*_with_indices`, whose backward scatters
through computed indices (which the backward of a dilated pool still does: JAX has no select-and-scatter for
dilated windows). Arguments and results are `F.max_pool{n}d`'s (without `return_indices`)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from jax import lax

from torch_tpu.kernels.prebuilt import library
from torch_tpu.ops.nn import pool as aten_pool

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_TORCH = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _geometry(shape: Sequence[int], n: int, kernel_size, stride, padding, dilation, ceil_mode):
    """Per spatial dim (kernel, stride, dilation, (low, high) padding), so that the window count is ATen's."""
    kernel, stride = list(kernel_size), list(stride) or list(kernel_size)
    padding, dilation = list(padding), list(dilation)
    dims = []
    for i, size in enumerate(shape[-n:]):
        k, s, p, d = kernel[i], stride[i], padding[i], dilation[i]
        span = d * (k - 1) + 1
        out = (size + 2 * p - span + ((s - 1) if ceil_mode else 0)) // s + 1
        if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input or left padding
            out -= 1
        dims.append((k, s, d, (p, max((out - 1) * s + span - size - p, 0))))
    return dims


def _max_pool(n: int):
    def pool(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
        dims = _geometry(self.shape, n, *_expanded(n, kernel_size, stride, padding, dilation), ceil_mode)
        lead = (1,) * (self.ndim - n)
        lowest = -jnp.inf if jnp.issubdtype(self.dtype, jnp.floating) else jnp.iinfo(self.dtype).min
        return lax.reduce_window(
            self,
            np.asarray(lowest, self.dtype),  # concrete: reduce_window sees the max monoid (differentiable)
            lax.max,
            lead + tuple(d[0] for d in dims),
            lead + tuple(d[1] for d in dims),
            ((0, 0),) * (self.ndim - n) + tuple(d[3] for d in dims),
            window_dilation=lead + tuple(d[2] for d in dims),
        )

    return pool


def _expanded(n: int, kernel_size, stride, padding, dilation):
    def spread(values):
        values = list(values)
        return values * n if len(values) == 1 else values

    return spread(kernel_size), spread(stride) if len(stride) else [], spread(padding), spread(dilation)


def _check(n: int, self, kernel_size, stride, padding, dilation) -> None:
    name = f"max_pool{n}d"
    library.check_tensor(name, "input", self, (n + 1, n + 2), DTYPES)
    for argument, values, allowed in (
        ("kernel_size", kernel_size, (1, n)),
        ("stride", stride, (0, 1, n)),
        ("padding", padding, (1, n)),
        ("dilation", dilation, (1, n)),
    ):
        if len(values) not in allowed:
            raise ValueError(f"torch.tpu.ops.{name}: {argument} must have 1 or {n} values, got {list(values)}")
    kernel, _, pads, dilations = _expanded(n, kernel_size, stride, padding, dilation)
    if min(kernel) < 1 or min(dilations) < 1 or (stride and min(stride) < 1):
        raise ValueError(f"torch.tpu.ops.{name}: kernel_size, stride and dilation must be positive")
    if any(p < 0 or 2 * p > k for p, k in zip(pads, kernel, strict=True)):
        raise ValueError(f"torch.tpu.ops.{name}: padding {list(padding)} must be at most half of kernel_size")


def _backward(n: int):
    forward = _max_pool(n)

    def backward(grad, self, kernel_size, stride, padding, dilation, ceil_mode):
        grad = grad.astype(self.dtype)
        if any(d != 1 for d in dilation):  # JAX has no select-and-scatter VJP for dilated windows: ATen's way
            _, indices = aten_pool.max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, n=n)
            return aten_pool.max_pool_backward(
                grad, self, kernel_size, stride, padding, dilation, ceil_mode, indices, n=n
            )
        _, vjp = jax.vjp(lambda x: forward(x, kernel_size, stride, padding, dilation, ceil_mode), self)
        return vjp(grad)[0]

    return backward


def _reference(n: int):
    def reference(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
        _check(n, self, kernel_size, stride, padding, dilation)
        return _TORCH[n](self, kernel_size, stride or None, padding, dilation, ceil_mode)

    return reference


def _reference_backward(n: int):
    def backward(grad, self, kernel_size, stride, padding, dilation, ceil_mode):
        with torch.enable_grad():
            x = self.detach().requires_grad_()
            out = _TORCH[n](x, kernel_size, stride or None, padding, dilation, ceil_mode)
            return torch.autograd.grad(out, x, grad)[0]

    return backward


def _fake(n: int):
    def fake(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
        _check(n, self, kernel_size, stride, padding, dilation)
        dims = _geometry(self.shape, n, *_expanded(n, kernel_size, stride, padding, dilation), ceil_mode)
        sizes = [
            (size + low + high - (d * (k - 1) + 1)) // s + 1
            for size, (k, s, d, (low, high)) in zip(self.shape[-n:], dims, strict=True)
        ]
        return self.new_empty((*self.shape[: self.ndim - n], *sizes))

    return fake


_ARGS = "int[{n}] kernel_size, int[{n}] stride, int[{n}] padding, int[{n}] dilation, bool ceil_mode"


def install() -> None:
    """Define `torch_tpu::max_pool{1,2,3}d` and their backward ops, with autograd between them."""
    for n in (1, 2, 3):
        args = _ARGS.format(n=n)
        defaults = args.replace("stride", "stride=[]").replace("padding", "padding=0").replace("dilation", "dilation=1")
        defaults = defaults.replace("ceil_mode", "ceil_mode=False")
        forward = library.define(
            f"max_pool{n}d(Tensor input, {defaults}) -> Tensor", _max_pool(n), _reference(n), _fake(n)
        )
        backward = library.define(
            f"max_pool{n}d_backward(Tensor grad, Tensor input, {args}) -> Tensor",
            _backward(n),
            _reference_backward(n),
            lambda grad, x, *args: x.new_empty(x.shape),
        )

        def setup(ctx, inputs, output) -> None:
            ctx.save_for_backward(inputs[0])
            ctx.options = inputs[1:]

        def differentiate(ctx, grad, backward=backward):
            return backward(grad.contiguous(), ctx.saved_tensors[0], *ctx.options), None, None, None, None, None

        library.differentiable(forward, differentiate, setup)
