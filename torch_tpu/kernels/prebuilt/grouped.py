"""`torch.tpu.ops.ragged_dot` (a grouped matmul: consecutive row groups of `lhs` each times their own matrix, what a
mixture-of-experts layer runs after sorting tokens by expert; `jax.lax.ragged_dot`, which XLA lowers to a grouped
kernel on TPU and GPU) and `torch.tpu.ops.optimization_barrier` (`jax.lax.optimization_barrier`: XLA may not move
computation across it, e.g. to keep a rematerialised activation from being recomputed early)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_tpu import precision
from torch_tpu.kernels.prebuilt import library

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
GROUP_DTYPES = (torch.int32, torch.int64)


def _ragged_dot(lhs, rhs, group_sizes):
    return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), precision=precision.for_dot())


def _ragged_dot_backward(grad, lhs, rhs, group_sizes):
    _, vjp = jax.vjp(lambda a, b: _ragged_dot(a, b, group_sizes), lhs, rhs)
    return vjp(grad.astype(lhs.dtype))


def check_ragged_dot(lhs, rhs, group_sizes) -> None:
    """ragged_dot's argument rules, each error naming the argument."""
    library.check_tensor("ragged_dot", "lhs", lhs, (2,), FLOATS)
    library.check_tensor("ragged_dot", "rhs", rhs, (3,), FLOATS)
    library.check_tensor("ragged_dot", "group_sizes", group_sizes, (1,), GROUP_DTYPES)
    if rhs.dtype != lhs.dtype:
        raise TypeError(f"torch.tpu.ops.ragged_dot: rhs dtype {rhs.dtype} must equal lhs dtype {lhs.dtype}")
    if rhs.shape[1] != lhs.shape[1]:
        raise ValueError(
            f"torch.tpu.ops.ragged_dot: rhs shape {tuple(rhs.shape)} (G, K, N) does not fit lhs {tuple(lhs.shape)}"
        )
    if group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(f"torch.tpu.ops.ragged_dot: group_sizes has {group_sizes.shape[0]} groups, rhs {rhs.shape[0]}")


def _reference(lhs, rhs, group_sizes):
    """Each group's rows times its matrix; rows past the groups' total are zero (as in `jax.lax.ragged_dot`)."""
    check_ragged_dot(lhs, rhs, group_sizes)
    out = lhs.new_zeros(lhs.shape[0], rhs.shape[2])
    start = 0
    for group, size in enumerate(group_sizes.tolist()):
        out[start : start + size] = lhs[start : start + size] @ rhs[group]
        start += size
    return out


def _reference_backward(grad, lhs, rhs, group_sizes):
    with torch.enable_grad():
        inputs = [lhs.detach().requires_grad_(), rhs.detach().requires_grad_()]
        return torch.autograd.grad(_reference(*inputs, group_sizes), inputs, grad)


def _fake(lhs, rhs, group_sizes):
    check_ragged_dot(lhs, rhs, group_sizes)
    return lhs.new_empty(lhs.shape[0], rhs.shape[2])


def _fake_backward(grad, lhs, rhs, group_sizes):
    return lhs.new_empty(lhs.shape), rhs.new_empty(rhs.shape)


def _barrier(tensors):
    return list(jax.lax.optimization_barrier(list(tensors)))


def _barrier_reference(tensors):
    return [t.clone() for t in tensors]


def install() -> None:
    """Define `torch_tpu::ragged_dot` (with its backward op) and `torch_tpu::optimization_barrier`."""
    forward = library.define(
        "ragged_dot(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor", _ragged_dot, _reference, _fake
    )
    backward = library.define(
        "ragged_dot_backward(Tensor grad, Tensor lhs, Tensor rhs, Tensor group_sizes) -> (Tensor, Tensor)",
        _ragged_dot_backward,
        _reference_backward,
        _fake_backward,
    )

    def setup(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    def differentiate(ctx, grad):
        lhs, rhs, group_sizes = ctx.saved_tensors
        return *backward(grad.contiguous(), lhs, rhs, group_sizes), None

    library.differentiable(forward, differentiate, setup)

    barrier = library.define(
        "optimization_barrier(Tensor[] tensors) -> Tensor[]", _barrier, _barrier_reference, _barrier_reference
    )
    library.differentiable(barrier, lambda ctx, grads: (list(grads),), lambda ctx, inputs, output: None)
