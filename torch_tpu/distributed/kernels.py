"""PrivateUse1 kernels for torch's `c10d::*` ops: what every collective on tpu tensors reaches.

`dist.all_reduce(t)` (and DDP's reducer, DTensor, funcol) dispatch `c10d::allreduce_` on the tensors' device;
torch's own PrivateUse1 kernel would hand them to the group's C++ backend (gloo, which cannot read a tpu
storage), so these replace it. Each first checks that every rank makes the same call (`handshake`), then runs
the collective -- on the XLA CPU platform all_reduce and broadcast go to gloo on the device buffers as host
memory (`host`), everything else is an XLA program over the group's devices (`collectives`) -- and writes the
results into the output tensors in place (views and their bases too), returning a completed Work.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist

from torch_tpu import metrics
from torch_tpu.distributed import collectives, fast, handshake, host, watchdog
from torch_tpu.eager import fused
from torch_tpu.runtime import compat, storage

_RedOpType = dist.ReduceOp.RedOpType
_OPS = {**fast.RED_OP_NAMES, _RedOpType.PREMUL_SUM: "premul_sum"}
_BITWISE = ("band", "bor", "bxor")
# PREMUL_SUM's factor, for the call in progress on this thread (see `_keeping_premul_factor`).
_premul = threading.local()


def _state(process_group: Any) -> handshake.Group:
    return handshake.group(dist.ProcessGroup.unbox(process_group))


def _ranks(process_group: Any) -> tuple[int, ...]:
    return _state(process_group).ranks


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def _check(
    state: handshake.Group, description: str, tensors: list[torch.Tensor], carrier: handshake.Carrier | None = None
) -> None:
    """Return once every rank of the group makes this call, `carrier` exchanged beside the check (alone when the
    check is off).

    With TORCH_DISTRIBUTED_DEBUG=DETAIL the description also lists every tensor of the call (`tensors`: those
    whose shapes must agree across ranks) and the group's ranks.
    """
    if not handshake.enabled:
        if carrier is not None:
            handshake.carry(state, carrier, description)
        return
    if handshake.detail():
        description += f" | tensors {', '.join(map(_describe, tensors))} | ranks {list(state.ranks)}"
    handshake.agree(state, description, carrier)


def _done(result: Any) -> Any:
    """A completed Work whose future holds the call's outputs as one list of tensors, as gloo's and NCCL's do."""
    if isinstance(result, torch.Tensor):
        values = [result]
    else:
        values = [tensor for item in result for tensor in (item if isinstance(item, (list, tuple)) else [item])]
    future = torch.futures.Future()
    future.set_result(values)
    return compat.create_work_from_future(future).boxed()


def _read(tensor: torch.Tensor) -> jax.Array:
    return fused.concrete(storage.value(tensor.detach()))


def _check_tpu(name: str, tensors: list[torch.Tensor]) -> None:
    for tensor in tensors:
        if tensor.device.type != "tpu":
            raise RuntimeError(f"tpu_dist: {name} got a tensor on {tensor.device}; all tensors must be on tpu")


def _red_op_type(reduce_op: Any) -> _RedOpType:
    if isinstance(reduce_op, _RedOpType):
        return reduce_op
    try:
        kind = reduce_op.op()
    except AttributeError:  # an int
        kind = reduce_op
    return _RedOpType(kind) if isinstance(kind, int) else kind


def _op_text(collective: str, reduce_op: Any) -> tuple[str, float | None]:
    """How the call's op is described to the other ranks, and PREMUL_SUM's factor."""
    kind = _red_op_type(reduce_op)
    if kind != _RedOpType.PREMUL_SUM:
        return kind.name, None
    factor = getattr(_premul, "factor", None)
    if factor is None:
        raise RuntimeError(
            f"tpu_dist: {collective} with ReduceOp.PREMUL_SUM got no factor (make the op with "
            "dist._make_nccl_premul_sum(factor) and call it through torch.distributed)"
        )
    return f"PREMUL_SUM({factor!r})", factor


def _op_name(collective: str, reduce_op: Any, dtype: torch.dtype) -> str:
    kind = _red_op_type(reduce_op)
    if kind not in _OPS:
        raise NotImplementedError(f"tpu_dist: {collective} does not support ReduceOp.{kind.name} yet")
    op = _OPS[kind]
    floating = dtype.is_floating_point or dtype.is_complex
    if op in _BITWISE and floating:
        raise RuntimeError(
            f"tpu_dist: {collective} with ReduceOp.{kind.name} needs an integer or bool dtype, got {dtype}"
        )
    if op in ("avg", "premul_sum") and not floating:
        raise RuntimeError(f"tpu_dist: {collective} with ReduceOp.{kind.name} needs a floating dtype, got {dtype}")
    if op in ("max", "min") and dtype.is_complex:
        raise RuntimeError(f"tpu_dist: {collective} with ReduceOp.{kind.name} is not defined for {dtype}")
    return collectives.BOOL_OPS[op] if dtype == torch.bool else op


def _premultiplied(local: jax.Array, factor: float) -> jax.Array:
    """`local * factor` rounded as CPU PyTorch does: 16-bit floats compute in float32, the factor is not rounded
    to the tensor's dtype first."""
    compute = jnp.float32 if local.dtype.itemsize == 2 else local.dtype
    return (local.astype(compute) * np.asarray(factor, compute)).astype(local.dtype)


def _reduced(collective: str, kind: str, ranks: tuple[int, ...], tensor: torch.Tensor, reduce_op: Any) -> jax.Array:
    op = _op_name(collective, reduce_op, tensor.dtype)
    local = _read(tensor)
    if op == "premul_sum":
        local, op = _premultiplied(local, _op_text(collective, reduce_op)[1]), "sum"
    if tensor.dtype == torch.bool:
        return collectives.run(kind, ranks, local.astype(jnp.uint8), op).astype(jnp.bool_)
    return collectives.run(kind, ranks, local, op)


def _all_reduce(collective: str, state: handshake.Group, tensor: torch.Tensor, reduce_op: Any, root: int = -1) -> None:
    """all_reduce of `tensor` in place; with a group rank `root` (reduce), only the root's tensor is written."""
    reduce_op = _red_op_type(reduce_op)  # once: a boxed ReduceOp's kind is a TorchScript call
    text, factor = _op_text(collective, reduce_op)
    op = _op_name(collective, reduce_op, tensor.dtype)
    target = f" to rank {state.ranks[root]}" if root >= 0 else ""
    description = f"{collective} {_describe(tensor)} {text}{target}"
    write = root < 0 or state.rank == root
    if not (host.available() and host.supports(tensor.dtype)):
        _check(state, description, [tensor])
        result = _reduced(collective, "all_reduce", state.ranks, tensor, reduce_op)
        if write:
            storage.write(tensor, result)
        return
    if host.in_carrier(tensor, op):  # one round trip: the value rides beside the check
        carrier = host.carrier(tensor, op, factor)
        _check(state, description, [tensor], carrier)
        if write:
            host.from_carrier(tensor, carrier, op, len(state.ranks))
        return
    small = handshake.enabled and tensor.numel() * tensor.element_size() <= handshake.INLINE
    data = host.data(tensor) if small else None
    owned = host.claim(tensor) if write and data is None else None
    _check(state, description, [tensor])
    if data is not None:  # computed here in rank order from every rank's data
        rows = handshake.gather(state, description, data)
        if write:
            host.reduce_rows(tensor, rows, op, factor)
    else:
        host.all_reduce(tensor, owned, state.gloo, op, factor, write)


def allreduce_(tensors, process_group, reduce_op, sparse_indices, async_op=True, timeout=-1):
    _check_tpu("all_reduce", tensors)
    state = _state(process_group)
    for tensor in tensors:
        _all_reduce("all_reduce", state, tensor, reduce_op)
    return tensors, _done(tensors)


def allreduce_coalesced_(tensors, process_group, reduce_op, async_op=True, timeout=-1):
    allreduce_(tensors, process_group, reduce_op, None)
    return _done(tensors)


def broadcast_(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    _check_tpu("broadcast", tensors)
    state = _state(process_group)
    for tensor in tensors:
        description = f"broadcast {_describe(tensor)} from rank {state.ranks[root_rank]}"
        if not (host.available() and host.supports(tensor.dtype)):
            _check(state, description, [tensor])
            local = _read(tensor)
            if tensor.dtype == torch.bool:
                local = local.astype(jnp.uint8)
            storage.write(tensor, collectives.run("broadcast", state.ranks, local, root=root_rank).astype(local.dtype))
        elif tensor.numel() == 1:  # one round trip: the root's value rides beside the check
            carrier = host.broadcast_carrier(tensor, state.rank == root_rank)
            _check(state, description, [tensor], carrier)
            host.from_broadcast_carrier(tensor, carrier)
        else:
            owned = host.claim(tensor)
            _check(state, description, [tensor])
            host.broadcast(tensor, owned, state.gloo, root_rank)
    return tensors, _done(tensors)


def _gathered(ranks: tuple[int, ...], tensor: torch.Tensor) -> jax.Array:
    return collectives.run("all_gather", ranks, _read(tensor))


def allgather_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    _check_tpu("all_gather", [*input_tensors, *(t for outputs in output_tensors for t in outputs)])
    state = _state(process_group)
    ranks = state.ranks
    for outputs, tensor in zip(output_tensors, input_tensors, strict=True):
        _check(state, f"all_gather {_describe(tensor)} into {len(outputs)} tensors", [tensor, *outputs])
        if len(outputs) != len(ranks):
            raise ValueError(f"tpu_dist: all_gather needs {len(ranks)} output tensors, got {len(outputs)}")
        gathered = _gathered(ranks, tensor)
        for index, output in enumerate(outputs):
            storage.write(output, gathered[index])
    return output_tensors, _done(output_tensors)


def allgather_coalesced_(output_lists, input_list, process_group, async_op=True):
    allgather_(output_lists, input_list, process_group)
    return _done(output_lists)


def _allgather_base_(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):
    _check_tpu("all_gather_into_tensor", [output_tensor, input_tensor])
    state = _state(process_group)
    ranks = state.ranks
    description = f"all_gather_into_tensor {_describe(input_tensor)} into {_describe(output_tensor)}"
    _check(state, description, [output_tensor, input_tensor])
    if output_tensor.numel() != input_tensor.numel() * len(ranks):
        raise ValueError(
            f"tpu_dist: all_gather_into_tensor output has {output_tensor.numel()} elements; expected "
            f"{len(ranks)} x {input_tensor.numel()}"
        )
    gathered = _gathered(ranks, input_tensor)
    storage.write(output_tensor, gathered.reshape(tuple(output_tensor.shape)))
    return output_tensor, _done(output_tensor)


def allgather_into_tensor_coalesced_(outputs, inputs, process_group, async_op=True):
    for output, tensor in zip(outputs, inputs, strict=True):
        _allgather_base_(output, tensor, process_group)
    return _done(outputs)


def _reduce_scatter_flat(state, output, whole, reduce_op, collective, inputs):
    """Reduce `whole` (a tensor of len(ranks) x output's elements) and write this rank's part into `output`."""
    ranks = state.ranks
    what = f"{len(inputs)} x {_describe(inputs[0])}" if collective == "reduce_scatter" else _describe(whole)
    description = f"{collective} {what} into {_describe(output)} {_op_text(collective, reduce_op)[0]}"
    _check(state, description, [output, *inputs])
    if whole.numel() != output.numel() * len(ranks):
        raise ValueError(
            f"tpu_dist: {collective} input has {whole.numel()} elements; expected {len(ranks)} x {output.numel()}"
        )
    result = _reduced(collective, "reduce_scatter", ranks, whole.reshape(len(ranks), -1), reduce_op)
    storage.write(output, result.reshape(tuple(output.shape)))


def _reduce_scatter_base_(output_tensor, input_tensor, process_group, reduce_op, async_op=True, timeout=-1):
    _check_tpu("reduce_scatter_tensor", [output_tensor, input_tensor])
    state = _state(process_group)
    _reduce_scatter_flat(state, output_tensor, input_tensor, reduce_op, "reduce_scatter_tensor", [input_tensor])
    return output_tensor, _done(output_tensor)


def reduce_scatter_tensor_coalesced_(outputs, inputs, process_group, reduce_op, async_op=True, timeout=-1):
    for output, tensor in zip(outputs, inputs, strict=True):
        _reduce_scatter_base_(output, tensor, process_group, reduce_op)
    return _done(outputs)


def reduce_scatter_(output_tensors, input_tensors, process_group, reduce_op, async_op=True, timeout=-1):
    state = _state(process_group)
    for output, inputs in zip(output_tensors, input_tensors, strict=True):
        _check_tpu("reduce_scatter", [output, *inputs])
        if len(inputs) != len(state.ranks):
            raise ValueError(f"tpu_dist: reduce_scatter needs {len(state.ranks)} input tensors, got {len(inputs)}")
        whole = torch.stack([tensor.reshape(-1) for tensor in inputs])
        _reduce_scatter_flat(state, output, whole, reduce_op, "reduce_scatter", inputs)
    return output_tensors, _done(output_tensors)


def _pad_rows(array: jax.Array, splits: list[int], rows: int) -> jax.Array:
    """`array`'s row blocks of `splits` each padded to `rows` rows (an even all-to-all)."""
    blocks, start = [], 0
    for split in splits:
        block = array[start : start + split]
        blocks.append(jnp.pad(block, [(0, rows - split)] + [(0, 0)] * (array.ndim - 1)))
        start += split
    return jnp.concatenate(blocks)


def alltoall_base_(output, input, process_group, output_split_sizes, input_split_sizes, async_op=True, timeout=-1):
    _check_tpu("all_to_all_single", [output, input])
    state = _state(process_group)
    if input_split_sizes or output_split_sizes:  # the ranks' shapes may differ: only dtypes and rows must agree
        rows = f"{str(input.dtype).removeprefix('torch.')} rows of {list(input.shape[1:])} with split sizes"
        _check(state, f"all_to_all_single {rows}", [])
    else:
        _check(state, f"all_to_all_single {_describe(input)} into {_describe(output)}", [output, input])
    _all_to_all_single(state.ranks, output, input, output_split_sizes, input_split_sizes)
    return _done(output)


def _all_to_all_single(ranks, output, input, output_split_sizes, input_split_sizes):
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


def alltoall_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    _check_tpu("all_to_all", [*output_tensors, *input_tensors])
    state = _state(process_group)
    dtype = str(input_tensors[0].dtype).removeprefix("torch.")
    _check(state, f"all_to_all {len(input_tensors)} {dtype} tensors into {len(output_tensors)}", [])
    flat_in = torch.cat([tensor.reshape(-1) for tensor in input_tensors])
    flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype, device="tpu")
    ins, outs = [t.numel() for t in input_tensors], [t.numel() for t in output_tensors]
    _all_to_all_single(state.ranks, flat_out, flat_in, outs, ins)
    for tensor, part in zip(output_tensors, flat_out.split(outs), strict=True):
        storage.write(tensor, _read(part).reshape(tuple(tensor.shape)))
    return output_tensors, _done(output_tensors)


def reduce_(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    _check_tpu("reduce", tensors)
    state = _state(process_group)
    for tensor in tensors:
        _all_reduce("reduce", state, tensor, reduce_op, root=root_rank)
    return _done(tensors)


def gather_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    state = _state(process_group)
    (tensor,) = input_tensors
    _check_tpu("gather", [tensor, *(t for outputs in output_tensors for t in outputs)])
    _check(state, f"gather {_describe(tensor)} to rank {state.ranks[root_rank]}", [tensor])
    gathered = _gathered(state.ranks, tensor)
    if state.rank == root_rank:
        (outputs,) = output_tensors
        for index, output in enumerate(outputs):
            storage.write(output, gathered[index])
    return _done(output_tensors)


def scatter_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    state = _state(process_group)
    ranks = state.ranks
    (output,) = output_tensors
    _check_tpu("scatter", [output, *(t for inputs in input_tensors for t in inputs)])
    _check(state, f"scatter {_describe(output)} from rank {ranks[root_rank]}", [output])
    if state.rank == root_rank:
        local = _read(torch.cat([t.reshape(1, -1) for t in input_tensors[0]]).reshape(-1))
    else:
        local = _read(torch.zeros(len(ranks) * output.numel(), dtype=output.dtype, device="tpu"))
    result = collectives.run("scatter", ranks, local, root=root_rank)
    storage.write(output, result.reshape(tuple(output.shape)))
    return output_tensors, _done(output_tensors)


def _point_to_point(tensor: torch.Tensor, process_group: Any, src: int, dst: int) -> jax.Array:
    """The program both ends run: a two-rank mesh (in global-rank order) that moves src's tensor to dst, flat (as
    gloo and NCCL move a send's elements: the two ends' shapes may differ where dtype and count agree)."""
    state = _state(process_group)
    ranks = state.ranks
    pair = tuple(sorted((ranks[src], ranks[dst])))
    name = "send" if src == state.rank else "recv"
    if handshake.enabled:
        transfer = (
            f"{str(tensor.dtype).removeprefix('torch.')}[{tensor.numel()}] from rank {ranks[src]} to rank {ranks[dst]}"
        )
        handshake.agree_pair(state, dst if name == "send" else src, name, transfer)
    program = functools.partial(collectives.run, "send", pair, root=pair.index(ranks[src]))
    return watchdog.guarded(name, pair, program, _read(tensor).reshape(-1))


def send(tensors, process_group, dst, tag):
    _check_tpu("send", tensors)
    rank = _state(process_group).rank
    for tensor in tensors:
        _point_to_point(tensor, process_group, rank, dst)
    return _done(tensors)


def recv_(tensors, process_group, src, tag):
    _check_tpu("recv", tensors)
    rank = _state(process_group).rank
    for tensor in tensors:
        storage.write(tensor, _point_to_point(tensor, process_group, src, rank).reshape(tuple(tensor.shape)))
    return _done(tensors)


# The collective each kernel is, in the words of torch.distributed's API (what a failure's message names).
_NAMES = {
    "alltoall_base_": "all_to_all_single",
    "alltoall_": "all_to_all",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "broadcast_": "broadcast",
    "allgather_": "all_gather",
    "allgather_coalesced_": "all_gather_coalesced",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "reduce_scatter_": "reduce_scatter",
}


def _watched(kernel: Callable) -> Callable:
    """`kernel` as one collective over its group for the watchdog: every exchange it makes (the check, gloo on
    host memory, XLA programs) is tracked and its failure explained under the collective's name."""
    if kernel.__name__ not in _NAMES:  # send/recv: tracked over the pair of ranks they involve
        return kernel
    name = _NAMES[kernel.__name__]
    position = list(inspect.signature(kernel).parameters).index("process_group")

    @functools.wraps(kernel)
    def call(*args: Any, **kwargs: Any) -> Any:
        group = args[position] if position < len(args) else kwargs["process_group"]
        return watchdog.guarded(name, _ranks(group), functools.partial(kernel, **kwargs) if kwargs else kernel, *args)

    return call


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.nbytes
    return sum(_nbytes(inner) for inner in value) if isinstance(value, (list, tuple)) else 0


def _counted(kernel: Callable, call: Callable) -> Callable:
    """`call` (the kernel as registered), counting each call of `kernel` and the bytes of its input in
    `torch_tpu.metrics.collectives` (the input: the argument named input..., else the first one)."""
    op = kernel.__name__.strip("_")
    parameters = list(inspect.signature(kernel).parameters)
    position = next((i for i, name in enumerate(parameters) if name.startswith("input")), 0)

    @functools.wraps(call)
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        metrics.collectives[op] += 1
        metrics.collective_bytes[op] += _nbytes(
            args[position] if position < len(args) else kwargs[parameters[position]]
        )
        return result

    return counted


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
    allgather_coalesced_,
    _allgather_base_,
    allgather_into_tensor_coalesced_,
    _reduce_scatter_base_,
    reduce_scatter_tensor_coalesced_,
    reduce_scatter_,
)
# The ProcessGroup methods whose options carry a ReduceOp: allreduce, reduce, reduce_scatter_single, ...
_REDUCING = tuple(name for name in dir(dist.ProcessGroup) if "reduce" in name and not name.startswith("__"))
_library: torch.library.Library | None = None


def _premul_factor(values: Any) -> float | None:
    for value in values:
        op = getattr(value, "reduceOp", value)
        if isinstance(op, dist.ReduceOp) and op.op == _RedOpType.PREMUL_SUM:
            factor = getattr(op, "factor", None)
            if factor is None:
                raise NotImplementedError(
                    f"tpu_dist: ReduceOp.PREMUL_SUM needs torch >= 2.12 (torch {torch.__version__}'s ReduceOp does "
                    "not expose its factor to Python); premultiply the tensor and use ReduceOp.SUM"
                )
            return factor.item() if isinstance(factor, torch.Tensor) else float(factor)
    return None


def _keeping_premul_factor(method: Callable) -> Callable:
    """`method` keeping PREMUL_SUM's factor for the kernels it reaches: the ReduceOp that a `c10d::*` op receives
    exposes its kind to Python but not the factor (`dist._make_nccl_premul_sum(factor)`)."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        factor = _premul_factor((*args, *kwargs.values()))
        if factor is None:
            return method(self, *args, **kwargs)
        _premul.factor = factor
        try:
            return method(self, *args, **kwargs)
        finally:
            _premul.factor = None

    call._tpu_dist = True
    return call


def install() -> None:
    """Replace torch's PrivateUse1 kernels of these `c10d` ops with ours, once per process."""
    global _library
    if _library is not None:
        return
    watchdog.guard_api()
    fast.install()
    for name in _REDUCING:
        method = getattr(dist.ProcessGroup, name)
        if not getattr(method, "_tpu_dist", False):
            setattr(dist.ProcessGroup, name, _keeping_premul_factor(method))
    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": torch's, on purpose
        warnings.filterwarnings("ignore", "Warning only once for all operators")
        for kernel in _KERNELS:
            library.impl(kernel.__name__, _counted(kernel, _watched(kernel)), "PrivateUse1")
    _library = library
