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


def _pad_rows(array: jax.Array, splits: list[int], rows: int) -> jax.Array:
    """`array`'s row blocks of `splits` each padded to `rows` rows (an even all-to-all)."""
    blocks, start = [], 0
    for split in splits:
        block = array[start : start + split]
        blocks.append(jnp.pad(block, [(0, rows - split)] + [(0, 0)] * (array.ndim - 1)))
        start += split
    return jnp.concatenate(blocks)


def alltoall_base_(output, input, process_group, output_split_sizes, input_split_sizes, async_op=True, timeout=-1):  # noqa: A002, ANN001, ANN201
    _check_tpu("all_to_all_single", [output, input])
    ranks = _ranks(process_group)
    size = len(ranks)
    local = _read(input)
    if not input_split_sizes and not output_split_sizes:
        if input.shape[0] % size:
            raise ValueError(f"tpu_dist: all_to_all_single input dim 0 ({input.shape[0]}) is not divisible by {size}")
        result = collectives.run("all_to_all", ranks, local)
    else:
        ins = list(input_split_sizes) or [input.shape[0] // size] * size
        outs = list(output_split_sizes) or [output.shape[0] // size] * size
        if len(ins) != size or len(outs) != size or sum(ins) != input.shape[0] or sum(outs) != output.shape[0]:
            raise ValueError(
                f"tpu_dist: all_to_all_single split sizes {ins} / {outs} do not fit input dim 0 "
                f"{input.shape[0]} / output dim 0 {output.shape[0]} for {size} ranks"
            )
        # Uneven splits: every block padded to the largest split of any rank, agreed on first.
        largest = jnp.asarray(max(ins + outs), jnp.int64)
        rows = int(collectives.run("all_reduce", ranks, jax.device_put(largest, local.devices().pop()), "max"))
        exchanged = collectives.run("all_to_all", ranks, _pad_rows(local, ins, rows))
        result = jnp.concatenate([exchanged[j * rows : j * rows + outs[j]] for j in range(size)])
    storage.write(output, result.reshape(tuple(output.shape)))
    return _done(output)


def alltoall_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("all_to_all", [*output_tensors, *input_tensors])
    flat_in = torch.cat([tensor.reshape(-1) for tensor in input_tensors])
    flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype, device="tpu")
    ins, outs = [t.numel() for t in input_tensors], [t.numel() for t in output_tensors]
    alltoall_base_(flat_out, flat_in, process_group, outs, ins)
    for tensor, part in zip(output_tensors, flat_out.split(outs), strict=True):
        storage.write(tensor, _read(part).reshape(tuple(tensor.shape)))
    return output_tensors, _done(output_tensors)


def _group_rank(ranks: tuple[int, ...]) -> int:
    return ranks.index(dist.get_rank())


def reduce_(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    _check_tpu("reduce", tensors)
    ranks = _ranks(process_group)
    for tensor in tensors:
        result = _reduced("reduce", "all_reduce", ranks, tensor, reduce_op)
        if _group_rank(ranks) == root_rank:
            storage.write(tensor, result)
    return _done(tensors)


def gather_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    ranks = _ranks(process_group)
    (tensor,) = input_tensors
    _check_tpu("gather", [tensor, *(t for outputs in output_tensors for t in outputs)])
    gathered = _gathered(ranks, tensor)
    if _group_rank(ranks) == root_rank:
        (outputs,) = output_tensors
        for index, output in enumerate(outputs):
            storage.write(output, gathered[index])
    return _done(output_tensors)


def scatter_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):  # noqa: ANN001, ANN201
    ranks = _ranks(process_group)
    (output,) = output_tensors
    _check_tpu("scatter", [output, *(t for inputs in input_tensors for t in inputs)])
    if _group_rank(ranks) == root_rank:
        local = _read(torch.cat([t.reshape(1, -1) for t in input_tensors[0]]).reshape(-1))
    else:
        local = _read(torch.zeros(len(ranks) * output.numel(), dtype=output.dtype, device="tpu"))
    result = collectives.run("scatter", ranks, local, root=root_rank)
    storage.write(output, result.reshape(tuple(output.shape)))
    return output_tensors, _done(output_tensors)


def _point_to_point(tensor: torch.Tensor, process_group: Any, src: int, dst: int) -> jax.Array:
    """The program both ends run: a two-rank mesh (in global-rank order) that moves src's tensor to dst."""
    ranks = _ranks(process_group)
    pair = tuple(sorted((ranks[src], ranks[dst])))
    return collectives.run("send", pair, _read(tensor), root=pair.index(ranks[src]))


def send(tensors, process_group, dst, tag):  # noqa: ANN001, ANN201
    _check_tpu("send", tensors)
    ranks = _ranks(process_group)
    for tensor in tensors:
        _point_to_point(tensor, process_group, _group_rank(ranks), dst)
    return _done(tensors)


def recv_(tensors, process_group, src, tag):  # noqa: ANN001, ANN201
    _check_tpu("recv", tensors)
    ranks = _ranks(process_group)
    for tensor in tensors:
        storage.write(tensor, _point_to_point(tensor, process_group, src, _group_rank(ranks)))
    return _done(tensors)


_KERNELS = (
    alltoall_base_,
    alltoall_,
    reduce_,
    gather_,
    scatter_,
    send,
    recv_,
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
