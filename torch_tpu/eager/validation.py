"""The checks CPU PyTorch makes of a call that the dispatcher must make alike: memory overlap of what an op
writes with what it reads, `out=` dtypes, and, for a call that fails, CPU's own exception.

Each costs the hot path almost nothing: the overlap checks compare storages by identity and look at layouts
only when an input shares the written tensor's storage (or the written tensor is not contiguous); the `out=`
dtype check runs only when `out`'s dtype differs from the result's, until CPU has allowed the dtype signature
once; CPU is asked for its error only once a call has failed on the `tpu` path, and whether it refuses a written
tensor with internal overlap (an expanded one) only for such a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_map

from torch_tpu.runtime import float64, memory, storage

_INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
    "Please clone() the tensor before performing the operation."
)
_PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory "
    "location. Please clone() the tensor before performing the operation."
)
# Failures of our own that CPU cannot explain better: an op without a lowering, a Debug-mode NaN check, an
# out-of-memory error already converted (`runtime.memory`).
_OURS = (NotImplementedError, FloatingPointError, torch.OutOfMemoryError)


def _dense(tensor: torch.Tensor) -> bool:
    """c10's is_non_overlapping_and_dense: the elements fill a span of memory exactly, in some dim order."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(tensor.shape, tensor.stride(), strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _partially_overlaps(written: torch.Tensor, other: torch.Tensor) -> bool:
    """ATen's get_overlap_status(written, other) == PARTIAL, for tensors of one storage: both dense, their byte
    spans intersecting without being the same elements in the same order. (Not dense is TOO_HARD: allowed.)"""
    if other is written or written.numel() == 0 or other.numel() == 0 or not (_dense(written) and _dense(other)):
        return False
    begin, other_begin = (
        written.storage_offset() * written.element_size(),
        other.storage_offset() * other.element_size(),
    )
    end, other_end = begin + written.nbytes, other_begin + other.nbytes
    if (begin, end) == (other_begin, other_end):
        return written.stride() != other.stride()
    return begin < other_end and other_begin < end


def check_writes(op: OpOverload, written: torch.Tensor, args: tuple, kwargs: dict, outs: dict | None = None) -> None:
    """CPU's overlap checks of `op` writing `written` in the call `op(*args, **kwargs, **outs)` (`written` among
    them; `outs`: the `out=` arguments): internal overlap where CPU refuses it (`_refuses_overlap`), and partial
    overlap with what it reads (TensorIterator's assert_no_partial_overlap, of each output with each input); an op
    writing a tensor it also reads whole is allowed."""
    if not written.is_contiguous() and 0 in written.stride():
        if _refuses_overlap(op, written, args, {**kwargs, **outs} if outs else kwargs):
            raise RuntimeError(_INTERNAL_OVERLAP)
    storage = written.untyped_storage()
    _check_inputs(written, storage, args)
    if kwargs:
        _check_inputs(written, storage, kwargs.values())


def _refuses_overlap(op: OpOverload, written: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Whether CPU refuses `op` writing `written` when more than one of its elements is one memory location (an
    expanded tensor): most ops do (TensorIterator's assert_no_internal_overlap, `copy_`), fills, reductions and
    matmuls do not, and a range first resizes an `out` of another size. CPU is asked, `written` standing in with
    its own layout (the rare path: nothing is cached)."""
    if not any(st == 0 and sz > 1 for sz, st in zip(written.shape, written.stride(), strict=True)):
        return False  # has_internal_overlap == TOO_HARD: CPU allows it

    def stand_in(tensor: torch.Tensor) -> torch.Tensor:
        if tensor is not written:
            return _copy(tensor)
        shape, stride, offset = written.shape, written.stride(), written.storage_offset()
        return torch.zeros(offset + storage.storage_nbytes(shape, stride, 1), dtype=written.dtype).as_strided(
            shape, stride, offset
        )

    error = _cpu_error(op, args, kwargs, stand_in)
    return error is not None and str(error).startswith(_INTERNAL_OVERLAP.partition(".")[0])


def _check_inputs(written: torch.Tensor, storage: torch.UntypedStorage, values: Iterable) -> None:
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.untyped_storage() is storage and _partially_overlaps(written, value):
                raise RuntimeError(_PARTIAL_OVERLAP)
        elif isinstance(value, (list, tuple)):
            _check_inputs(written, storage, value)


def _on_cpu(value: Any, stand_in: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        return stand_in(value)
    if isinstance(value, torch.device) and value.type == "tpu" or isinstance(value, str) and value.startswith("tpu"):
        return torch.device("cpu")
    if isinstance(value, torch.Generator):
        return None
    return value


def _cpu_error(op: OpOverload, args: tuple, kwargs: dict, stand_in: Callable) -> Exception | None:
    """The exception CPU PyTorch raises for `op` on the arguments' `stand_in`s, or None; the CPU RNG is left as
    it was."""
    try:
        cpu_args, cpu_kwargs = tree_map(lambda v: _on_cpu(v, stand_in), (args, kwargs))
    except Exception:  # the arguments cannot be read: nothing to compare with
        return None
    with torch.random.fork_rng(devices=[]):
        try:
            op(*cpu_args, **cpu_kwargs)
        except Exception as error:
            return error
    return None


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy whose storage CPU's kernels can resize, as an `out=` of theirs (`cpu()`'s holds numpy's memory)."""
    return tensor.detach().cpu().clone()


def _deliberate(error: Exception) -> bool:
    """An exception class of torch_tpu's own (e.g. the debug checks' IndexOutOfRangeError): raised on purpose."""
    return type(error).__module__.startswith("torch_tpu.")


def raise_as_cpu(op: OpOverload, args: tuple, kwargs: dict, error: Exception) -> None:
    """For a call that failed with `error` on the `tpu` path: raise what CPU raises for the same call (class and
    message, e.g. RuntimeError or IndexError where a meta kernel or JAX raised a ValueError or TypeError), from
    `error`; return if CPU raises nothing (the caller then re-raises `error`)."""
    if isinstance(error, float64.Unsupported):  # the call may be invalid on any device: CPU's error first
        cpu = _cpu_error(op, args, kwargs, _copy)
        if cpu is not None:
            raise cpu from error
    if isinstance(error, _OURS):
        return
    storage.raise_if_donated((*args, *kwargs.values()))  # an input a jax_op's donation consumed: say so
    if memory.is_oom(error):  # not CPU's business (nor asked: CPU would allocate what the device could not)
        raise memory.out_of_memory(error) from error
    cpu = _cpu_error(op, args, kwargs, _copy)
    if (
        cpu is None
        or isinstance(error, type(cpu))
        and (_deliberate(error) or str(cpu).partition("\n")[0] in str(error))
    ):
        return  # CPU has nothing to say, or `error` already is what CPU raises
    raise cpu from error


def with_cpu_errors(op: OpOverload, kernel: Callable) -> Callable:
    """`kernel`, raising CPU's exception where it fails and CPU fails too (`raise_as_cpu`)."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return kernel(*args, **kwargs)
        except Exception as error:
            raise_as_cpu(op, args, kwargs, error)
            raise

    return checked


def with_out_checks(op: OpOverload, kernel: Callable) -> Callable:
    """`kernel` of a factory's `out=` overload, making CPU's internal-overlap check of `out` first."""

    def checked(*args: Any, out: torch.Tensor, **kwargs: Any) -> Any:
        check_writes(op, out, args, kwargs, {"out": out})
        return kernel(*args, out=out, **kwargs)

    return checked


_out_dtypes_allowed: set = set()
_inplace_dtypes_checked: set = set()


def _describe(value: Any) -> Any:
    """What of an argument CPU's dtype rules read: a tensor's dtype and whether it is 0-dim (type promotion)."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim() == 0)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, (bool, int, float, complex)):
        return type(value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def check_inplace_dtype(
    functional: OpOverload, inplace_op: OpOverload, args: tuple, kwargs: dict, to_meta: Callable[[Any], Any]
) -> None:
    """For an in-place call whose functional result has another dtype than the tensor written (on meta tensors,
    `to_meta` of each argument, once per dtype signature): raise what CPU raises for it (e.g. `int_tensor.div_(2)`:
    "result type Float can't be cast to the desired output type Long"), if anything. Needed where the release's
    meta kernels do not, and for every in-place foreach op (a list written, whose meta kernel returns nothing)."""
    signature = (inplace_op, _describe(args), tuple((n, _describe(v)) for n, v in kwargs.items()))
    if signature in _inplace_dtypes_checked:
        return
    result = functional(*to_meta(args), **{name: to_meta(value) for name, value in kwargs.items()})
    results, written = (result, args[0]) if isinstance(args[0], (list, tuple)) else ([result], [args[0]])
    if any(isinstance(r, torch.Tensor) and r.dtype != w.dtype for r, w in zip(results, written, strict=False)):
        check_out_dtypes(inplace_op, args, kwargs)
    _inplace_dtypes_checked.add(signature)


def check_out_dtypes(out_op: OpOverload, args: tuple, kwargs: dict) -> None:
    """For an `out=` whose dtype differs from the functional result's: raise what CPU raises for the call (e.g.
    "result type Float can't be cast to the desired output type Long"), if anything. CPU runs the call (on
    copies) until it has allowed a dtype signature once; an allowed signature costs nothing after."""
    signature = (out_op, _describe(args), tuple((n, _describe(v)) for n, v in kwargs.items()))
    if signature in _out_dtypes_allowed:
        return
    error = _cpu_error(out_op, args, kwargs, _copy)
    if error is not None:
        try:
            raise error
        finally:
            del error  # no cycle through this frame (see checks.raise_pending)
    _out_dtypes_allowed.add(signature)
