"""Zero-copy exchange between `tpu` tensors and JAX arrays, directly and through DLPack.

A `tpu` tensor's storage holds a jax.Array (runtime/storage.py), so the exchange needs no copy: `to_jax` hands
out the array the storage holds and `from_jax` makes a tensor whose storage holds the given array. JAX arrays
are immutable, so a shared array is a snapshot: an in-place op on the tensor stores a new array in its storage
and the exported one keeps its value (nothing can write into a jax.Array). A tensor that is not its storage's
whole buffer in order (a slice, a transposed view, a dtype view, lazy conj/neg bits) has no array of its own,
and `to_jax` returns its value computed into a new one.

DLPack: PyTorch's own exporter would describe a `tpu` tensor by its storage's fake data pointer, so
`Tensor.__dlpack__`, `__dlpack_device__` and `torch.utils.dlpack.to_dlpack` hand out the jax.Array's capsule
instead (what `jax.dlpack.from_dlpack(tensor)` / `jnp.from_dlpack(tensor)` consume; JAX has no capsule for a TPU array,
so there the export raises BufferError naming `to_jax`); `torch.from_dlpack` of a
`tpu` tensor aliases it as on CUDA, and of a jax.Array on a GPU or TPU platform (which a CPU build of PyTorch
cannot import), or with `device="tpu"`, gives a `tpu` tensor. On the XLA CPU platform `torch.from_dlpack(jax_array)`
stays PyTorch's: a CPU tensor sharing the array's memory. A pinned CPU tensor (runtime/pinned.py) is ordinary
memory, so it reports kDLCPU rather than PyTorch's kDLCUDAHost.

(A top-level module, beside `tpu.py`: materialising a Fused-mode value is the eager layer's, which the runtime
layer below it does not import.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import torch
import torch.utils.dlpack

from torch_tpu.runtime import deferred, dtypes, pinned, platform, storage


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """The jax.Array holding `tensor`'s value: the storage's own array (no copy) when `tensor` is its storage's
    whole buffer in order, else its value computed into a new array. Waits for no device work."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu":
        kind = f"a tensor on {tensor.device}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"torch_tpu.to_jax: expected a tpu tensor, got {kind}")
    return deferred.concrete(storage.value(tensor.detach()))


def from_jax(array: jax.Array) -> torch.Tensor:
    """A `tpu` tensor whose storage holds `array` itself (no copy); `array` must live on the `tpu` device."""
    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
        raise TypeError(f"torch_tpu.from_jax: expected a concrete jax.Array, got {type(array).__name__}")
    if array.is_deleted():
        raise ValueError("torch_tpu.from_jax: the jax.Array has been deleted (donated)")
    where = array.devices()
    if len(where) != 1:
        raise ValueError(f"torch_tpu.from_jax: the array is sharded over {len(where)} devices; pass one shard")
    (device,) = where
    if device != platform.device(0):
        raise ValueError(
            f"torch_tpu.from_jax: the array is on {device}, not on the tpu device {platform.device(0)}; "
            "move it with jax.device_put(array, device) first (a copy)"
        )
    dtypes.to_torch(array.dtype)  # raises for a dtype torch has no match for
    return storage.wrap(array)


def _is_jax_array(value: Any) -> bool:
    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)


def _tpu_dlpack(tensor: torch.Tensor, kwargs: dict[str, Any]) -> Any:
    if tensor.requires_grad:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
    if kwargs.get("stream", None) == -1:  # PyTorch's "no synchronisation" default; JAX's spelling is None
        kwargs.pop("stream")
    try:
        return to_jax(tensor).__dlpack__(**kwargs)
    except BufferError as error:
        raise _no_capsule(error) from error
    except jax.errors.JaxRuntimeError as error:  # measured on a v5e: "TPU_0 cannot be used as a DLPack device"
        if "dlpack" not in str(error).lower():
            raise
        raise _no_capsule(error) from error


def _no_capsule(error: Exception) -> BufferError:
    """JAX's refusal to export a TPU array through DLPack, as a BufferError that names the zero-copy way."""
    return BufferError(
        f"torch_tpu: a tpu tensor has no DLPack capsule on the {platform.platform()} platform "
        f"({str(error).splitlines()[0]}); torch_tpu.to_jax(tensor) gives its jax.Array without a copy"
    )


def _dunder_dlpack(original: Callable) -> Callable:
    @functools.wraps(original)
    def __dlpack__(self: torch.Tensor, **kwargs: Any) -> Any:
        if self.device.type == "tpu":
            return _tpu_dlpack(self, kwargs)
        return original(self, **kwargs)

    return __dlpack__


def _dunder_dlpack_device(original: Callable) -> Callable:
    @functools.wraps(original)
    def __dlpack_device__(self: torch.Tensor) -> tuple:
        if self.device.type == "tpu":
            try:
                return to_jax(self).__dlpack_device__()
            except BufferError as error:  # JAX's TPU arrays: the error names the zero-copy way
                raise _no_capsule(error) from error
        if self.device.type == "cpu" and pinned.is_marked(self):  # ordinary host memory, not CUDA host memory
            return torch.utils.dlpack.DLDeviceType.kDLCPU, 0
        return original(self)

    return __dlpack_device__


def _to_dlpack(original: Callable) -> Callable:
    @functools.wraps(original)
    def to_dlpack(tensor: torch.Tensor) -> Any:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
            return _tpu_dlpack(tensor, {})
        return original(tensor)

    return to_dlpack


def _from_dlpack(original: Callable) -> Callable:
    @functools.wraps(original)
    def from_dlpack(ext_tensor: Any, *, device: Any = None, copy: bool | None = None) -> torch.Tensor:
        target = torch.device(device) if device is not None else None
        if isinstance(ext_tensor, torch.Tensor) and ext_tensor.device.type == "tpu":
            if target is None or target == ext_tensor.device or (target.type == "tpu" and target.index is None):
                return ext_tensor.detach().clone() if copy else ext_tensor.detach()
            if copy is False:
                raise ValueError(
                    f"cannot move DLPack tensor from device {ext_tensor.device} to {target} without copying. "
                    "Set copy=None or copy=True."
                )
            return ext_tensor.detach().to(target)
        if _is_jax_array(ext_tensor) and (
            (target is not None and target.type == "tpu") or (target is None and platform.platform() != "cpu")
        ):
            tensor = from_jax(ext_tensor)
            return tensor.clone() if copy else tensor
        return original(ext_tensor, device=device, copy=copy)

    return from_dlpack


_installed: list[bool] = []


def install() -> None:
    """Route PyTorch's DLPack entry points for `tpu` tensors and JAX arrays (idempotent)."""
    if _installed:
        return
    torch.Tensor.__dlpack__ = _dunder_dlpack(torch.Tensor.__dlpack__)
    torch.Tensor.__dlpack_device__ = _dunder_dlpack_device(torch.Tensor.__dlpack_device__)
    to_dlpack = _to_dlpack(torch.utils.dlpack.to_dlpack)
    from_dlpack = _from_dlpack(torch.utils.dlpack.from_dlpack)
    for module in (torch, torch.utils.dlpack):
        module.to_dlpack = to_dlpack
        module.from_dlpack = from_dlpack
    _installed.append(True)
