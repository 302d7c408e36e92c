"""Device storage: a torch storage whose Python object holds the device buffer (a jax.Array).

A storage is untyped bytes with a fake, never-dereferenced data pointer; the `DeviceBuffer` set as an attribute
on its Python object lives exactly as long as the storage (through any tensor or view). Tensors of any dtype,
size, stride and offset read and write it; PyTorch's own metadata kernels make the views.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import metrics
from torch_tpu.runtime import checks, compat, deferred, dtypes, float64, helpers, platform
from torch_tpu.runtime import memory as _memory
from torch_tpu.runtime.mapping import RESHAPE, WHOLE_BUFFER, classify
from torch_tpu.runtime.strided import bitcast_flat, gather, scatter

_ATTR = "_tpu_buffer"
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed
_create_empty = compat.create_empty_tensor
_construct_storage = compat.storage_from_data_pointer
_CAN_SWAP_POINTER = compat.STORAGE_SWAPS_DATA_POINTER
_DEVICE = torch.device("tpu", 0)
_JAX_DTYPE = dtypes.JAX_DTYPES
_CANONICAL = {jdtype: jdtype for jdtype in _JAX_DTYPE.values()}  # an equal dtype -> the registry's object
_Pending = deferred.Pending
_pending_buffers = deferred.buffers
_weakref = weakref.ref


memory = _memory.memory
_SMALL_POOL = _memory.SMALL_POOL_BYTES


class _AddressSpace:
    """Fake, non-overlapping data pointers: torch compares them for aliasing and overlap checks.

    Storages up to 1 MiB get consecutive 1 MiB slots (a lock-free counter); larger ones a locked bump
    allocator in a separate, higher range.
    """

    _SLOT = 1 << 20

    def __init__(self) -> None:
        self._slots = itertools.count(1 << 24)
        self._next_large = 1 << 62
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> int:
        if nbytes <= self._SLOT:
            return next(self._slots) * self._SLOT
        with self._lock:
            address = self._next_large
            self._next_large += (nbytes + 2 * self._SLOT - 1) // self._SLOT * self._SLOT
            return address


_addresses = _AddressSpace()


class DeviceBuffer:
    """The device value of one storage: `nbytes` bytes held as a jax.Array of any shape and dtype.

    `array` is None until first written or read (an `empty` storage costs no device allocation);
    a read of an unwritten buffer sees zeros.
    """

    __slots__ = ("_array", "nbytes", "dtype", "shape", "__weakref__")

    def __init__(
        self, nbytes: int, dtype: np.dtype, array: jax.Array | None = None, shape: tuple[int, ...] | None = None
    ) -> None:
        self._array = array
        self.nbytes = nbytes
        self.dtype = dtype
        self.shape = shape if shape is not None or array is None else array.shape
        if type(array) is _Pending:  # deferred.track(self), inlined: Fused mode makes a pending buffer per op
            _pending_buffers[id(self)] = _weakref(self)
        if nbytes > _SMALL_POOL:  # memory.acquire(nbytes), inlined for the small pool: every op output is one
            memory.add_large(nbytes)
        elif nbytes:
            stats = memory
            stats.allocated += nbytes
            stats.total += nbytes
            stats.num_alloc += 1
            if stats.allocated > stats.running_peak:
                stats.running_peak = stats.allocated
            live = stats.num_alloc - stats.num_free
            if live > stats.running_count_peak:
                stats.running_count_peak = live

    def __del__(self) -> None:
        nbytes = self.nbytes
        if nbytes > _SMALL_POOL:  # memory.release(nbytes), inlined
            memory.free_large(nbytes)
        elif nbytes:
            stats = memory
            stats.allocated -= nbytes
            stats.num_free += 1
        if type(self._array) is _Pending:
            _pending_buffers.pop(id(self), None)

    @property
    def array(self) -> jax.Array:
        if self._array is None:
            self.array = _zeros_of((self.nbytes // self.dtype.itemsize,), self.dtype)
        return self._array

    @array.setter
    def array(self, value: jax.Array) -> None:
        """`value` as the array, its dtype as the registry's own object (an executable's outputs may carry an equal
        dtype that is another object, and `mapping.classify`'s first test compares by identity)."""
        self._array = value
        self.dtype = _CANONICAL.get(value.dtype, value.dtype)
        self.shape = value.shape
        if type(value) is _Pending:
            deferred.track(self)


@functools.lru_cache(maxsize=4096)
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def _new_storage(buffer: DeviceBuffer) -> torch.UntypedStorage:
    nbytes = buffer.nbytes
    storage = _construct_storage(_addresses.take(nbytes), _DEVICE, nbytes)
    setattr(storage, _ATTR, buffer)
    return storage


def storage_nbytes(shape: tuple[int, ...], stride: tuple[int, ...], itemsize: int) -> int:
    if any(s == 0 for s in shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))) * itemsize


def empty(shape: tuple[int, ...], dtype: torch.dtype, stride: tuple[int, ...] | None = None) -> torch.Tensor:
    """A `tpu` tensor whose storage is allocated lazily."""
    shape = tuple(shape)
    stride = contiguous_strides(shape) if stride is None else tuple(stride)
    jdtype = dtypes.to_jax(dtype)
    nbytes = storage_nbytes(shape, stride, jdtype.itemsize)
    tensor = _create_empty(shape, dtype)
    _set_storage(_CPU_KEYS, tensor, _new_storage(DeviceBuffer(nbytes, jdtype)), 0, shape, stride)
    return tensor


_layouts: dict[tuple, tuple] = {}


def layout(shape: tuple[int, ...], jdtype: np.dtype) -> tuple:
    """How `wrap_as` lays out a fresh array of `shape` and `jdtype`: (shape, torch dtype, jax dtype, nbytes);
    cached, as shapes repeat. The jax dtype is the registry's own object where equal: an executable's outputs may
    carry an equal dtype that is another object, and `mapping.classify`'s first test compares by identity."""
    found = _layouts.get((shape, jdtype))
    if found is None:
        torch_dtype = dtypes.to_torch(jdtype)
        jdtype = _CANONICAL.get(jdtype, jdtype)
        found = _layouts[shape, jdtype] = (shape, torch_dtype, jdtype, math.prod(shape) * jdtype.itemsize)
    return found


_SLOT = _AddressSpace._SLOT
_small_slots = _addresses._slots


def wrap_as(array: Any, layout: tuple) -> torch.Tensor:
    """A new contiguous `tpu` tensor owning `array`, whose shape and dtype `layout` (from `layout()`) gives.

    The dispatcher keeps the layout with each executable, so this path reads nothing from the array. It is the
    eager hot path, so it avoids `set_` (as in `empty`), whose boxed call converts every argument: the tensor is
    made with its sizes and contiguous strides but an empty storage, and that storage takes the data pointer and
    size of one made at a fresh fake address.
    """
    shape, torch_dtype, jdtype, nbytes = layout
    tensor = _create_empty(shape, torch_dtype)
    if not _CAN_SWAP_POINTER:  # this torch cannot repoint a storage (runtime/compat.py): `set_`, as `empty` does
        buffer = DeviceBuffer(nbytes, jdtype, array, shape)
        _set_storage(_CPU_KEYS, tensor, _new_storage(buffer), 0, shape, contiguous_strides(shape))
        return tensor
    storage = tensor.untyped_storage()
    storage._swap_data_ptr_(
        _construct_storage(next(_small_slots) * _SLOT if nbytes <= _SLOT else _addresses.take(nbytes), _DEVICE, nbytes)
    )
    storage._tpu_buffer = DeviceBuffer(nbytes, jdtype, array, shape)
    return tensor


def wrap(array: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous `tpu` tensor owning `array` (cast to `dtype` if given)."""
    if dtype is not None and array.dtype != _JAX_DTYPE.get(dtype):
        target = dtypes.to_jax(dtype)
        array = deferred.apply(("astype", target), lambda a: a.astype(target), array)
    return wrap_as(array, layout(array.shape, array.dtype))


def resize(storage: torch.UntypedStorage, nbytes: int) -> torch.UntypedStorage:
    """`UntypedStorage.resize_` of a `tpu` storage, in place: its first min(old, new) bytes are kept and new bytes
    read as zeros; resizing to 0 drops the device array, so its memory is released (and `memory_allocated` drops)
    as soon as nothing else holds it. FSDP2 frees and regrows unsharded parameters this way.

    The storage gets a fresh fake address of the new size (a CUDA resize reallocates too); every tensor on it keeps
    its metadata, and one that no longer fits a storage resized to 0 raises when read or written (`check_fits`;
    CPU reads freed memory)."""
    if nbytes < 0:
        raise RuntimeError(f"torch_tpu: UntypedStorage.resize_: size must be non-negative, got {nbytes}")
    if not _CAN_SWAP_POINTER:
        raise NotImplementedError(
            f"torch_tpu: UntypedStorage.resize_ of a tpu storage needs torch >= 2.12 (a storage's size is changed "
            f"through UntypedStorage._swap_data_ptr_, which torch {torch.__version__} lacks)"
        )
    buffer = getattr(storage, _ATTR)
    old = buffer.nbytes
    if nbytes == old:
        return storage
    array = buffer._array
    if type(array) is _Pending:
        _pending_buffers.pop(id(buffer), None)
    if array is None or nbytes == 0:
        buffer._array = None
        buffer.shape = None
    else:
        buffer.array = _call(_resized, (array,), (nbytes,))
    buffer.nbytes = nbytes
    memory.release(old)  # as CUDA's resize: the old block freed, a new one allocated
    memory.acquire(nbytes)
    if old and nbytes:  # torch swaps a storage's pointer and size only with a storage of its size or of 0 bytes
        storage._swap_data_ptr_(_construct_storage(0, _DEVICE, 0))
    storage._swap_data_ptr_(_construct_storage(_addresses.take(nbytes), _DEVICE, nbytes))
    return storage


@functools.partial(jax.jit, static_argnums=1)
def _resized(array: jax.Array, nbytes: int) -> jax.Array:
    """`array`'s first `nbytes` bytes, zero-padded: flat at its own dtype where the sizes allow, else as bytes."""
    flat = array.reshape(-1)
    itemsize = array.dtype.itemsize
    if nbytes % itemsize or array.dtype == np.bool_ or dtypes.is_complex(array.dtype):
        flat, itemsize = bitcast_flat(flat, np.dtype(np.uint8)), 1
    count = nbytes // itemsize
    return flat[:count] if count <= flat.shape[0] else jnp.pad(flat, (0, count - flat.shape[0]))


def check_fits(tensor: torch.Tensor, buffer: DeviceBuffer, shape: tuple[int, ...], stride: tuple[int, ...]) -> None:
    """Raise if `tensor` (`shape`, `stride`) reaches past its storage's bytes: a storage resized smaller (FSDP2's
    freed parameters) under a tensor still shaped for it. (CPU reads such memory unchecked.)"""
    itemsize = tensor.element_size()
    needed = storage_nbytes(shape, stride, itemsize)
    if needed and needed + tensor.storage_offset() * itemsize > buffer.nbytes:
        raise RuntimeError(
            f"torch_tpu: a {tensor.dtype} tensor of shape {tuple(shape)} at storage offset {tensor.storage_offset()} "
            f"needs {needed + tensor.storage_offset() * itemsize} bytes but its storage holds {buffer.nbytes} "
            "(resized with untyped_storage().resize_); resize the storage back before using the tensor"
        )


def install() -> None:
    """Route `torch.UntypedStorage.resize_` of `tpu` storages to `resize` (PyTorch asks the PrivateUse1 hooks'
    `resizePrivateUse1Bytes`, which Python hooks cannot provide); other storages keep PyTorch's own (idempotent)."""
    original = torch.UntypedStorage.resize_
    if getattr(original, "_torch_tpu", False):
        return

    @functools.wraps(original)
    def resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        if hasattr(self, _ATTR):
            return resize(self, int(size))
        return original(self, size)

    resize_._torch_tpu = True
    torch.UntypedStorage.resize_ = resize_


def buffer_of(tensor: torch.Tensor) -> DeviceBuffer:
    """The DeviceBuffer of a `tpu` tensor."""
    try:
        return getattr(tensor.untyped_storage(), _ATTR)
    except AttributeError:
        raise RuntimeError(f"torch_tpu: tensor on {tensor.device} has no tpu device buffer") from None


def read(tensor: torch.Tensor) -> jax.Array:
    """The value of a `tpu` tensor as a jax.Array of its shape and dtype (its conjugate and negative bits not
    applied: `value`)."""
    buffer = buffer_of(tensor)
    found = classify(tensor, buffer, tensor.shape, tensor.dtype)
    if found is WHOLE_BUFFER:
        return buffer._array
    kind, jdtype, shape, stride, offset = found
    if buffer._array is None:  # unwritten, or freed by resize_(0)
        check_fits(tensor, buffer, shape, stride)
    if kind == RESHAPE:
        if buffer._array is None:  # unwritten: zeros in the tensor's shape, which later reads then take as is
            buffer.array = array = _zeros_of(shape, buffer.dtype)
            return array
        return _call(_reshape, (buffer._array,), (shape,))
    return _call(gather, (buffer.array,), (jdtype, shape, stride, offset))


def value(tensor: torch.Tensor) -> jax.Array:
    """The tensor's logical value: `read` with PyTorch's lazy conjugate and negative bits applied."""
    array = read(tensor)
    if tensor.is_conj():
        array = deferred.apply(("conj",), jnp.conj, array)
    if tensor.is_neg():
        array = deferred.apply(("neg",), jnp.negative, array)
    return array


def holds(tensor: torch.Tensor, array: Any) -> bool:
    """Whether `tensor`'s storage holds `array` itself: what `read` gives for a tensor that is all of its storage,
    so that `write` of a value of its shape and dtype replaces that array."""
    return buffer_of(tensor)._array is array


def write(tensor: torch.Tensor, value: jax.Array) -> None:
    """Store `value` (broadcast and cast to the tensor) through `tensor` into its storage, as CPU would."""
    buffer = buffer_of(tensor)
    size = tensor.shape
    found = classify(tensor, buffer, size, tensor.dtype)
    conj, neg = tensor.is_conj(), tensor.is_neg()
    if found is WHOLE_BUFFER and not (conj or neg) and getattr(value, "shape", None) == size:
        if value.dtype == buffer.dtype:  # an in-place op's common case: `value` replaces the array as is
            buffer._array = value
            if type(value) is _Pending:
                deferred.track(buffer)
            return
    if conj:
        value = deferred.apply(("conj",), jnp.conj, value)
    if neg:
        value = deferred.apply(("neg",), jnp.negative, value)
    kind, jdtype, shape, stride, offset = found
    if found is WHOLE_BUFFER or kind == RESHAPE:  # `value` replaces the array, broadcast and cast to the tensor
        shape = tuple(size)
        jdtype = buffer.dtype
        if getattr(value, "shape", None) != shape or value.dtype != jdtype:
            value = _call(_fit, (value,), (shape, jdtype))
        buffer.array = value
        return
    if math.prod(shape) == 0:  # an empty view writes nothing
        return
    if buffer._array is None:  # unwritten, or freed by resize_(0)
        check_fits(tensor, buffer, shape, stride)
    buffer.array = _call(scatter, (buffer.array, value), (jdtype, shape, stride, offset))


def _call(helper: Any, arrays: tuple, statics: tuple) -> Any:
    """A jitted storage helper on `arrays` (then its static arguments): now, or recorded in Fused mode."""
    return deferred.apply((helper.__name__, *statics), lambda *values: helper(*values, *statics), *arrays)


_zero_arrays: dict[tuple[tuple[int, ...], np.dtype], jax.Array] = {}
_memory.on_empty_cache(_zero_arrays.clear)


def _zeros_of(shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    """Zeros for a buffer read before it is written (`torch.ones` is `empty` then `fill_`, which reads it).

    Small ones are shared, as jax.Arrays are immutable (a write replaces a buffer's array): making them costs
    as much as several ops, and `ones_like`/`zeros`/`full` recur with the same shapes.
    """
    found = _zero_arrays.get((shape, dtype))
    if found is None:
        found = _zeros(shape, dtype)
        if math.prod(shape) * dtype.itemsize <= _AddressSpace._SLOT:
            if len(_zero_arrays) >= 256:
                _zero_arrays.clear()
            _zero_arrays[shape, dtype] = found
    return found


def _make_zeros(shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    return jnp.zeros(shape, dtype)


_zeros = helpers.Helper(_make_zeros, static_argnums=(0, 1), cold=helpers.host_fill)
copy_array = helpers.Helper(jnp.copy, ())
"""A new array equal to its argument (a donated input someone else holds is passed as one), from the persistent
tier: a warm process on a TPU host compiled it again, 0.7 s of the small whole step's first call."""


@functools.partial(jax.jit, static_argnums=1)
def _reshape(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return array.reshape(shape)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _fit(value: jax.Array, shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    return jnp.broadcast_to(jnp.asarray(value).astype(dtype), shape)


def to_device(host: torch.Tensor, index: int = 0) -> jax.Array:
    """Copy a CPU tensor to the device as a jax.Array of the same shape and dtype."""
    if host.dtype == torch.complex128 and platform.platform() == "tpu":  # XLA's TPU compiler aborts on it
        raise TypeError(
            "torch_tpu: torch.complex128 is not supported on the TPU; use torch.complex64, or keep it on CPU"
        )
    carrier = dtypes.host_carrier(host.dtype)
    host = host.detach().resolve_conj().resolve_neg().contiguous()
    array = (host.view(carrier) if carrier else host).numpy()
    if carrier:
        array = array.view(dtypes.to_jax(host.dtype))
    # A private copy (`put_copy`): the transfer may read the host memory after it returns (it is asynchronous; on
    # the CPU platform the device array may even alias it), and the caller may mutate its tensor right away.
    try:
        device_array = compat.put_copy(array, platform.device(index))
    except jax.errors.JaxRuntimeError as error:
        if _memory.is_oom(error):
            raise _memory.out_of_memory(error, array.nbytes, index) from error
        if float64.refusal("to", error, [array.dtype]) is not None:  # a 64-bit type the platform cannot hold
            raise TypeError(
                f"torch_tpu: {host.dtype} is not supported on the {platform.platform()} ({error})"
            ) from error
        raise
    metrics.transfers["host_to_device"] += 1
    metrics.transfer_bytes["host_to_device"] += array.nbytes
    return device_array


def to_host(array: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """Copy a device array to a new CPU tensor of `dtype` (waits for the value)."""
    try:
        array = deferred.concrete(array)
        checks.prefetch_pending()
        host = np.asarray(array)
    except jax.errors.JaxRuntimeError as error:  # the work that computes the value failed (asynchronous dispatch)
        if _memory.is_oom(error):
            raise _memory.out_of_memory(error) from error
        raise
    except RuntimeError as error:
        donated = donated_error(array)
        if donated is not None:
            raise donated from error
        raise
    metrics.transfers["device_to_host"] += 1
    metrics.transfer_bytes["device_to_host"] += host.nbytes
    checks.raise_pending()  # a value reaches the host: the device-side checks of the ops before it are due
    carrier = dtypes.host_carrier(dtype)
    if carrier:
        return torch.from_numpy(host.view(dtypes.to_jax(carrier)).copy()).view(dtype)
    return torch.from_numpy(np.array(host, copy=True))


# --- donated buffers -------------------------------------------------------------------------------------------

_donations: dict[int, tuple[Any, str]] = {}  # id(deleted array) -> (a weak reference to it, to what it was donated)


def alone(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is its storage's only tensor (no view or alias of it lives)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) <= 2  # its tensor and its Python object


def consume(tensor: torch.Tensor, to: str, keep: tuple = ()) -> None:
    """Leave `tensor`'s buffer consumed, as a donation (`to` says to what) leaves it: its array deleted (if the
    executable did not reuse it already), or, where it is also one of the outputs `keep`, replaced by a deleted
    one; a later read raises `donated_error`, and a whole write makes the buffer valid again."""
    buffer = buffer_of(tensor)
    array = buffer._array
    if not isinstance(array, jax.Array):
        return
    if not array.is_deleted():
        if any(array is k for k in keep):
            buffer._array = array = jnp.empty(array.shape, array.dtype)
        array.delete()
    for key in [k for k, v in _donations.items() if v[0]() is None]:
        del _donations[key]
    _donations[id(array)] = (weakref.ref(array), to)


def donated_error(array: Any) -> RuntimeError | None:
    """The error for reading a deleted array that a donation left in a buffer (`consume`), else None."""
    if not isinstance(array, jax.Array) or not array.is_deleted():
        return None
    found = _donations.get(id(array))
    if found is None or found[0]() is not array:
        return None
    return RuntimeError(
        f"torch_tpu: this tensor was donated to {found[1]} (donate_argnums) and holds no value; write it whole "
        f"(e.g. `copy_`) before reading it again, or do not donate it"
    )


def raise_if_donated(tensors: Any) -> None:
    """Raise `donated_error` for the first `tpu` tensor among `tensors` (nested lists too) a donation consumed."""
    for value in tensors:
        if isinstance(value, (list, tuple)):
            raise_if_donated(value)
        elif isinstance(value, torch.Tensor) and value.device.type == "tpu":
            buffer = getattr(value.untyped_storage(), _ATTR, None)  # None: a fake tensor
            error = None if buffer is None else donated_error(buffer._array)
            if error is not None:
                raise error
