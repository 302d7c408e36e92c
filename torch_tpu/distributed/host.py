"""Eager all_reduce and broadcast on the XLA CPU platform: the group's gloo backend on the device buffers as host
memory, as torch's gloo runs on CPU tensors (XLA:CPU's collective program is 2-4x slower on the same data).

A one-element all_reduce or broadcast travels in the mismatch check's carrier (`handshake.Carrier`), a SUM (and
AVG, and a broadcast: the root's bytes summed with zeros) in the check's own exchange, one round trip: its value
widened to float64 or int64 (exact), reduced by gloo, and rounded back to the
dtype through float32 as CPU PyTorch computes 16-bit floats; where two ranks combine, one operation rounded
(twice, innocuously: float64 holds more than twice float32's digits) equals the dtype's own arithmetic bit for
bit; over more ranks, gloo's order of float additions, as for large tensors. (Floating MAX and MIN do not go
this way: gloo's do not propagate NaN as PyTorch's do.)

On the CPU platform a rank's jax.Array is host memory: DLPack hands it to torch as a CPU tensor without a copy.
When the tensor is its storage's whole buffer and nothing else holds the array, the array is donated to a no-op
program (which waits for any computation still reading it and hands the same memory back as an array the storage
alone owns) and gloo works on it in place: no copy. Otherwise (a view, an array shared with another tensor or a
cache) gloo works on a copy, which becomes the storage's new array (DLPack again, no copy). A small collective's
result is computed here, in rank order, from every rank's data (`handshake.gather`), and, like a one-element
one, becomes a new array (`store`): a copy of a few bytes is cheaper than the donation. Only
eager goes this way: compiled graphs keep XLA's collectives.
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import numpy as np
import torch
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceOp

from torch_tpu.distributed import handshake
from torch_tpu.runtime import compat, deferred, dtypes, mapping, platform, storage

# What ProcessGroupGloo reduces (bool travels as uint8).
DTYPES = frozenset(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64)
)
_GLOO_OPS = {
    "sum": ReduceOp.SUM,
    "avg": ReduceOp.SUM,
    "premul_sum": ReduceOp.SUM,
    "max": ReduceOp.MAX,
    "min": ReduceOp.MIN,
    "product": ReduceOp.PRODUCT,
    "band": ReduceOp.BAND,
    "bor": ReduceOp.BOR,
    "bxor": ReduceOp.BXOR,
}
_FOLDS = {
    "sum": np.add,
    "avg": np.add,
    "premul_sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "product": np.multiply,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}
_take = jax.jit(lambda array: array, donate_argnums=0)


def _options(op: ReduceOp) -> AllreduceOptions:
    options = AllreduceOptions()
    options.reduceOp = op
    return options


# The carrier's reduction for each op (bool's ops arrive as max, min and bxor: `collectives.BOOL_OPS`).
_CARRIER_OPTIONS = {op: _options(gloo_op) for op, gloo_op in _GLOO_OPS.items()}


@functools.cache
def available() -> bool:
    """Whether the device buffers are host memory (the XLA CPU platform; TORCH_TPU_DIST_HOST=0 keeps XLA's
    collective programs there too)."""
    return platform.platform() == "cpu" and os.environ.get("TORCH_TPU_DIST_HOST", "1") != "0"


def supports(dtype: torch.dtype) -> bool:
    return dtype in DTYPES or dtype == torch.bool


def _carrier(host: torch.Tensor) -> torch.Tensor:
    return host.view(torch.uint8) if host.dtype == torch.bool else host


def data(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's value as bytes: a copy, as a view of the device buffer would keep its array from `claim`."""
    array = deferred.concrete(storage.value(tensor.detach()))
    return np.asarray(array).reshape(-1).view(np.uint8).copy()


def claim(tensor: torch.Tensor) -> jax.Array | None:
    """Take `tensor`'s array for writing in place, when its memory is the storage's alone (None otherwise): it
    is donated to a no-op program, which waits for any computation still reading it and hands the same memory
    back as the storage's new array. Asynchronous: the caller's exchange with the other ranks overlaps it."""
    buffer = storage.buffer_of(tensor)
    if (
        mapping.classify(tensor, buffer, tensor.shape, tensor.dtype)[0] not in (mapping.WHOLE, mapping.RESHAPE)
        or tensor.is_conj()
        or tensor.is_neg()
        or not isinstance(buffer._array, jax.Array)
        or sys.getrefcount(buffer._array) > 2  # the buffer's own reference and this call's argument
    ):
        return None
    buffer._array = owned = _take(buffer._array)
    return owned


def to_array(result: np.ndarray) -> jax.Array:
    """A new device array of `result`'s value (a private copy: on the CPU platform the array may alias it)."""
    return compat.put_copy(result, platform.device())


def _memory(owned: jax.Array, tensor: torch.Tensor) -> torch.Tensor:
    owned.block_until_ready()
    return torch.from_dlpack(owned).view(tensor.shape)


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    array = deferred.concrete(storage.value(tensor.detach()))
    array.block_until_ready()
    return torch.from_dlpack(array).clone()


def _finish(host: torch.Tensor, op: str, size: int) -> None:
    if op == "avg":
        host.div_(size)


def all_reduce(
    tensor: torch.Tensor, owned: jax.Array | None, gloo: object, op: str, factor: float | None, write: bool
) -> None:
    """Reduce `tensor` across the group with gloo, in `owned` (`claim`) if not None; `write=False` (reduce on a
    non-root) leaves the tensor unchanged."""
    in_place = owned is not None
    host = _memory(owned, tensor) if in_place else _copy(tensor)
    work = _carrier(host)
    if op == "premul_sum":
        work.mul_(factor)
    options = AllreduceOptions()
    options.reduceOp = _GLOO_OPS[op]
    gloo.allreduce([work], options).wait()
    _finish(work, op, gloo.size())
    if write and not in_place:
        storage.write(tensor, jax.dlpack.from_dlpack(host))


def broadcast(tensor: torch.Tensor, owned: jax.Array | None, gloo: object, root: int) -> None:
    """Group rank `root`'s `tensor` into every rank's, bit for bit (in `owned` if not None)."""
    in_place = owned is not None
    host = _memory(owned, tensor) if in_place else _copy(tensor)
    options = BroadcastOptions()
    options.rootRank = root
    gloo.broadcast([host.reshape(-1).view(torch.uint8)], options).wait()
    if not in_place:
        storage.write(tensor, jax.dlpack.from_dlpack(host))


def carrier_options(op: str) -> AllreduceOptions:
    """The carrier's reduction for `op` (a kernel's op name)."""
    return _CARRIER_OPTIONS[op]


def in_carrier(tensor: torch.Tensor, op: str) -> bool:
    """Whether this all_reduce of `tensor` travels in the check's carrier (a rule of the call alone, never of
    the data: every rank making the call decides alike)."""
    return tensor.numel() == 1 and not (tensor.dtype.is_floating_point and op in ("max", "min"))


def carrier(tensor: torch.Tensor, op: str, factor: float | None) -> handshake.Carrier:
    """This rank's one-element `tensor`, premultiplied by PREMUL_SUM's factor, widened into a carrier."""
    value = _rows(data(tensor)[None], tensor)[0]
    if op == "premul_sum":
        compute = dtypes.compute_dtype(value.dtype)
        with np.errstate(over="ignore"):
            value = (value.astype(compute) * compute.type(factor)).astype(value.dtype)
    carried = handshake.Carrier(torch.float64 if tensor.dtype.is_floating_point else torch.int64, _CARRIER_OPTIONS[op])
    carried.pair[1] = value[0]  # widened exactly: float64 and int64 hold every value of the dtypes
    return carried


def from_carrier(tensor: torch.Tensor, carried: handshake.Carrier, op: str, size: int) -> None:
    """Write the carrier's reduction, rounded back to the dtype, into `tensor`."""
    wide = carried.pair[1:]
    if tensor.dtype == torch.bool:
        store(tensor, (wide != 0).view(np.uint8))
        return
    dtype = np.dtype(dtypes.to_jax(tensor.dtype))
    store(tensor, rounded(wide, dtype, dtypes.compute_dtype(dtype), op, size))


def rounded(wide: np.ndarray, dtype: np.dtype, compute: np.dtype, op: str, size: int) -> np.ndarray:
    """A carrier's reduction `wide` (float64 or int64) rounded back to `dtype` (`compute`: `dtypes.compute_dtype`), the
    average divided by the group's `size` in the dtype, as PyTorch divides."""
    with np.errstate(over="ignore"):  # overflow to inf, as PyTorch's casts, without NumPy's warning
        result = wide.astype(compute).astype(dtype)
        if op == "avg":
            result = (result.astype(compute) / compute.type(size)).astype(dtype)
    return result


def broadcast_carrier(tensor: torch.Tensor, root: bool) -> handshake.Carrier:
    """A one-element broadcast as a carrier: the root's bytes, zeros elsewhere, summed as int64 (in the check's
    exchange: one round trip)."""
    carried = handshake.Carrier(torch.int64, _CARRIER_OPTIONS["sum"])
    if root:
        value = data(tensor)
        carried.pair[1:].view(np.uint8)[: value.size] = value
    return carried


def from_broadcast_carrier(tensor: torch.Tensor, carried: handshake.Carrier) -> None:
    store(tensor, _rows(carried.pair[1:].view(np.uint8)[None, : tensor.element_size()], tensor)[0])


def _rows(rows: np.ndarray, tensor: torch.Tensor) -> np.ndarray:
    return rows.view(np.uint8 if tensor.dtype == torch.bool else dtypes.to_jax(tensor.dtype))


def store(tensor: torch.Tensor, result: np.ndarray) -> None:
    """Write `result` (the tensor's dtype, bool as uint8, at most `handshake.INLINE` bytes) into `tensor` as a
    new array: a copy this small costs less than claiming the old array (`claim`: a donation program, which
    wakes a JAX worker thread) to write it in place."""
    if tensor.dtype == torch.bool:
        result = result.view(np.bool_)
    storage.write(tensor, to_array(result.reshape(tuple(tensor.shape))))


def reduce_rows(tensor: torch.Tensor, rows: np.ndarray, op: str, factor: float) -> None:
    """Write into `tensor` the reduction, in group-rank order, of every rank's data gathered in `rows`: NumPy's
    arithmetic, which rounds as CPU PyTorch's does (16-bit floats in float32 where PyTorch computes so)."""
    values = _rows(rows, tensor)
    if op == "premul_sum":
        compute = np.dtype(np.float32) if values.dtype.itemsize == 2 else values.dtype
        values = (values.astype(compute) * compute.type(factor)).astype(values.dtype)
    fold = _FOLDS[op]
    result = values[0]
    with np.errstate(all="ignore"):  # overflow to inf, as PyTorch's arithmetic, without NumPy's warning
        for value in values[1:]:
            result = fold(result, value)
    if op == "avg":
        result = np.true_divide(result, len(values)).astype(values.dtype)
    store(tensor, result)
