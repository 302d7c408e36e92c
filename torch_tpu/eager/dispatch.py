"""Eager dispatch: unwrap `tpu` tensors -> one cached jitted executable per (op, avals, statics) -> wrap.

Each lowering is traced once per key; PyTorch's meta kernels decide output dtypes (so type promotion is
PyTorch's own) and raise PyTorch's errors for bad input before anything runs on the device.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.lax.lax import _convert_element_type
from torch._ops import OpOverload

from torch_tpu import precision
from torch_tpu import random as tpu_random
from torch_tpu.eager import fused, modes, validation
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.ops.registry import Lowering, mutated_args
from torch_tpu.runtime import checks as device_checks
from torch_tpu.runtime import dtypes, persistent, platform, storage

_TENSOR, _TENSORS, _SCALAR, _SCALARS, _STATIC, _GENERATOR = range(6)
_MATH_BIT_KEYS = (torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative)
_MAX_SCALARS = 4096
# An op gathering more tensors than this into one (a `stack` or `cat` of many) runs on its own in Fused mode:
# XLA:CPU's compile time for a concatenation fused into its consumer grows superlinearly with the operands
# (stack + sum of 1500 vectors: 6.0 s against 1.4 s for the stack alone; 0.19 against 0.12 s at 256).
_MAX_FUSED_INPUTS = 256
_TENSOR_LIST_TYPES = ("Tensor[]", "Tensor?[]", "List[Tensor]", "List[Optional[Tensor]]")


class _Leaf:
    """A placeholder for the i-th run-time input of a traced lowering; `view` is the (shape, stride) through which
    the input, a buffer's whole array, is read (`storage.view_of`), or None, with its storage offset the run-time
    input after it when `offset` (else 0); `count` is set when the input packs a list of that many Python numbers
    into one array (`_packed`)."""

    __slots__ = ("index", "view", "offset", "count")

    def __init__(self, index: int, view: tuple | None = None, offset: bool = False, count: int | None = None) -> None:
        self.index = index
        self.view = view
        self.offset = offset
        self.count = count


def _packed(values: list) -> type | None:
    """The type of a list of Python numbers that travels as one array — all floats, or all ints within int64 (a
    foreach op's per-step scalars: one transfer instead of one per tensor) — else None (each its own input)."""
    if not values:
        return None
    kind = type(values[0])
    if kind is float and all(type(v) is float for v in values):
        return float
    if kind is int and all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
        return int
    return None


def _whole(value: torch.Tensor, buffer: Any, math_bits: bool) -> bool:
    """Whether a `tpu` tensor is its buffer's whole array as it is, so that the array is its input.

    The buffer's array fills its storage and PyTorch keeps every view within the storage, so a contiguous
    tensor of the array's shape and dtype is the whole storage: its offset is 0. (Dtypes are compared by
    identity; a false negative only takes the general encoding.)"""
    return (
        buffer.shape == value.shape
        and buffer.dtype is _JAX_DTYPE[value.dtype]
        and value.is_contiguous()
        and not (math_bits and (value.is_conj() or value.is_neg()))
    )


def _whole_array(value: Any, math_bits: bool) -> Any:
    """The array of a `tpu` tensor's written buffer when the tensor is that whole array as it is (`_whole`), else
    None (a view, an unwritten buffer, a CPU tensor, None)."""
    try:
        buffer = value.untyped_storage()._tpu_buffer
    except AttributeError:
        return None
    array = buffer._array
    return array if array is not None and _whole(value, buffer, math_bits) else None


def _kind(argument: torch._C.Argument, static: frozenset[str], scalars: frozenset[str] = frozenset()) -> int:
    text = str(argument.type)
    if argument.name == "scalars" or text == "List[number]" and argument.name not in static:
        return _SCALARS  # foreach ops' per-tensor scalars (a step's values; a host tensor of them, as on CUDA)
    if text in ("Tensor", "Optional[Tensor]"):
        return _TENSOR
    if text in _TENSOR_LIST_TYPES:
        return _TENSORS
    if text in ("number", "Optional[number]") and argument.name not in static or argument.name in scalars:
        return _SCALAR
    if "Generator" in text:
        return _GENERATOR
    return _STATIC


def _device_mismatch(op: OpOverload, tensor: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and "
        f"{tensor.device}! (when checking argument for {op})"
    )


class Runner:
    """Runs one functional lowering for tensors of any shape, caching an executable per signature."""

    def __init__(self, lowering: Lowering, dispatched: OpOverload | None = None) -> None:
        self.lowering = lowering
        self.op = lowering.op
        arguments = self.op._schema.arguments
        self.positional = [_kind(a, lowering.static, lowering.scalars) for a in arguments if not a.kwarg_only]
        self.keyword = {a.name: _kind(a, lowering.static, lowering.scalars) for a in arguments if a.kwarg_only}
        # PyTorch's Conjugate and Negative fallbacks materialise conjugate and negative views before an op
        # reaches its backend kernel, unless the op has a kernel of its own for those keys (views, copies, mm):
        # only then can our kernel (for `dispatched`, the overload it is registered for) see the bits set.
        name = (dispatched or self.op).name()
        self.math_bits = any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in _MATH_BIT_KEYS)
        # `inputs` encodes the schema's leading tensors and numbers inline
        self.prefix = len(list(itertools.takewhile(lambda kind: kind in (_TENSOR, _SCALAR), self.positional)))

    def _encode(self, op: OpOverload, value: Any, kind: int, leaves: list, key: list) -> None:
        """Append `value`'s run-time inputs to `leaves` and its part of the cache key to `key`."""
        if kind == _TENSOR or kind == _TENSORS and isinstance(value, torch.Tensor):
            if isinstance(value, torch.Tensor):
                if value.is_cpu:
                    if value.dim() != 0 and kind == _TENSOR:
                        raise _device_mismatch(op, value)
                    key.append("host")
                    leaves.append(_host_scalar(value) if value.dim() == 0 else storage.to_device(value))
                elif (array := _whole_array(value, self.math_bits)) is not None:
                    leaves.append(array)
                else:
                    buffer = storage.buffer_of(value)
                    if buffer._array is None:  # written (zeros) first, so that `_template` decides alike
                        storage.read(value)
                    if (view := storage.view_of(value, buffer)) is not None:
                        shape, stride, offset = view  # the offset is a run-time input: one program per layout
                        key.append((shape, stride, offset == 0))
                        leaves.append(buffer._array)
                        if offset:
                            leaves.append(_device_scalar(offset) if self.lowering.jit else offset)
                    else:
                        leaves.append(storage.value(value))
                key.append(value.shape)
                key.append(value.dtype)
            elif value is None:
                key.append(None)
            else:  # a wrapped number arrives as a Python scalar
                key.append(type(value))
                leaves.append(_device_scalar(value) if self.lowering.jit else value)
        elif kind == _TENSORS:  # in a list (e.g. indices), CPU tensors are accepted and moved, as on CUDA
            for v in value:
                array = _whole_array(v, self.math_bits)
                if array is None:
                    self._encode(op, v, _TENSORS if isinstance(v, torch.Tensor) else _TENSOR, leaves, key)
                else:  # a foreach op's list, mostly whole buffers: `_encode`'s whole-buffer case, without the call
                    leaves.append(array)
                    key.append(v.shape)
                    key.append(v.dtype)
        elif kind == _SCALAR and value is not None:
            key.append(type(value))
            leaves.append(_device_scalar(value) if self.lowering.jit else value)
        elif kind == _SCALARS:
            values = value.tolist() if isinstance(value, torch.Tensor) else value
            packed = _packed(values) if self.lowering.jit else None
            if packed is None:
                for v in values:
                    self._encode(op, v, _SCALAR, leaves, key)
            else:
                key.append((packed, len(values)))
                leaves.append(np.array(values, np.float64 if packed is float else np.int64))
        elif kind != _GENERATOR:
            key.append(tuple(value) if isinstance(value, list) else value)

    def _template(self, value: Any, kind: int, count: list[int]) -> Any:
        """`value` with each run-time input replaced by its `_Leaf` (the same walk as `_encode`)."""
        if kind == _TENSOR or kind == _TENSORS and isinstance(value, torch.Tensor):
            if value is None:
                return None
            index = count[0]
            count[0] += 1
            view = None
            if isinstance(value, torch.Tensor) and not value.is_cpu:
                view = storage.view_of(value, storage.buffer_of(value))
            if view is None:
                return _Leaf(index)
            count[0] += bool(view[2])  # its offset, the next input
            return _Leaf(index, (tuple(value.shape), view[1]), offset=bool(view[2]))
        if kind == _TENSORS:
            return [self._template(v, _TENSOR, count) for v in value]
        if kind == _SCALAR and value is not None:
            count[0] += 1
            return _Leaf(count[0] - 1)
        if kind == _SCALARS:
            values = value.tolist() if isinstance(value, torch.Tensor) else value
            if self.lowering.jit and _packed(values) is not None:
                count[0] += 1
                return _Leaf(count[0] - 1, count=len(values))
            return [self._template(v, _SCALAR, count) for v in values]
        return None if kind == _GENERATOR else value

    def inputs(self, meta_op: OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        """The cache key of a call (op, shapes, dtypes, statics, precision) and its run-time inputs.

        The common positional arguments — `tpu` tensors that are their whole buffers, in order and at the
        buffers' dtypes, Python numbers and statics — are encoded inline: a tensor's input is its buffer's array,
        and its shape and dtype are read once for both. Any other (a view, a CPU tensor, a list, a generator)
        sends them all through `_encode`, which gives the same key.
        """
        key: list = [id(meta_op)]  # OpOverloads live for the process; id() hashes in C, the op in Python
        leaves: list = []
        math_bits = self.math_bits
        general = False
        prefix = self.prefix
        for value in args if len(args) <= prefix else args[:prefix]:  # tensors and numbers
            try:
                buffer = value.untyped_storage()._tpu_buffer
            except AttributeError:  # not a tpu tensor: a Python number, else the general encoding
                number = type(value)
                if number is float or number is int or number is bool:
                    key.append(number)
                    leaves.append(_device_scalar(value) if self.lowering.jit else value)
                    continue
                general = True
                break
            if not _whole(value, buffer, math_bits):
                general = True
                break
            leaves.append(buffer._array)
            key.append(value.shape)
            key.append(value.dtype)
        if not general and len(args) > prefix:  # statics after them
            for value, kind in zip(args[prefix:], self.positional[prefix:], strict=False):
                if kind != _STATIC:
                    general = True
                    break
                key.append(tuple(value) if isinstance(value, list) else value)
        if general:
            del key[1:], leaves[:]
            for value, kind in zip(args, self.positional, strict=False):
                self._encode(meta_op, value, kind, leaves, key)
        if kwargs:  # named: PyTorch passes only the keyword arguments given, so positions alone are ambiguous
            for name, value in kwargs.items():
                key.append(name)
                self._encode(meta_op, value, self.keyword[name], leaves, key)
        if self.lowering.rng:
            leaves.append(tpu_random.next_key(kwargs.get("generator")))
        key.append(_context.token)  # the trace context: default dtype, precision, device-side checks
        return tuple(key), leaves

    def run(self, meta_op: OpOverload, args: tuple, kwargs: dict) -> Any:
        """Run the lowering on `args`; returns jax.Arrays shaped like `meta_op`'s outputs (Pending in Fused mode)."""
        key, leaves = self.inputs(meta_op, args, kwargs)
        if modes.state.fused:
            return self._record(meta_op, key, args, kwargs, leaves)
        return self.execute(meta_op, key, args, kwargs, leaves)

    def execute(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list) -> Any:
        """Strict and Debug modes: the executable cached under `key` (compiled on a miss) applied to `leaves`."""
        entry = executables.lookup(key)
        if entry is None:
            result = self._compile(meta_op, key, args, kwargs, leaves)
        else:
            result = entry.executable(*leaves)
        if modes.state.blocking:
            _check(meta_op, result)
            device_checks.raise_pending()  # Debug mode: a failed device-side check raises at the op that made it
        return result

    def _trace(self, meta_op: OpOverload, args: tuple, kwargs: dict) -> tuple[Callable, Any]:
        """The lowering as a function of the run-time inputs, and the output dtypes PyTorch's meta kernel gives."""
        platform.devices()
        count = [0]
        template_args = [self._template(v, k, count) for v, k in zip(args, self.positional, strict=False)]
        template_kwargs = {n: self._template(v, self.keyword[n], count) for n, v in kwargs.items()}
        meta = _meta_outputs(meta_op, args, kwargs)
        out_dtypes = _dtypes_of(meta)
        fn = self.lowering.fn
        rng = self.lowering.rng
        if _all_empty(meta) and not self.lowering.checks_empty:  # nothing to compute (nor zero sizes to handle)

            def empty(*values: jax.Array) -> Any:
                return _zeros_like(meta)

            return empty, out_dtypes

        def traced(*values: jax.Array) -> Any:
            call_args = [_fill(v, values) for v in template_args]
            call_kwargs = {n: _fill(v, values) for n, v in template_kwargs.items()}
            if rng:
                call_kwargs["key"] = values[-1]
            result = fn(*call_args, **call_kwargs)
            return _cast(result, out_dtypes)

        # a jitted lowering's device-side checks become outputs of its executable (runtime/checks.py)
        return (device_checks.collecting(traced) if self.lowering.jit else traced), out_dtypes

    def _compile(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list) -> Any:
        """Trace and compile the lowering for this signature, cache it, and return its first result."""
        traced, out_dtypes = self._trace(meta_op, args, kwargs)
        start = time.perf_counter()
        source = "eager"
        executable = traced
        if self.lowering.jit:
            executable, from_disk = persistent.compile_lowered(jax.jit(traced).lower(*leaves))
            source = "disk" if from_disk else "compiled"
        else:
            leaves = [fused.concrete(x) for x in leaves]
        result = jax.block_until_ready(executable(*leaves))
        executable = persistent.fast_call(executable)
        if type(result) is device_checks.Checked:  # device-side checks: each call leaves them pending
            executable, result = device_checks.stashing(executable), device_checks.take(result)
        entry = Entry(str(meta_op), executable, out_dtypes, time.perf_counter() - start, source=source)
        if self.lowering.jit and isinstance(result, jax.Array):  # a fixed output shape: wrap it directly
            entry.layout = storage.layout(result.shape, result.dtype)
        executables.insert(key, entry)
        return result

    def _record(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list) -> Any:
        """Fused mode: record the op into the pending cluster instead of running it."""
        if not self.lowering.jit:  # a data-dependent shape
            return self.alone(meta_op, key, args, kwargs, leaves)
        trace = fused.recorder.traces.get(key) or self._fused_trace(meta_op, key, args, kwargs, leaves)
        return fused.record(trace, leaves)

    def alone(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list) -> Any:
        """Fused mode, for an op that must not join a cluster: run the cluster so far, then the op now, on its own
        as in Strict mode."""
        fused.flush(extra=[x for x in leaves if fused.is_pending(x)])
        return self.execute(meta_op, key, args, kwargs, [fused.concrete(x) for x in leaves])

    def _fused_trace(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list) -> fused.Trace:
        """The lowering traced for Fused mode under `key`, with the layout of a single tensor output."""
        trace = fused.trace(key, self._trace(meta_op, args, kwargs)[0], leaves)
        if trace.single or trace.checks is not None and len(trace.avals) == 1 and trace.tree.num_nodes == 1:
            trace.layout = storage.layout(trace.avals[0].shape, trace.avals[0].dtype)
        return trace


_JAX_DTYPE = dtypes._TORCH_TO_JAX
_context = precision.context
_scalars: dict[Any, Any] = {}


def _device_scalar(value: Any) -> Any:
    """A Python scalar run-time input, as a device array of the same (weak) type once the value recurs.

    An executable transfers a Python scalar to the device on every call, but takes an array as it is; making
    the array costs about three such transfers, so a value becomes one (cached by value) on its second use —
    constants such as betas, eps or 0.5 do, a per-step value such as a bias correction stays a Python scalar.
    Fused mode too: there a Python scalar costs a cluster call ~1.5 µs against ~0.35 µs for an array. Data-
    dependent (non-jit) lowerings keep Python scalars, as they may branch on them.
    """
    kind = type(value)
    if kind is float:
        key = value.hex()  # tells -0.0 from 0.0
    elif kind is int or kind is bool:
        key = (kind, value)
    else:
        return value
    found = _recurring(key, _scalar_array, value)
    return value if found is None else found


def _scalar_array(value: bool | int | float) -> Any:
    platform.devices()  # x64 is configured before the first array is made
    try:
        return jnp.asarray(value)
    except OverflowError:  # an int beyond int64: the executable reports it, as before
        return value


def _host_scalar(value: torch.Tensor) -> jax.Array:
    """A 0-dim CPU tensor (a loss scale, a `torch.tensor(2.0)` in user code) on the device, cached by dtype and
    value once the value recurs, as a Python scalar is: each transfer costs a hundred small ops."""
    number = value.item()
    if isinstance(number, complex):
        number = (number.real.hex(), number.imag.hex())
    elif isinstance(number, float):
        number = number.hex()
    found = _recurring((value.dtype, number), storage.to_device, value)
    return storage.to_device(value) if found is None else found


def _recurring(key: Any, make: Callable[[Any], Any], value: Any) -> Any:
    """`make(value)`, cached under `key` from the key's second use on; None on its first use."""
    found = _scalars.get(key)
    if found is None:
        if len(_scalars) >= _MAX_SCALARS:
            _scalars.clear()
        _scalars[key] = False
        return None
    if found is False:
        found = _scalars[key] = make(value)
    return found


def _fill(template: Any, values: tuple) -> Any:
    if isinstance(template, _Leaf):
        if template.view is not None:
            offset = values[template.index + 1] if template.offset else 0
            return storage.read_view(values[template.index], *template.view, offset)
        if template.count is not None:  # packed Python numbers: weakly typed again, as Python numbers trace
            packed = values[template.index]
            return [_convert_element_type(packed[i], weak_type=True) for i in range(template.count)]
        return values[template.index]
    if isinstance(template, list):
        return [_fill(v, values) for v in template]
    return template


def _to_meta(value: Any, mask_dtype: torch.dtype | None = None) -> Any:
    """`value` with its `tpu` tensors (and devices) on `meta`; `mask_dtype` replaces uint8."""
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        dtype = mask_dtype if mask_dtype is not None and value.dtype == torch.uint8 else value.dtype
        return torch.empty_strided(value.shape, value.stride(), dtype=dtype, device="meta")
    if isinstance(value, (torch.device, str)) and str(value).startswith("tpu"):
        return torch.device("meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v, mask_dtype) for v in value)
    return value


_INDEX = torch.ops.aten.index.Tensor


def _meta_args(op: OpOverload, args: tuple) -> tuple:
    """`args` for `op`'s meta kernel. aten.index.Tensor's (a Python one) rejects a uint8 index, which CPU reads as
    a (deprecated) bool mask, as the lowering does: it is shown a bool mask instead."""
    if op is not _INDEX or len(args) < 2:
        return _to_meta(args)
    return (_to_meta(args[0]), _to_meta(args[1], torch.bool), *_to_meta(args[2:]))


# what a RuntimeError says (lowercased) when the op has no meta kernel or its output shape depends on data
_NO_META_KERNEL = ("data-dependent", "meta tensor", "no fake impl or meta kernel")


def _meta_outputs(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """Outputs by PyTorch's own meta kernel (shapes, type promotion, and PyTorch's errors for bad input)."""
    try:
        with torch._C._DisableTorchDispatch():
            return op(*_meta_args(op, args), **{k: _to_meta(v) for k, v in kwargs.items()})
    except (NotImplementedError, torch._subclasses.fake_tensor.UnsupportedOperatorException):
        return None
    except AttributeError:  # a meta kernel that mishandles an absent optional (_thnn_fused_lstm_cell's biases)
        return None
    except RuntimeError as error:  # no meta kernel, or data-dependent output shapes; any other is the call's error
        if any(reason in str(error).lower() for reason in _NO_META_KERNEL):
            return None
        raise


def _dtypes_of(meta: Any) -> Any:
    if isinstance(meta, torch.Tensor):
        return dtypes.to_jax(meta.dtype)
    if isinstance(meta, (list, tuple)):
        return tuple(dtypes.to_jax(o.dtype) if isinstance(o, torch.Tensor) else None for o in meta)
    return None


def _all_empty(meta: Any) -> bool:
    """Whether the op's outputs are all tensors with no elements (e.g. a zero-size batch)."""
    outputs = meta if isinstance(meta, (list, tuple)) else [meta]
    tensors = [o for o in outputs if o is not None]
    return bool(tensors) and all(isinstance(o, torch.Tensor) and o.numel() == 0 for o in tensors)


def _zeros_like(meta: Any) -> Any:
    if isinstance(meta, torch.Tensor):
        return jnp.zeros(tuple(meta.shape), dtypes.to_jax(meta.dtype))
    zeros = [None if o is None else _zeros_like(o) for o in meta]
    return zeros if isinstance(meta, list) else tuple(zeros)


def _cast(result: Any, out_dtypes: Any) -> Any:
    if out_dtypes is None:
        return result
    if isinstance(out_dtypes, tuple):
        return tuple(_cast(r, d) for r, d in zip(result, out_dtypes, strict=True))
    if result is None or result.dtype == out_dtypes:
        return result
    return result.astype(out_dtypes)


def _check(op: OpOverload, result: Any) -> None:
    """Debug mode: finish the op now; with TORCH_TPU_DEBUG_NANS=1, raise at the first non-finite output."""
    jax.block_until_ready(result)
    if not modes.state.debug_nans:
        return
    for array in jax.tree_util.tree_leaves(result):
        if dtypes.is_floating(array.dtype) or dtypes.is_complex(array.dtype):
            if not bool(np.isfinite(np.asarray(array)).all()):
                raise FloatingPointError(f"torch_tpu: {op} produced NaN or Inf (TORCH_TPU_DEBUG_NANS=1)")


def _output_wrapper(op: OpOverload) -> Callable[[Any], Any]:
    """How to turn the lowering's arrays into the op's return value (a Tensor, a list or a tuple)."""
    returns = [str(r.type) for r in op._schema.returns]
    if returns == ["Tensor"]:
        return storage.wrap
    if returns == ["List[Tensor]"]:
        return lambda result: [storage.wrap(r) for r in result]
    # Undefined outputs (e.g. a backward op's gradients masked off by `output_mask`) stay None.
    return lambda result: tuple(None if r is None else storage.wrap(r) for r in result)


def functional_kernel(lowering: Lowering) -> Callable:
    runner = Runner(lowering)
    op = lowering.op
    wrap = _output_wrapper(op)
    if wrap is storage.wrap and lowering.jit:
        kernel = _tensor_kernel(runner, op)
    else:

        def kernel(*args: Any, **kwargs: Any) -> Any:
            try:
                return wrap(runner.run(op, args, kwargs))
            except Exception as error:
                validation.raise_as_cpu(op, args, kwargs, error)
                raise

    kernel.runner = runner
    return kernel


def _tensor_kernel(runner: Runner, op: OpOverload) -> Callable:
    """The kernel of an op returning one tensor of a fixed shape, with the steady state inlined: the cached
    executable (or, in Fused mode, the trace) found by the key carries the output's layout, so the result is
    wrapped without reading anything from it. Misses and Debug mode take `Runner.execute`."""
    inputs = runner.inputs
    state = modes.state
    cache = executables
    entries = cache.entries
    traces = fused.recorder.traces
    record = fused.record
    wrap_as = storage.wrap_as
    now = time.time

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        try:  # (costs nothing unless raised)
            key, leaves = inputs(op, args, kwargs)
            if state.fused:
                if len(leaves) > _MAX_FUSED_INPUTS:
                    return storage.wrap(runner.alone(op, key, args, kwargs, leaves))
                trace = traces.get(key) or runner._fused_trace(op, key, args, kwargs, leaves)
                return wrap_as(record(trace, leaves), trace.layout)
            entry = entries.get(key)
            if entry is None or state.blocking:
                return storage.wrap(runner.execute(op, key, args, kwargs, leaves))
            cache.num_cache_reqs += 1  # ExecutableCache.lookup's counting of a hit
            cache.num_cache_hits += 1
            entry.read_count += 1
            entry.last_read = now()
            return wrap_as(entry.executable(*leaves), entry.layout)
        except Exception as error:
            validation.raise_as_cpu(op, args, kwargs, error)
            raise

    return kernel


def inplace_kernel(lowering: Lowering, inplace_op: OpOverload) -> Callable:
    runner = Runner(lowering, inplace_op)

    if isinstance(lowering.op._schema.arguments[0].type, torch.ListType):  # a foreach op: one executable, n writes

        def kernel(self: list[torch.Tensor], *args: Any, **kwargs: Any) -> None:
            for tensor, value in zip(self, runner.run(inplace_op, (self, *args), kwargs), strict=True):
                storage.write(tensor, value)

        return kernel

    def kernel(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        try:
            validation.check_writes(self, args, kwargs)
            storage.write(self, runner.run(inplace_op, (self, *args), kwargs))
        except Exception as error:
            validation.raise_as_cpu(inplace_op, (self, *args), kwargs, error)
            raise
        return self

    return kernel


def _resize_for(out: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(out.shape) != shape:
        if out.numel() != 0:
            import warnings

            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                f"does not match the required output shape {list(shape)}.",
                stacklevel=4,
            )
        out.resize_(shape)


def out_kernel(lowering: Lowering, out_op: OpOverload) -> Callable:
    runner = Runner(lowering, out_op)
    names = [a.name for a in mutated_args(out_op)]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(n) for n in names]
        try:
            result = runner.run(lowering.op, args, kwargs)
            results = result if isinstance(result, (tuple, list)) else (result,)
            for out, value in zip(outs, results, strict=True):
                if _JAX_DTYPE[out.dtype] != value.dtype:  # CPU's rules: canCast, or the same dtype, by op
                    validation.check_out_dtypes(out_op, args, {**kwargs, **dict(zip(names, outs, strict=True))})
            for out, value in zip(outs, results, strict=True):
                _resize_for(out, value.shape)
                validation.check_writes(out, args, kwargs)
                storage.write(out, value)
        except Exception as error:
            validation.raise_as_cpu(out_op, args, {**kwargs, **dict(zip(names, outs, strict=True))}, error)
            raise
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel
