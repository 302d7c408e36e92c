"""Eager dispatch: unwrap `tpu` tensors -> one cached jitted executable per (op, avals, statics) -> wrap.

Each lowering is traced once per key; PyTorch's meta kernels decide output dtypes (so type promotion is
PyTorch's own) and raise PyTorch's errors for bad input before anything runs on the device.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload

from torch_tpu import metrics, precision
from torch_tpu import random as tpu_random
from torch_tpu.eager import encoding, fused, modes, programs, validation, warmup
from torch_tpu.eager.cache import Entry, executables
from torch_tpu.ops.registry import Lowering, mutated_args
from torch_tpu.runtime import checks as device_checks
from torch_tpu.runtime import compat, dtypes, fills, float64, persistent, platform, storage, trace_context

_MATH_BIT_KEYS = (torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative)
# An op gathering more tensors than this into one (a `stack` or `cat` of many) runs on its own in Fused mode:
# XLA:CPU's compile time for a concatenation fused into its consumer grows superlinearly with the operands
# (stack + sum of 1500 vectors: 6.0 s against 1.4 s for the stack alone; 0.19 against 0.12 s at 256).
_MAX_FUSED_INPUTS = 256
# Reductions and scans whose `out=` form, given no `dtype`, computes at the out's dtype (CPU's meta kernels take it
# from the output: `torch.sum(half, 0, out=float32)` sums in float32); other ops compute, then cast (or refuse).
_OUT_DTYPE_COMPUTES = frozenset(("sum", "nansum", "prod", "mean", "cumsum", "cumprod"))


class Runner:
    """Runs one functional lowering for tensors of any shape, caching an executable per signature."""

    def __init__(self, lowering: Lowering, dispatched: OpOverload | None = None) -> None:
        self.lowering = lowering
        self.op = lowering.op
        # PyTorch's Conjugate and Negative fallbacks materialise conjugate and negative views before an op
        # reaches its backend kernel, unless the op has a kernel of its own for those keys (views, copies, mm):
        # only then can our kernel (for `dispatched`, the overload it is registered for) see the bits set.
        name = (dispatched or self.op).name()
        self.math_bits = any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in _MATH_BIT_KEYS)
        encoders = encoding.encoders(self.math_bits, lowering.jit)
        arguments = self.op._schema.arguments
        kinds = {a.name: encoding.kind(a, lowering.static, lowering.scalars) for a in arguments}
        self.positional = tuple(encoders[kinds[a.name]] for a in arguments if not a.kwarg_only)
        self.keyword = {a.name: encoders[kinds[a.name]] for a in arguments if a.kwarg_only}

    def inputs(self, meta_op: OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, list, tuple]:
        """The cache key of a call (op, shapes, dtypes, statics, precision), its run-time inputs and its template
        (the positional arguments' templates and the named ones', by name), in one pass of each argument's encoder.
        """
        key: list = [id(meta_op)]  # OpOverloads live for the process; id() hashes in C, the op in Python
        leaves: list = []
        template: list = []
        for value, encode in zip(args, self.positional, strict=False):
            template.append(encode(meta_op, value, key, leaves))
        named: Any = ()
        if kwargs:  # named: PyTorch passes only the keyword arguments given, so positions alone are ambiguous
            keyword = self.keyword
            named = []
            for name, value in kwargs.items():
                key.append(name)
                named.append((name, keyword[name](meta_op, value, key, leaves)))
        if self.lowering.rng:
            leaves.append(tpu_random.next_key(kwargs.get("generator")))
        key.append(_context.token)  # the trace context: default dtype, precision, device-side checks
        return tuple(key), leaves, (template, named)

    def run(self, meta_op: OpOverload, args: tuple, kwargs: dict) -> Any:
        """Run the lowering on `args`; returns jax.Arrays shaped like `meta_op`'s outputs (Pending in Fused mode)."""
        key, leaves, template = self.inputs(meta_op, args, kwargs)
        if modes.state.fused:
            return self._record(meta_op, key, args, kwargs, leaves, template)
        return self.execute(meta_op, key, args, kwargs, leaves, template)

    def execute(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list, template: tuple) -> Any:
        """Strict and Debug modes: the executable cached under `key` (compiled on a miss) applied to `leaves`; in
        Strict mode, queued while its program compiles or others are queued (`eager.warmup`)."""
        entry = executables.lookup(key)
        if entry is None or fused._sealed:
            queued = warmup.queue(self, meta_op, key, (args, kwargs, template), leaves, entry)
            if queued is not None:
                return queued
        if entry is None:
            result = self._compile(meta_op, key, args, kwargs, leaves, template)
        else:
            result = entry.executable(*leaves)
        if modes.state.blocking:
            _check(meta_op, result)
            device_checks.raise_pending()  # Debug mode: a failed device-side check raises at the op that made it
        return result

    def _trace(self, meta_op: OpOverload, args: tuple, kwargs: dict, template: tuple) -> tuple[Callable, Any]:
        """The lowering as a function of the run-time inputs (filling the call's `template`, from `inputs`), and
        the output dtypes PyTorch's meta kernel gives."""
        platform.devices()
        positional, named = template
        meta = _meta_outputs(meta_op, args, kwargs)
        out_dtypes = _dtypes_of(meta) if meta is not None else _written_list_dtypes(self.op, meta_op, args, kwargs)
        if self.lowering.eager_dtypes is not None:
            out_dtypes = self.lowering.eager_dtypes(out_dtypes, *args, **kwargs)
        fn = self.lowering.fn
        rng = self.lowering.rng
        if _all_empty(meta) and not self.lowering.checks_empty:  # nothing to compute (nor zero sizes to handle)

            def empty(*values: jax.Array) -> Any:
                return _zeros_like(meta)

            return _named_after(empty, meta_op), out_dtypes

        def traced(*values: jax.Array) -> Any:
            remaining = iter(values)  # in the encoders' order: the positional arguments, then the named ones
            call_args = [encoding.fill(v, remaining) for v in positional]
            call_kwargs = {n: encoding.fill(v, remaining) for n, v in named}
            if rng:
                call_kwargs["key"] = values[-1]
            with precision.tracing():
                result = fn(*call_args, **call_kwargs)
            return _cast(result, out_dtypes)

        # a jitted lowering's device-side checks become outputs of its executable (runtime/checks.py)
        traced = _named_after(traced, meta_op)
        return (device_checks.collecting(traced) if self.lowering.jit else traced), out_dtypes

    def trace_checked(
        self, meta_op: OpOverload, args: tuple, kwargs: dict, template: tuple, leaves: list
    ) -> tuple[Callable, list]:
        """`_trace`'s function, and the dtypes the float64 policy counts for the call (its inputs `leaves` and
        outputs), after the policy's refusal of complex128 on a TPU."""
        traced, out_dtypes = self._trace(meta_op, args, kwargs, template)
        dtypes = float64.counted(leaves, out_dtypes)
        float64.check(str(meta_op), dtypes)
        return traced, dtypes

    def _compile(
        self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list, template: tuple
    ) -> Any:
        """Trace and compile the lowering for this signature, cache it, and return its first result."""
        traced, wide = self.trace_checked(meta_op, args, kwargs, template, leaves)
        start = time.perf_counter()
        try:
            executable, result, source = self._build(meta_op, traced, args, kwargs, leaves)
        except jax.errors.JaxRuntimeError as error:  # XLA cannot compile the op for this platform's 64-bit types
            refused = float64.refusal(str(meta_op), error, wide)
            if refused is not None:
                raise refused from error
            raise
        executable = persistent.fast_call(executable)
        if type(result) is device_checks.Checked:  # device-side checks: each call leaves them pending
            executable, result = device_checks.stashing(executable), device_checks.take(result)
        entry = Entry(str(meta_op), executable, time.perf_counter() - start, source=source)
        metrics.compiled("eager", "traced" if source == "eager" else source, entry.compilation_duration)
        if self.lowering.jit:
            entry.describe(jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), result))
        executables.insert(key, entry)
        return result

    @compat.without_dynamo_frames
    def _build(self, meta_op: OpOverload, traced: Callable, args: tuple, kwargs: dict, leaves: list) -> tuple:
        """(executable, first result, source): the jitted lowering compiled (or loaded from disk) and run once,
        or, for an unjitted one, the traced function run op by op."""
        if not self.lowering.jit:
            return traced, jax.block_until_ready(traced(*[fused.concrete(x) for x in leaves])), "eager"
        jitted = jax.jit(traced, donate_argnums=self._donated_leaves(meta_op, args, kwargs, leaves))
        with programs.unused_donations_allowed():  # JAX warns of them: the caller consumes them all the same
            lowered = jitted.lower(*programs.lowering_avals(leaves))
            executable, from_disk = persistent.compile_lowered(lowered, eager=True)
        return executable, jax.block_until_ready(executable(*leaves)), "disk" if from_disk else "compiled"

    def _donated_leaves(self, meta_op: OpOverload, args: tuple, kwargs: dict, leaves: list) -> tuple[int, ...]:
        """The positions in `leaves` of the donated arguments' arrays (`Lowering.donate`): each argument encoded
        again, alone, to count its run-time inputs; only device arrays are donated (not a cached scalar)."""
        donate = self.lowering.donate
        if not donate:
            return ()
        names = [a.name for a in self.op._schema.arguments if not a.kwarg_only]
        calls = [(n, v, e) for n, v, e in zip(names, args, self.positional, strict=False)]
        calls += [(n, v, self.keyword[n]) for n, v in kwargs.items()]
        found, count = [], 0
        for name, value, encode in calls:
            mine: list = []
            encode(meta_op, value, [], mine)
            if name in donate and isinstance(value, torch.Tensor) and value.device.type == "tpu":
                found += [count + i for i, leaf in enumerate(mine) if isinstance(leaf, jax.Array)]
            count += len(mine)
        return tuple(found)

    def _record(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list, template: tuple) -> Any:
        """Fused mode: record the op into the pending cluster instead of running it."""
        if not self.lowering.jit or self.lowering.donate:  # a data-dependent shape, or buffers to donate
            return self.alone(meta_op, key, args, kwargs, leaves, template)
        trace = fused.recorder.traces.get(key) or self._fused_trace(meta_op, key, args, kwargs, leaves, template)
        return fused.record(trace, leaves)

    def alone(self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list, template: tuple) -> Any:
        """Fused mode, for an op that must not join a cluster: run the cluster so far, then the op now, on its own
        as in Strict mode."""
        fused.flush(extra=[x for x in leaves if fused.is_pending(x)])
        return self.execute(meta_op, key, args, kwargs, [fused.concrete(x) for x in leaves], template)

    def _fused_trace(
        self, meta_op: OpOverload, key: tuple, args: tuple, kwargs: dict, leaves: list, template: tuple
    ) -> fused.Trace:
        """The lowering traced for Fused mode under `key`, with the layout of a single tensor output."""
        traced, _ = self.trace_checked(meta_op, args, kwargs, template, leaves)
        trace = fused.trace(key, traced, leaves)
        if trace.single or trace.checks is not None and len(trace.avals) == 1 and trace.tree.num_nodes == 1:
            trace.layout = storage.layout(trace.avals[0].shape, trace.avals[0].dtype)
        return trace


def _named_after(fn: Callable, op: OpOverload) -> Callable:
    """`fn` named after the ATen op it runs (`aten::mm`), so that its executable is `jit_aten__mm` in profiles
    and dumps (JAX names a module after its function); set once per trace, never per call."""
    fn.__name__ = fn.__qualname__ = op._schema.name
    return fn


_JAX_DTYPE = dtypes.JAX_DTYPES
_context = trace_context.context


def _to_meta(value: Any, mask_dtype: torch.dtype | None = None) -> Any:
    """`value` with its `tpu` tensors (and devices) on `meta`; `mask_dtype` replaces uint8."""
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        dtype = mask_dtype if mask_dtype is not None and value.dtype == torch.uint8 else value.dtype
        return torch.empty_strided(value.shape, value.stride(), dtype=dtype, device="meta")
    if isinstance(value, (torch.device, str)) and str(value).startswith("tpu"):
        platform.check_device(value)  # a cache miss: the key holds the device, so each index is checked once
        return torch.device("meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v, mask_dtype) for v in value)
    return value


_INDEX = torch.ops.aten.index.Tensor
_WHERE = torch.ops.aten.where.self
# nll_loss's target argument: a position, by op
_NLL_TARGET = {torch.ops.aten.nll_loss_forward.default: 1, torch.ops.aten.nll_loss_backward.default: 2}


def _meta_args(op: OpOverload, args: tuple) -> tuple:
    """`args` for `op`'s meta kernel. aten.index.Tensor's and aten.where.self's (Python ones) reject a uint8 index
    or condition, which CPU reads as a (deprecated) bool mask, as the lowerings do: they are shown a bool one.
    nll_loss's (a decomposition's gather) rejects a uint8 target, which CPU takes: it is shown an int64 one."""
    if op is _INDEX and len(args) >= 2:
        return (_to_meta(args[0]), _to_meta(args[1], torch.bool), *_to_meta(args[2:]))
    if op is _WHERE and args:
        return (_to_meta(args[0], torch.bool), *_to_meta(args[1:]))
    target = _NLL_TARGET.get(op)
    if target is not None and len(args) > target:
        return (*_to_meta(args[:target]), _to_meta(args[target], torch.int64), *_to_meta(args[target + 1 :]))
    return _to_meta(args)


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


def _written_list_dtypes(functional: OpOverload, op: OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """An in-place foreach op's (`_foreach_mul_`, whose meta kernel returns nothing): its list's dtypes, which
    its values are cast to inside its program, after raising what CPU raises where a functional result's dtype
    cannot be cast to its tensor's (`_foreach_mul_(int_tensors, 1.5)`). Its lowering computes a bfloat16 list in
    float32 (the scalar is a float32 run-time input), and a value of another dtype cost each write a cast of its own."""
    first = op._schema.arguments[0] if op._schema.arguments else None
    if (
        first is None
        or not isinstance(first.type, torch.ListType)
        or not (first.alias_info and first.alias_info.is_write)
    ):
        return None
    validation.check_inplace_dtype(functional, op, args, kwargs, _to_meta)
    return tuple(dtypes.to_jax(t.dtype) if isinstance(t, torch.Tensor) else None for t in args[0])


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
    if wrap is storage.wrap and lowering.jit and not lowering.donate:
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
    queued = fused._sealed
    wrap_as = storage.wrap_as
    now = time.time

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        try:  # (costs nothing unless raised)
            key, leaves, template = inputs(op, args, kwargs)
            if state.fused:
                if len(leaves) > _MAX_FUSED_INPUTS:
                    return storage.wrap(runner.alone(op, key, args, kwargs, leaves, template))
                trace = traces.get(key) or runner._fused_trace(op, key, args, kwargs, leaves, template)
                return wrap_as(record(trace, leaves), trace.layout)
            entry = entries.get(key)
            if entry is None or state.blocking or queued:
                return storage.wrap(runner.execute(op, key, args, kwargs, leaves, template))
            cache.num_cache_reqs += 1  # ExecutableCache.lookup's counting of a hit
            cache.num_cache_hits += 1
            entry.read_count += 1
            entry.last_read = now()
            return wrap_as(entry.executable(*leaves), entry.layout)
        except Exception as error:
            validation.raise_as_cpu(op, args, kwargs, error)
            raise

    return kernel


def _fill_value(inplace_op: OpOverload) -> Callable[[tuple, dict], Any] | None:
    """For `fill_` with a number and `zero_`: the value from the kernel's arguments (`runtime/fills.py` may then
    make a never-written storage's array without the op)."""
    if inplace_op is torch.ops.aten.zero_.default:
        return lambda args, kwargs: 0
    if inplace_op is torch.ops.aten.fill_.Scalar:
        return lambda args, kwargs: args[0] if args else kwargs.get("value")
    return None


def inplace_kernel(lowering: Lowering, inplace_op: OpOverload) -> Callable:
    runner = Runner(lowering, inplace_op)

    if isinstance(lowering.op._schema.arguments[0].type, torch.ListType):  # a foreach op: one executable, n writes

        def kernel(self: list[torch.Tensor], *args: Any, **kwargs: Any) -> None:
            for tensor, value in zip(self, runner.run(inplace_op, (self, *args), kwargs), strict=True):
                storage.write(tensor, value)

        return kernel

    fill = _fill_value(inplace_op)

    def kernel(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if fill is not None:
            value = fill(args, kwargs)
            fills.check_overflow(self, value)
            if fills.fill_fresh(self, value):
                return self
        try:
            validation.check_writes(inplace_op, self, (self, *args), kwargs)
            if not compat.META_REFUSES_INPLACE_CASTS:  # CPU's canCast rule, which older releases' meta kernels skip
                validation.check_inplace_dtype(lowering.op, inplace_op, (self, *args), kwargs, _to_meta)
            storage.write(self, runner.run(inplace_op, (self, *args), kwargs))
        except Exception as error:
            validation.raise_as_cpu(inplace_op, (self, *args), kwargs, error)
            raise
        return self

    return kernel


def _resize_for(out: torch.Tensor, shape: tuple[int, ...]) -> None:
    """CPU's resize_output: an `out=` of another shape takes the result's (contiguous, at its own storage offset),
    with a warning unless it was empty; one of the result's shape keeps its strides and is written through them."""
    if tuple(out.shape) != shape:
        if out.numel() != 0:
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                f"does not match the required output shape {list(shape)}.",
                stacklevel=4,
            )
        out.resize_(shape)


def out_kernel(lowering: Lowering, out_op: OpOverload) -> Callable:
    runner = Runner(lowering, out_op)
    names = [a.name for a in mutated_args(out_op)]
    out_dtype_computes = lowering.op._schema.name.removeprefix("aten::") in _OUT_DTYPE_COMPUTES

    def kernel(*args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(n) for n in names]
        named = dict(zip(names, outs, strict=True))
        try:
            for out in outs:  # before computing or resizing anything, as TensorIterator checks
                validation.check_writes(out_op, out, args, kwargs, named)
            run_kwargs = kwargs
            if out_dtype_computes and kwargs.get("dtype") is None:
                run_kwargs = {**kwargs, "dtype": outs[0].dtype}
            result = runner.run(lowering.op, args, run_kwargs)
            results = result if isinstance(result, (tuple, list)) else (result,)
            if any(_JAX_DTYPE[out.dtype] != value.dtype for out, value in zip(outs, results, strict=True)):
                _check_out_dtypes(out_op, args, {**kwargs, **named}, results)
            for out, value in zip(outs, results, strict=True):
                _resize_for(out, value.shape)
                storage.write(out, value)
        except Exception as error:
            validation.raise_as_cpu(out_op, args, {**kwargs, **named}, error)
            raise
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


def _check_out_dtypes(out_op: OpOverload, args: tuple, kwargs: dict, results: tuple) -> None:
    """`validation.check_out_dtypes`, with `results` held by buffers meanwhile: CPU's verdict reads the inputs,
    which in Fused mode runs the cluster recorded so far, and that computes only what some buffer holds."""
    held = [storage.DeviceBuffer(0, value.dtype, value) for value in results if fused.is_pending(value)]
    validation.check_out_dtypes(out_op, args, kwargs)
    del held
