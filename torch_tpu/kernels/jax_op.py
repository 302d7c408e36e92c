"""A JAX (or Pallas) function as a PyTorch op: `torch.tpu.pallas.jax_op("ns::name", fn)`.

The op is a `torch.library.custom_op` whose schema comes from `fn`'s annotations (`kernels.signature`). Its `tpu`
kernel is a lowering in the one registry (`ops.registry.lower`), so eager Strict, Debug and Fused modes, the
persistent cache and `torch.compile(backend="tpu")` (the op stays an ATen-graph node, inlined into the graph's one
program) run it as they run every ATen op. Its fake implementation is `jax.eval_shape` of the same trace, its
gradient `jax.vjp` of it (a second op, `ns::name_vjp`, that recomputes the forward: no residuals to carry), its CPU
kernel the same trace run by JAX on the host (a reference for tests).

Kernel traces run with x64 off unless `x64=True` (Mosaic rejects 64-bit types; torch_tpu turns x64 on for torch's
int64/float64): 64-bit inputs are narrowed to 32 bits as JAX narrows them, and outputs have the dtypes the trace
gives. On the CPU platform `pallas_call`s run interpreted (`interpret=None`: JAX's HLO interpreter, plain HLO that
inlines and caches like any program); `interpret=pltpu.InterpretParams()` selects JAX's TPU interpret mode (DMA,
semaphores, VMEM simulated, through host callbacks, so its executables are not written to the persistent tier),
`interpret=False` never interprets. The lowering's content (the user's function, recursively) is what the warm-start
index keys a graph on, so a kernel changed between two processes compiles afresh (`compile.warm`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
import torch
from torch._ops import OpOverload

from torch_tpu.eager import dispatch
from torch_tpu.kernels import donation, meshed, signature
from torch_tpu.kernels.signature import LIST, STATIC
from torch_tpu.ops.registry import LOWERINGS, lower
from torch_tpu.runtime import dtypes, platform
from torch_tpu.runtime.hooks import hooks

_NARROW = {np.dtype(np.float64): np.float32, np.dtype(np.int64): np.int32}
_NARROW.update({np.dtype(np.uint64): np.uint32, np.dtype(np.complex128): np.complex64})
_libraries: list[torch.library.Library] = []


class KernelError(TypeError):
    """A kernel function that cannot trace for the arguments given (a dtype or shape it does not accept)."""


# --- the trace: x64 and interpret mode -------------------------------------------------------------------------

_on_host = threading.local()  # .active: this thread's CPU kernel is running a lowering


@contextlib.contextmanager
def _on_cpu() -> Iterator[None]:
    """The lowering's platform is the host's CPU while the CPU kernel runs it (interpret mode)."""
    before = getattr(_on_host, "active", False)
    _on_host.active = True
    try:
        yield
    finally:
        _on_host.active = before


def _where() -> str:
    return "cpu" if getattr(_on_host, "active", False) else platform.platform()


def _trace_device() -> jax.Device:
    """The device the lowering being traced runs on: the host's CPU for the CPU kernel, else this rank's."""
    return jax.local_devices(backend="cpu")[0] if getattr(_on_host, "active", False) else platform.device()


@contextlib.contextmanager
def _scope(x64: bool, interpret: Any, where: str) -> Iterator[None]:
    """Trace a kernel with x64 as asked and, on the CPU platform, `pallas_call`s interpreted (`interpret` None:
    the HLO interpreter; else as given, False for never)."""
    mode = (True if where == "cpu" else None) if interpret is None else interpret
    with contextlib.ExitStack() as stack:
        stack.enter_context(jax.enable_x64(x64))
        if mode:
            from jax.experimental.pallas import tpu as pltpu

            stack.enter_context(pltpu.force_tpu_interpret_mode(mode))
        yield


def _narrow(value: Any, x64: bool) -> Any:
    """A 64-bit array as JAX with x64 off would hold it (32 bits); anything else as it is."""
    if x64 or not isinstance(value, jax.Array | jax.ShapeDtypeStruct):
        return value
    narrow = _NARROW.get(np.dtype(value.dtype))
    if narrow is None:
        return value
    return (
        jax.ShapeDtypeStruct(value.shape, narrow) if isinstance(value, jax.ShapeDtypeStruct) else value.astype(narrow)
    )


def _narrowed(tree: Any, x64: bool) -> Any:
    return jax.tree_util.tree_map(lambda v: _narrow(v, x64), tree)


def _outputs(result: Any, returns: str) -> Any:
    """The kernel's result as the op returns it: an array, a tuple, or a list."""
    if returns == "single":
        return result
    return list(result) if returns == "list" else tuple(result)


def _forward(fn: Callable, x64: bool, interpret: Any, returns: str, *args: Any, **kwargs: Any) -> Any:
    """The lowering of a jax_op: `fn` on the arguments (jax.Arrays and static values), traced in its scope."""
    with _scope(x64, interpret, _where()):
        return _outputs(fn(*_narrowed(args, x64), **_narrowed(kwargs, x64)), returns)


def _rebuild(kinds: Sequence[tuple[str, str]], primals: Sequence[Any], counts: Sequence[int]) -> list[Any]:
    """The array parameters' values from the flat primals: an array, None or an array, or a list."""
    values, position = [], 0
    for (_, kind), count in zip([k for k in kinds if k[1] != STATIC], counts, strict=True):
        chunk = list(primals[position : position + count])
        position += count
        values.append(chunk if kind == LIST else (chunk[0] if chunk else None))
    return values


def _call(fn: Callable, kinds: Sequence[tuple[str, str]], arrays: list[Any], statics: Sequence[Any]) -> Any:
    """`fn` called with its array parameters' and static parameters' values, each in parameter order."""
    arrays_left, statics_left = iter(arrays), iter(statics)
    values = {name: next(statics_left if kind == STATIC else arrays_left) for name, kind in kinds}
    return fn(**values)


def _inexact(dtype: Any) -> bool:
    return bool(jax.numpy.issubdtype(dtype, jax.numpy.inexact))


def _backward(
    fn: Callable,
    x64: bool,
    interpret: Any,
    kinds: tuple[tuple[str, str], ...],
    primals: list[Any],
    cotangents: list[Any],
    counts: list[int],
    *statics: Any,
) -> list[Any]:
    """The lowering of a jax_op's `_vjp` op: the gradients of `fn` (`jax.vjp`, recomputing the forward) for its
    floating primals, given the cotangents of its floating outputs."""
    with _scope(x64, interpret, _where()):
        primals = _narrowed(list(primals), x64)
        differentiable = [i for i, p in enumerate(primals) if _inexact(p.dtype)]

        def forward(*values: Any) -> Any:
            full = list(primals)
            for i, value in zip(differentiable, values, strict=True):
                full[i] = value
            return _call(fn, kinds, _rebuild(kinds, full, counts), statics)

        result, pullback = jax.vjp(forward, *[primals[i] for i in differentiable])
        outputs = [result] if isinstance(result, jax.Array) else list(result)
        given = iter(cotangents)
        cts = [
            next(given).astype(o.dtype) if _inexact(o.dtype) else np.zeros(o.shape, jax.dtypes.float0) for o in outputs
        ]
        return list(pullback(cts[0] if isinstance(result, jax.Array) else type(result)(cts)))


# --- tensors and abstract values --------------------------------------------------------------------------------


class _Slot:
    """Where a tensor was in a call's arguments."""


_SLOT = _Slot()


def _split(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with each tensor replaced by `_SLOT` (the tensors appended to `tensors`, in order)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _SLOT
    if isinstance(value, (list, tuple)):
        return type(value)(_split(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _split(v, tensors) for k, v in value.items()}
    return value


def _fill(template: Any, values: Iterator) -> Any:
    if template is _SLOT:
        return next(values)
    if isinstance(template, (list, tuple)):
        return type(template)(_fill(v, values) for v in template)
    if isinstance(template, dict):
        return {k: _fill(v, values) for k, v in template.items()}
    return template


def _abstract(lowering: Callable, name: str, names: Sequence[str], args: tuple, kwargs: dict) -> Any:
    """`jax.eval_shape` of `lowering` on the arguments' shapes and dtypes (a KernelError naming them if it fails)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    tensors: list[torch.Tensor] = []
    template = _split((args, kwargs), tensors)
    with unset_fake_temporarily():
        platform.devices()  # x64 as eager traces it: int64 stays int64 until the kernel's scope narrows it
        structs = [jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), dtypes.to_jax(t.dtype)) for t in tensors]

        def traced(*arrays: Any) -> Any:
            call_args, call_kwargs = _fill(template, iter(arrays))
            return lowering(*call_args, **call_kwargs)

        try:
            return jax.eval_shape(traced, *structs)
        except Exception as error:
            raise KernelError(
                f"torch_tpu: jax_op {name!r} cannot trace for ({signature.describe(args, kwargs, names)}): "
                f"{type(error).__name__}: {error}"
            ) from error


def _empty_like(abstract: Any, device: torch.device) -> Any:
    if isinstance(abstract, (list, tuple)):
        return type(abstract)(_empty_like(a, device) for a in abstract)
    return torch.empty(abstract.shape, dtype=dtypes.to_torch(abstract.dtype), device=device)


def _device(args: tuple) -> torch.device:
    tensors: list[torch.Tensor] = []
    _split(args, tensors)
    return tensors[0].device if tensors else torch.device("cpu")


def _fake(lowering: Callable, name: str, names: Sequence[str]) -> Callable:
    """The fake (and meta) implementation: empty tensors shaped as `jax.eval_shape` of the lowering says."""

    def fake(*args: Any, **kwargs: Any) -> Any:
        return _empty_like(_abstract(lowering, name, names, args, kwargs), _device(args))

    return fake


def _host(tensor: torch.Tensor, device: jax.Device) -> jax.Array:
    carrier = dtypes.host_carrier(tensor.dtype)
    tensor = tensor.detach().resolve_conj().resolve_neg().contiguous()
    array = (tensor.view(carrier) if carrier else tensor).numpy()
    return jax.device_put(array.view(dtypes.to_jax(tensor.dtype)) if carrier else array, device)


def _to_torch(array: Any) -> Any:
    if isinstance(array, (list, tuple)):
        return type(array)(_to_torch(a) for a in array)
    host = np.asarray(array)
    dtype = dtypes.to_torch(host.dtype)
    carrier = dtypes.host_carrier(dtype)
    if carrier:
        return torch.from_numpy(host.view(dtypes.to_jax(carrier)).copy()).view(dtype)
    return torch.from_numpy(np.array(host, copy=True))


def _cpu_kernel(lowering: Callable) -> Callable:
    """The CPU kernel: the lowering run by JAX on the host's CPU device (interpreted), a reference for tests."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        cpu = jax.local_devices(backend="cpu")[0]
        tensors: list[torch.Tensor] = []
        template = _split((args, kwargs), tensors)
        with jax.enable_x64(True), jax.default_device(cpu):  # the kernel's own scope narrows, as on the device
            call_args, call_kwargs = _fill(template, iter([_host(t, cpu) for t in tensors]))
            with _on_cpu():
                return _to_torch(lowering(*call_args, **call_kwargs))

    return kernel


# --- autograd ---------------------------------------------------------------------------------------------------


def _autograd(sig: signature.Signature, vjp: Any) -> tuple[Callable, Callable]:
    """`setup_context` and `backward` of a jax_op: the primals (the array arguments, flat) are saved, and the
    backward calls the `_vjp` op on them and the floating outputs' cotangents."""
    params = sig.params

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        primals, counts, statics = [], [], []
        for param, value in zip(params, inputs, strict=True):
            if param.kind == STATIC:
                statics.append(value)
                continue
            chunk = list(value) if param.kind == LIST else ([] if value is None else [value])
            primals += chunk
            counts.append(len(chunk))
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        ctx.save_for_backward(*primals)
        ctx.counts, ctx.statics = counts, statics
        ctx.floating = [o.dtype.is_floating_point or o.dtype.is_complex for o in outputs]
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in outputs]

    def backward(ctx: Any, *grads: Any) -> tuple:
        primals = list(ctx.saved_tensors)
        flat = list(grads[0]) if sig.returns == "list" else list(grads)
        cotangents = [
            torch.zeros(shape, dtype=dtype, device=device) if g is None else g
            for g, (shape, dtype, device), floating in zip(flat, ctx.outputs, ctx.floating, strict=True)
            if floating
        ]
        computed = iter(vjp(primals, cotangents, ctx.counts, *ctx.statics))
        grads_of = [
            next(computed).to(p.dtype) if p.dtype.is_floating_point or p.dtype.is_complex else None for p in primals
        ]
        result, position, counts = [], 0, iter(ctx.counts)
        for param in params:
            if param.kind == STATIC:
                result.append(None)
                continue
            count = next(counts)
            chunk = grads_of[position : position + count]
            position += count
            result.append(chunk if param.kind == LIST else (chunk[0] if chunk else None))
        return tuple(result)

    return setup_context, backward


def _no_double_backward(name: str) -> tuple[Callable, Callable]:
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        return None

    def backward(ctx: Any, *grads: Any) -> tuple:
        raise RuntimeError(
            f"torch_tpu: jax_op {name!r} does not support double backward (its gradient op {name}_vjp has no "
            f"gradient); register one with `op.register_autograd(...)` for a backward that is itself differentiable"
        )

    return setup_context, backward


# --- registration ------------------------------------------------------------------------------------------------


def _overload(op: Any) -> OpOverload:
    if isinstance(op, torch._library.custom_ops.CustomOpDef):
        return op._opoverload
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    if isinstance(op, OpOverload):
        return op
    raise TypeError(f"torch_tpu: register a lowering for an OpOverload or a torch.library custom op, not {op!r}")


def register_lowering(op: Any, fn: Callable) -> None:
    """Make JAX function `fn` the `tpu` implementation of custom op `op` (an OpOverload, its packet or a
    `torch.library.custom_op`), after import: a lowering in the one registry, so that eager (every mode) and
    `torch.compile(backend="tpu")` run it. `fn` takes the op's arguments (tensors as jax.Arrays) and returns
    its outputs as jax.Arrays; registering an op twice raises."""
    _register(_overload(op), fn)


def _register(overload: OpOverload, fn: Callable, name: str = "", donate: frozenset[str] = frozenset()) -> None:
    """`register_lowering`, its eager executable donating the arguments `donate` names (`kernels.donation`)."""
    lower(overload, donate=donate)(fn)
    run = dispatch.functional_kernel(LOWERINGS[overload])
    if donate:
        run = donation.kernel(name, [a.name for a in overload._schema.arguments], donate, run)
    library = torch.library.Library(overload.namespace, "IMPL")
    library.impl(overload, run, "PrivateUse1")
    _libraries.append(library)


def _define(name: str, lowering: Callable, schema: str, names: Sequence[str], grid: meshed.Grid | None) -> Any:
    """The custom op `name` of `lowering`: its CPU kernel and fake implementation, and over a mesh of several
    ranks (`grid`) its SPMD tpu kernel (otherwise the caller registers the lowering)."""
    if grid is None:
        op = torch.library.custom_op(name, _cpu_kernel(lowering), mutates_args=(), device_types="cpu", schema=schema)
        op.register_fake(_fake(lowering, name, names))
        return op
    op = torch.library.custom_op(
        name, meshed.no_cpu_kernel(name, grid), mutates_args=(), device_types="cpu", schema=schema
    )
    op.register_fake(meshed.spmd_fake(lowering, name, grid))
    lower(op._opoverload)(lowering)  # what a compiled graph's SPMD program over the mesh inlines
    hooks.mesh_ops[op._opoverload] = (grid.ranks, grid.shape, grid.names)
    library = torch.library.Library(op._opoverload.namespace, "IMPL")
    library.impl(op._opoverload, meshed.spmd_kernel(lowering, name, names, grid), "PrivateUse1")
    _libraries.append(library)
    return op


def jax_op(
    name: str,
    fn: Callable,
    *,
    donate_argnums: int | Sequence[int] | None = None,
    mesh: Any = None,
    x64: bool = False,
    interpret: Any = None,
) -> torch._library.custom_ops.CustomOpDef:
    """`fn`, a JAX or Pallas function, as the PyTorch op `name` ("namespace::name"), callable on tpu and CPU tensors.

    Args:
        name: the op's qualified name; `torch.ops.namespace.name` afterwards.
        fn: its parameters annotated `jax.Array`, `Optional[jax.Array]`, `list[jax.Array]` (tensors) or
            `int`/`float`/`bool`/`str` (static: compiled in, one program per value); its return `jax.Array`, a
            tuple of them or a list of them.
        donate_argnums: indices of tensor parameters whose buffers eager's executable may reuse for the outputs,
            as `jax.jit`'s: a donated tpu tensor is consumed by the call (reading it afterwards raises, naming the
            op and argument); refused for inputs that require grad or share storage (`kernels.donation`).
        mesh: a DeviceMesh or jax.sharding.Mesh: `fn` runs under `jax.shard_map` over its axes (their names
            usable in `fn`'s collectives), each tensor this rank's block; over several ranks the op is collective,
            one SPMD program over the mesh's devices, in eager, autograd and compiled graphs (`kernels.meshed`).
        x64: trace with 64-bit types (off by default: Mosaic rejects them; 64-bit inputs are narrowed to 32 bits).
        interpret: how `pallas_call`s run on the CPU platform (see the module's docstring).

    Returns:
        The `torch.library.custom_op`, with a fake implementation (`jax.eval_shape`), autograd (`jax.vjp`;
        `op.register_autograd(...)` replaces it) and a CPU kernel.

    Example:
        >>> op = torch.tpu.pallas.jax_op("mylib::scaled_gelu", scaled_gelu)
        >>> out = op(a, b, 0.5)
    """
    if "::" not in name:
        raise ValueError(f"torch_tpu: jax_op name {name!r} must be 'namespace::name'")
    sig = signature.of(name, fn)
    grid = meshed.axes(name, mesh)
    spanning = grid is not None and grid.ranks is not None  # a collective op: one SPMD program over the mesh
    if grid is not None and not spanning:
        fn = meshed.under(fn, grid.shape, grid.names, _trace_device)
    donate = donation.names(name, sig, donate_argnums)
    if spanning and donate:
        raise NotImplementedError(f"torch_tpu: jax_op {name!r}: donate_argnums with mesh= over several devices")
    kinds = tuple((p.name, p.kind) for p in sig.params)
    names = [p.name for p in sig.params]
    forward = functools.partial(_forward, fn, x64, interpret, sig.returns)
    backward = functools.partial(_backward, fn, x64, interpret, kinds)
    op = _define(name, forward, sig.schema, names, grid if spanning else None)
    if not spanning:
        _register(op._opoverload, forward, name, donate)

    statics = ", ".join(f"{p.type} {p.name}" for p in sig.statics)
    vjp_schema = (
        f"(Tensor[] _primals, Tensor[] _cotangents, int[] _counts{', ' if statics else ''}{statics}) -> Tensor[]"
    )
    vjp_names = ["_primals", "_cotangents", "_counts", *(p.name for p in sig.statics)]
    vjp = _define(f"{name}_vjp", backward, vjp_schema, vjp_names, grid if spanning else None)
    refuse_setup, refuse = _no_double_backward(name)
    vjp.register_autograd(refuse, setup_context=refuse_setup)
    if not spanning:
        register_lowering(vjp, backward)
    setup_context, backward_fn = _autograd(sig, vjp)
    op.register_autograd(backward_fn, setup_context=setup_context)
    return op
