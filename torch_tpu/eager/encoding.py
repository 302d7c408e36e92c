"""Argument encoding: an eager op call's arguments as its cache key, its run-time inputs and its template.

Each argument kind of an op's schema (`kind`) has an encoder. `encode(op, value, key, leaves)` appends, in one
pass, the argument's part of the cache key to `key` and its run-time inputs to `leaves`, and returns its template
(the argument as the lowering sees it, each run-time input an `Input`), which `fill` turns back into values in the
trace. How a `tpu` tensor is read follows its mapping onto its buffer (`mapping.classify`): the whole buffer is its
array; a reshape or a view at the buffer's dtype is the buffer's array read inside the executable, its layout in
the key and a non-zero offset a run-time input (one program per layout); a view at another dtype, or with
conjugate or negative bits set, is read (gathered) first, by `storage.value`. Python numbers that recur become
device arrays (cached by value), so an executable does not transfer them on every call.

This is the eager hot path: encoders are closures over their settings, and the common case (a tensor that is its
whole buffer) costs two attribute reads and three appends.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload

from torch_tpu.runtime import compat, memory, platform, storage, strided
from torch_tpu.runtime.deferred import Pending
from torch_tpu.runtime.mapping import GATHER, WHOLE_BUFFER, classify

_MAX_SCALARS = 4096
MAX_STATIC_OFFSETS = int(os.environ.get("TORCH_TPU_FUSED_STATIC_OFFSETS", "8"))
"""How many offsets of one view layout of a Fused cluster's own value are compiled into its programs
(`_static_offset`); 0: every offset is a run-time input."""
_TENSOR_LIST_TYPES = ("Tensor[]", "Tensor?[]", "List[Tensor]", "List[Optional[Tensor]]")


class Input:
    """A run-time input in a call's template, in the order the encoders took them: the next input as it is
    (`NEXT`); a buffer's whole array read through `view`, (shape, stride, `strided.aligned`), inside the
    executable (`strided.read_view`), its storage offset the input after it when `offset`, else `at` (compiled
    in: `_static_offset`); or a list of `count` Python numbers packed into one array (`packed`)."""

    __slots__ = ("view", "offset", "count", "at")

    def __init__(self, view: tuple | None = None, offset: bool = False, count: int | None = None, at: int = 0) -> None:
        self.view = view
        self.offset = offset
        self.count = count
        self.at = at


NEXT = Input()
Encoder = Callable[[OpOverload, Any, list, list], Any]


def kind(argument: torch._C.Argument, static: frozenset[str], scalars: frozenset[str] = frozenset()) -> str:
    """The encoder an argument of a schema takes (a lowering's `static` and `scalars` names override its type)."""
    text = str(argument.type)
    if argument.name == "scalars" or text == "List[number]" and argument.name not in static:
        return "scalars"
    if text in ("Tensor", "Optional[Tensor]"):
        return "tensor"
    if text in _TENSOR_LIST_TYPES:
        return "tensors"
    if text in ("number", "Optional[number]") and argument.name not in static or argument.name in scalars:
        return "scalar"
    if "Generator" in text:
        return "generator"
    return "static"


@functools.cache
def encoders(math_bits: bool, jit: bool) -> dict[str, Encoder]:
    """The encoder of each argument kind, for a lowering (`jit`: Python numbers may become device arrays) whose
    kernel can see conjugate and negative bits set (`math_bits`); made once per combination and shared by every
    op's `Runner` (~1,400 of them, made at import)."""
    number = _number_encoder(jit)
    tensor = _tensor_encoder(math_bits, jit, number, alone=True)
    element = _tensor_encoder(math_bits, jit, number, alone=False)

    def tensors(op: OpOverload, value: Any, key: list, leaves: list) -> Any:
        if isinstance(value, torch.Tensor):
            return element(op, value, key, leaves)
        return [element(op, v, key, leaves) for v in value]

    def scalar(op: OpOverload, value: Any, key: list, leaves: list) -> Any:
        if value is None:
            key.append(None)
            return None
        return number(value, key, leaves)

    def static(op: OpOverload, value: Any, key: list, leaves: list) -> Any:
        key.append(tuple(value) if isinstance(value, list) else value)
        return value

    def generator(op: OpOverload, value: Any, key: list, leaves: list) -> None:
        return None  # a random op's key is drawn from it after the arguments (`Runner.inputs`)

    return {
        "tensor": tensor,  # Tensor and Tensor? (an absent one is None)
        "tensors": tensors,
        "scalar": scalar,
        "scalars": _scalars_encoder(jit, scalar),
        "static": static,
        "generator": generator,
    }


def _number_encoder(jit: bool) -> Callable[[Any, list, list], Input]:
    def number(value: Any, key: list, leaves: list) -> Input:
        key.append(type(value))
        leaves.append(_device_scalar(value) if jit else value)
        return NEXT

    return number


def _scalars_encoder(jit: bool, scalar: Encoder) -> Encoder:
    def scalars(op: OpOverload, value: Any, key: list, leaves: list) -> Any:
        """Foreach ops' per-tensor scalars (a step's values; a host tensor of them, as on CUDA)."""
        values = value.tolist() if isinstance(value, torch.Tensor) else value
        packed = _packed(values) if jit else None
        if packed is None:
            return [scalar(op, v, key, leaves) for v in values]
        key.append((packed, len(values)))
        leaves.append(np.array(values, np.float64 if packed is float else np.int64))
        return Input(count=len(values))

    return scalars


def _packed(values: list) -> type | None:
    """The type of a list of Python numbers that travels as one array — all floats, or all ints within int64 (a
    foreach op's per-step scalars: one transfer instead of one per tensor) — else None (each its own input)."""
    if not values:
        return None
    first = type(values[0])
    if first is float and all(type(v) is float for v in values):
        return float
    if first is int and all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
        return int
    return None


def _tensor_encoder(math_bits: bool, jit: bool, number: Callable, alone: bool) -> Encoder:
    """A tensor argument's encoder (`alone`: not an element of a list, where a CPU tensor must be 0-dim)."""
    through_buffer = _buffer_reader(jit)

    def tensor(op: OpOverload, value: Any, key: list, leaves: list) -> Any:
        try:
            buffer = value.untyped_storage()._tpu_buffer
        except AttributeError:  # a wrapped number (a Python scalar), None, a CPU tensor
            return _elsewhere(op, value, key, leaves, alone, number)
        shape = value.shape
        dtype = value.dtype
        found = classify(value, buffer, shape, dtype)
        if found is WHOLE_BUFFER and not (math_bits and (value.is_conj() or value.is_neg())):
            leaves.append(buffer._array)  # the common case: the input is the array, shape and dtype read once
            key.append(shape)
            key.append(dtype)
            return NEXT
        return through_buffer(value, buffer, found, key, leaves)

    return tensor


def _buffer_reader(jit: bool) -> Callable[[torch.Tensor, Any, tuple, list, list], Input]:
    def through_buffer(value: torch.Tensor, buffer: Any, found: tuple, key: list, leaves: list) -> Input:
        """A `tpu` tensor that is not its whole buffer as it is (or has math bits set), `found` its mapping."""
        if buffer._array is None:  # written (zeros) first: a read of an unwritten buffer sees zeros
            storage.read(value)
            found = classify(value, buffer, value.shape, value.dtype)
        mapping, _, shape, stride, offset = found
        template = NEXT
        if mapping == GATHER or value.is_conj() or value.is_neg():
            leaves.append(storage.value(value))
        elif found is WHOLE_BUFFER:
            leaves.append(buffer._array)
        elif offset and _static_offset(buffer._array, (buffer.shape, stride, shape), offset):
            key.append((buffer.shape, stride, "at", offset))
            leaves.append(buffer._array)
            template = Input((shape, stride, False), at=offset)
        else:  # RESHAPE, VIEW: the offset is a run-time input, so one program serves a layout at every offset
            aligned = bool(offset) and strided.aligned(shape, stride, offset, math.prod(buffer.shape))
            key.append((buffer.shape, stride, offset == 0, aligned))
            leaves.append(buffer._array)
            if offset:
                leaves.append(_device_scalar(offset) if jit else offset)
            template = Input((shape, stride, aligned), offset=bool(offset))
        key.append(value.shape)
        key.append(value.dtype)
        return template

    return through_buffer


_offsets_seen: dict[tuple, set[int]] = {}


def _static_offset(array: Any, layout: tuple, offset: int) -> bool:
    """Whether a view's non-zero offset is compiled into the program rather than a run-time input: for a value
    of the Fused cluster being recorded (e.g. the k and v heads split out of a qkv projection), where a run-time
    offset costs a dynamic slice and its index arithmetic that XLA cannot fold into the neighbouring ops. A layout
    read at more than `MAX_STATIC_OFFSETS` offsets (a loop moving a window) takes them at run time from then on,
    so such a loop compiles at most that many clusters more."""
    if type(array) is not Pending or array.value is not None or array.sealed:
        return False
    seen = _offsets_seen.setdefault(layout, set())
    if offset in seen:
        return True
    if len(seen) >= MAX_STATIC_OFFSETS:
        return False
    seen.add(offset)
    return True


def _elsewhere(op: OpOverload, value: Any, key: list, leaves: list, alone: bool, number: Callable) -> Any:
    """Not a `tpu` tensor: absent (None), a number or a CPU tensor — a 0-dim one alone, any one in a list (e.g.
    indices, moved as on CUDA)."""
    if value is None:
        key.append(None)
        return None
    if not isinstance(value, torch.Tensor):
        return number(value, key, leaves)
    if not value.is_cpu:
        storage.buffer_of(value)  # raises, naming the device
    if value.dim() != 0 and alone:
        raise device_mismatch(op, value)
    key.append("host")
    leaves.append(_host_scalar(value) if value.dim() == 0 else storage.to_device(value))
    key.append(value.shape)
    key.append(value.dtype)
    return NEXT


def device_mismatch(op: OpOverload, tensor: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, tpu:0 and "
        f"{tensor.device}! (when checking argument for {op})"
    )


def fill(template: Any, values: Iterator) -> Any:
    """An argument's template with its run-time inputs taken from `values`, in order."""
    if type(template) is Input:
        value = next(values)
        if template.view is not None:
            shape, stride, aligned = template.view
            if template.at:
                return strided.gather(value, value.dtype, shape, stride, template.at)
            return strided.read_view(value, shape, stride, next(values) if template.offset else 0, aligned)
        if template.count is not None:  # packed Python numbers: weakly typed again, as Python numbers trace
            return [compat.convert_element_type(value[i], weak_type=True) for i in range(template.count)]
        return value
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


_scalars: dict[Any, Any] = {}
memory.on_empty_cache(_scalars.clear)


def _device_scalar(value: Any) -> Any:
    """A Python scalar run-time input, as a device array of the same (weak) type once the value recurs.

    An executable transfers a Python scalar to the device on every call, but takes an array as it is; making
    the array costs about three such transfers, so a value becomes one (cached by value) on its second use —
    constants such as betas, eps or 0.5 do, a per-step value such as a bias correction stays a Python scalar.
    Fused mode too: there a Python scalar costs a cluster call ~1.5 µs against ~0.35 µs for an array. Data-
    dependent (non-jit) lowerings keep Python scalars, as they may branch on them.
    """
    value_type = type(value)
    if value_type is float:
        key = value.hex()  # tells -0.0 from 0.0
    elif value_type is int or value_type is bool:
        key = (value_type, value)
    elif value_type is complex and platform.platform() == "tpu":
        found = _recurring((complex, value.real.hex(), value.imag.hex()), _complex64, value)
        return _complex64(value) if found is None else found
    else:
        return value
    found = _recurring(key, _scalar_array, value)
    return value if found is None else found


def _complex64(value: complex) -> jax.Array:
    """A Python complex on a TPU, as a weakly typed complex64 array: JAX makes it a complex128 input, which XLA's
    TPU compiler aborts the process on (seen converting one to complex64), and the op computes with the scalar at
    its own width, as PyTorch does; a TPU holds no complex128 (a complex128 result is refused: runtime/float64.py)."""
    platform.devices()
    return compat.convert_element_type(jnp.asarray(value, jnp.complex64), weak_type=True)


def _scalar_array(value: bool | int | float) -> Any:
    """The value as a device array typed as JAX types the Python number (weakly, but a bool). A transfer:
    `jnp.asarray` would compile a program for it (`jit(stage)`) in every process, ~0.35 s on a TPU."""
    platform.devices()  # x64 is configured before the first array is made
    try:
        return jax.device_put(value)
    except OverflowError:  # an int beyond int64: the executable reports it, as before
        return value


def _host_scalar(value: torch.Tensor) -> jax.Array:
    """A 0-dim CPU tensor (a loss scale, a `torch.tensor(2.0)` in user code) on the device, cached by dtype and
    value once the value recurs, as a Python scalar is: each transfer costs a hundred small ops."""
    if value.dtype == torch.complex128 and platform.platform() == "tpu":  # see `_complex64`: at the op's width
        value = value.to(torch.complex64)
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
