"""PrivateUse1 kernels for torch's `c10d::*` ops: what every collective on tpu tensors reaches.

`dist.all_reduce(t)` (and DDP's reducer, DTensor, funcol) dispatch `c10d::allreduce_` on the tensors' device;
torch's own PrivateUse1 kernel would hand them to the group's C++ backend (gloo, which cannot read a tpu
storage), so these replace it: each reads the local tensors' arrays, runs the collective as an XLA program over
the group's devices (`distributed.collectives`), writes the results into the output tensors in place (views and
their bases too) and returns a completed Work.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from torch_tpu.distributed import collectives
from torch_tpu.eager import fused
from torch_tpu.runtime import storage

_OPS = {
    dist.ReduceOp.RedOpType.SUM: "sum",
    dist.ReduceOp.RedOpType.AVG: "avg",
    dist.ReduceOp.RedOpType.MAX: "max",
    dist.ReduceOp.RedOpType.MIN: "min",
    dist.ReduceOp.RedOpType.PRODUCT: "product",
    dist.ReduceOp.RedOpType.BAND: "band",
    dist.ReduceOp.RedOpType.BOR: "bor",
    dist.ReduceOp.RedOpType.BXOR: "bxor",
}
_BITWISE = ("band", "bor", "bxor")
# Bool reductions run on uint8: a sum or maximum is a logical or, a product or minimum a logical and.
_BOOL_OPS = {"sum": "max", "max": "max", "bor": "max", "product": "min", "min": "min", "band": "min", "bxor": "bxor"}


@functools.cache
def _group_ranks(name: str) -> tuple[int, ...]:
    """The global ranks of the group called `name`, in group-rank order (a group's name never changes)."""
    group = dist.distributed_c10d._resolve_process_group(name)
    return tuple(dist.get_process_group_ranks(group))


def _ranks(process_group: Any) -> tuple[int, ...]:
    return _group_ranks(dist.ProcessGroup.unbox(process_group).group_name)


def _done(result: Any) -> Any:
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future).boxed()


def _read(tensor: torch.Tensor) -> jax.Array:
    return fused.concrete(storage.value(tensor.detach()))


def _check_tpu(name: str, tensors: list[torch.Tensor]) -> None:
    for tensor in tensors:
        if tensor.device.type != "tpu":
            raise RuntimeError(f"tpu_dist: {name} got a tensor on {tensor.device}; all tensors must be on tpu")


def _op_name(collective: str, reduce_op: Any, dtype: torch.dtype) -> str:
    kind = reduce_op.op() if hasattr(reduce_op, "op") else reduce_op
    kind = dist.ReduceOp.RedOpType(kind) if isinstance(kind, int) else kind
    if kind not in _OPS:
        raise NotImplementedError(f"tpu_dist: {collective} does not support ReduceOp.{kind.name} yet")
    op = _OPS[kind]
    floating = dtype.is_floating_point or dtype.is_complex
    if op in _BITWISE and floating:
        raise RuntimeError(
            f"tpu_dist: {collective} with ReduceOp.{kind.name} needs an integer or bool dtype, got {dtype}"
        )
    if op == "avg" and not floating:
        raise RuntimeError(f"tpu_dist: {collective} with ReduceOp.AVG needs a floating dtype, got {dtype}")
    if op in ("max", "min") and dtype.is_complex:
        raise RuntimeError(f"tpu_dist: {collective} with ReduceOp.{kind.name} is not defined for {dtype}")
    return _BOOL_OPS[op] if dtype == torch.bool else op


def _reduced(collective: str, kind: str, ranks: tuple[int, ...], tensor: torch.Tensor, reduce_op: Any) -> jax.Array:
    op = _op_name(collective, reduce_op, tensor.dtype)
    local = _read(tensor)
    if tensor.dtype == torch.bool:
        return collectives.run(kind, ranks, local.astype(jnp.uint8), op).astype(jnp.bool_)
    return collectives.run(kind, ranks, local, op)


def allreduce_(tensors, process_group, reduce_op, sparse_indices, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("all_reduce", tensors)
    ranks = _ranks(process_group)
    for tensor in tensors:
        storage.write(tensor, _reduced("all_reduce", "all_reduce", ranks, tensor, reduce_op))
    return tensors, _done(tensors)


def allreduce_coalesced_(tensors, process_group, reduce_op, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    allreduce_(tensors, process_group, reduce_op, None)
    return _done(tensors)


def broadcast_(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("broadcast", tensors)
    ranks = _ranks(process_group)
    for tensor in tensors:
        local = _read(tensor)
        if tensor.dtype == torch.bool:
            local = local.astype(jnp.uint8)
        storage.write(tensor, collectives.run("broadcast", ranks, local, root=root_rank).astype(local.dtype))
    return tensors, _done(tensors)


def _gathered(ranks: tuple[int, ...], tensor: torch.Tensor) -> jax.Array:
    return collectives.run("all_gather", ranks, _read(tensor))


def allgather_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("all_gather", [*input_tensors, *(t for outputs in output_tensors for t in outputs)])
    ranks = _ranks(process_group)
    for outputs, tensor in zip(output_tensors, input_tensors, strict=True):
        if len(outputs) != len(ranks):
            raise ValueError(f"tpu_dist: all_gather needs {len(ranks)} output tensors, got {len(outputs)}")
        gathered = _gathered(ranks, tensor)
        for index, output in enumerate(outputs):
            storage.write(output, gathered[index])
    return output_tensors, _done(output_tensors)


def _allgather_base_(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("all_gather_into_tensor", [output_tensor, input_tensor])
    ranks = _ranks(process_group)
    if output_tensor.numel() != input_tensor.numel() * len(ranks):
        raise ValueError(
            f"tpu_dist: all_gather_into_tensor output has {output_tensor.numel()} elements; expected "
            f"{len(ranks)} x {input_tensor.numel()}"
        )
    gathered = _gathered(ranks, input_tensor)
    storage.write(output_tensor, gathered.reshape(tuple(output_tensor.shape)))
    return output_tensor, _done(output_tensor)


def allgather_into_tensor_coalesced_(outputs, inputs, process_group, async_op=True):  # noqa: ANN001, ANN201
    for output, tensor in zip(outputs, inputs, strict=True):
        _allgather_base_(output, tensor, process_group)
    return _done(outputs)


def _reduce_scatter_flat(ranks, output, whole, reduce_op, collective):  # noqa: ANN001, ANN202
    """Reduce `whole` (a tensor of len(ranks) x output's elements) and write this rank's part into `output`."""
    if whole.numel() != output.numel() * len(ranks):
        raise ValueError(
            f"tpu_dist: {collective} input has {whole.numel()} elements; expected {len(ranks)} x {output.numel()}"
        )
    result = _reduced(collective, "reduce_scatter", ranks, whole.reshape(len(ranks), -1), reduce_op)
    storage.write(output, result.reshape(tuple(output.shape)))


def _reduce_scatter_base_(output_tensor, input_tensor, process_group, reduce_op, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("reduce_scatter_tensor", [output_tensor, input_tensor])
    _reduce_scatter_flat(_ranks(process_group), output_tensor, input_tensor, reduce_op, "reduce_scatter_tensor")
    return output_tensor, _done(output_tensor)


def reduce_scatter_tensor_coalesced_(outputs, inputs, process_group, reduce_op, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    for output, tensor in zip(outputs, inputs, strict=True):
        _reduce_scatter_base_(output, tensor, process_group, reduce_op)
    return _done(outputs)


def reduce_scatter_(output_tensors, input_tensors, process_group, reduce_op, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    ranks = _ranks(process_group)
    for output, inputs in zip(output_tensors, input_tensors, strict=True):
        _check_tpu("reduce_scatter", [output, *inputs])
        if len(inputs) != len(ranks):
            raise ValueError(f"tpu_dist: reduce_scatter needs {len(ranks)} input tensors, got {len(inputs)}")
        whole = torch.stack([tensor.reshape(-1) for tensor in inputs])
        _reduce_scatter_flat(ranks, output, whole, reduce_op, "reduce_scatter")
    return output_tensors, _done(output_tensors)


_KERNELS = (
    allreduce_,
    allreduce_coalesced_,
    broadcast_,
    allgather_,
    _allgather_base_,
    allgather_into_tensor_coalesced_,
    _reduce_scatter_base_,
    reduce_scatter_tensor_coalesced_,
    reduce_scatter_,
)
_library: torch.library.Library | None = None


def install() -> None:
    """Replace torch's PrivateUse1 kernels of these `c10d` ops with ours, once per process."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": torch's, on purpose
        warnings.filterwarnings("ignore", "Warning only once for all operators")
        for kernel in _KERNELS:
            library.impl(kernel.__name__, kernel, "PrivateUse1")
    _library = library
