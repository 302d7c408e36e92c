"""`jax_op(..., donate_argnums=...)`: the donated tensors' buffers are the eager executable's to reuse.

As in JAX (`jax.jit(donate_argnums=...)`), a donated argument is consumed by the call: its executable is compiled
with the argument's array donated (XLA reuses the memory for an output of the same shape and dtype), and afterwards
the tensor holds no value: whether or not XLA could reuse the memory, its array is deleted, and reading the tensor
raises an error naming the op and the argument (`storage.donated_error`); writing it whole (`copy_`, `fill_`)
makes it valid again. Donation is refused, before anything runs, where it would be wrong:

- the argument requires grad, or any argument does (the gradient, `jax.vjp` recomputing the forward, reads every
  input; detach them, or do not donate);
- the tensor is not its storage's whole buffer (a slice, a strided view, conjugate or negative bits), or another
  tensor shares its storage (a view or alias of it still lives, or it is passed as another argument too): the
  donation would consume that tensor as well.

An array that something else also holds (another storage after a `copy_`, a `torch_tpu.to_jax` result) is copied
first, so that only the tensor's own memory is donated. CPU tensors (the op's reference kernel) and compiled graphs
(`torch.compile(backend="tpu")`: the op is inlined into the graph's program, whose inputs are not donated) donate
nothing: their inputs keep their values. Fused mode runs the pending cluster, then the op on its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_tpu.eager import fused
from torch_tpu.kernels import signature
from torch_tpu.kernels.signature import STATIC
from torch_tpu.runtime import deferred, storage
from torch_tpu.runtime.mapping import WHOLE_BUFFER, classify


def names(name: str, sig: signature.Signature, donate_argnums: Any) -> frozenset[str]:
    """The names of the parameters `donate_argnums` (an index or indices into `fn`'s parameters) donates."""
    if donate_argnums is None:
        return frozenset()
    numbers = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    for number in numbers:
        if (
            isinstance(number, bool)
            or not (isinstance(number, int) and 0 <= number < len(sig.params))
            or sig.params[number].kind == STATIC
        ):
            raise ValueError(f"torch_tpu: jax_op {name!r}: donate_argnums {number!r} is not a tensor argument's index")
    return frozenset(sig.params[number].name for number in numbers)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _storage_id(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _refuse(name: str, arg: str, why: str) -> ValueError:
    return ValueError(f"torch_tpu: jax_op {name!r}: cannot donate argument {arg!r} (donate_argnums): {why}")


def _claim(name: str, values: dict[str, Any], donate: frozenset[str]) -> list[tuple[str, torch.Tensor]]:
    """The donated tensors of a call, each checked (see the module's docstring) and made its buffer's only holder
    of a concrete array."""
    everything = [(arg, t) for arg, value in values.items() for t in _tensors(value)]
    grads = [arg for arg, t in everything if t.requires_grad]
    claimed = []
    for arg in sorted(donate & values.keys()):
        for tensor in _tensors(values[arg]):
            if grads:
                raise _refuse(
                    name,
                    arg,
                    f"argument {grads[0]!r} requires grad, and the gradient recomputes the forward from every input "
                    f"(detach the inputs, or do not donate)",
                )
            if tensor.device.type != "tpu":
                raise _refuse(name, arg, f"it is a {tensor.device.type} tensor, not a tpu one")
            buffer = storage.buffer_of(tensor)
            whole = classify(tensor, buffer, tensor.shape, tensor.dtype) is WHOLE_BUFFER
            if not whole or tensor.is_conj() or tensor.is_neg():
                raise _refuse(name, arg, "it is a view of part of its storage; donate a contiguous copy (.clone())")
            mine = _storage_id(tensor)
            others = [a for a, t in everything if (a != arg or t is not tensor) and _storage_id(t) == mine]
            if others or not storage.alone(tensor):
                where = f"argument {others[0]!r}" if others else "another tensor (a view or alias of it)"
                raise _refuse(name, arg, f"its storage is shared with {where}, which the donation would consume too")
            claimed.append((arg, tensor))
    # a value still to compute is computed first, and so is all queued work, which may read what the call consumes
    if fused._sealed or any(deferred.is_pending(storage.buffer_of(t)._array) for _, t in claimed):
        fused.flush()
    for _, tensor in claimed:
        buffer = storage.buffer_of(tensor)
        array = buffer.array  # an unwritten buffer: its zeros
        if sys.getrefcount(array) > 3:  # the buffer, `array`, and the call's argument: anyone else holds it too
            buffer._array = storage.copy_array(array)
    return claimed


def kernel(name: str, params: Sequence[str], donate: frozenset[str], run: Callable) -> Callable:
    """The `tpu` kernel of a donating jax_op: `run` (the lowering's kernel, whose executable donates) between the
    donated tensors' checks and their consumption."""

    def donating(*args: Any, **kwargs: Any) -> Any:
        values = dict(zip(params, args, strict=False)) | kwargs
        claimed = _claim(name, values, donate)
        result = run(*args, **kwargs)
        outputs = tuple(storage.buffer_of(t)._array for t in _tensors(result))
        for arg, tensor in claimed:
            storage.consume(tensor, f"jax_op {name!r} (argument {arg!r})", keep=outputs)
        return result

    return donating
