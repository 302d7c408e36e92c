"""Deferred values: a storage's buffer may hold a `Pending` value, whose shape and dtype are known and whose data
is not computed yet (eager's Fused mode records ops instead of running them, `eager.fused`).

Storages and kernels below eager only need the values themselves: `apply` a function to values that may be
pending, `track` a buffer that holds one, get a value's data with `concrete`. The recorder that makes pending
values and runs them lives in eager, above this layer: it fills `runtime.hooks`' `eager_state`, `record` and
`flush`; until it does, nothing is pending and `apply` just runs its function.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax

from torch_tpu.runtime.hooks import hooks


class Pending:
    """Output `ref` = (node, index) of the cluster being recorded; `value` is set once the cluster has run.
    `sealed`: its cluster has been cut and waits for its program (Fused eager's `ASYNC_COMPILE`), so a cluster
    recorded meanwhile takes the value as an input, not as one of its own nodes'; or the error that stopped its
    cluster, which a read of the value then names (`never_computed`)."""

    __slots__ = ("aval", "ref", "value", "sealed")

    def __init__(self, aval: jax.ShapeDtypeStruct, ref: tuple[int, int]) -> None:
        self.aval = aval
        self.ref = ref
        self.value: jax.Array | None = None
        self.sealed = False

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def dtype(self) -> Any:
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.aval.shape)

    @property
    def size(self) -> int:
        return self.aval.size

    @property
    def nbytes(self) -> int:
        return self.aval.size * self.aval.dtype.itemsize


buffers: dict[int, weakref.ref] = {}
"""The buffers holding pending values, by id: the next cluster must produce their values (a dying buffer removes
itself)."""


def is_pending(value: Any) -> bool:
    """Whether `value` is a recorded value not computed yet."""
    return type(value) is Pending and value.value is None


def apply(key: Hashable, fn: Callable, *inputs: Any) -> Any:
    """`fn(*inputs)` for the storage helpers (view gathers, scatters, casts): recorded in Fused mode, where it then
    fuses with the ops around it instead of running as its own executable, or when an input is pending; else run
    now. `key` must fix `fn`; the inputs' avals are added to it."""
    if hooks.eager_state.fused or any(type(x) is Pending and x.value is None for x in inputs):
        return hooks.record(key, fn, list(inputs))
    return fn(*[x.value if type(x) is Pending else x for x in inputs])


def track(buffer: Any) -> None:
    """`buffer` holds a Pending value: the next cluster must produce it (while the buffer lives)."""
    buffers[id(buffer)] = weakref.ref(buffer)


def concrete(value: Any) -> Any:
    """The computed value of `value`, running the pending cluster if needed."""
    if type(value) is not Pending:
        return value
    if value.value is None:
        hooks.flush([value])
        if value.value is None:
            raise never_computed(value)
    return value.value


def never_computed(value: Pending) -> RuntimeError:
    """The error of a read of a value whose cluster failed to compile or run (it raised then): no value, ever."""
    cause = value.sealed if isinstance(value.sealed, BaseException) else None
    error = RuntimeError(
        f"torch_tpu: a tpu tensor of shape {tuple(value.shape)} and dtype {value.dtype} has no value: the program "
        f"computing it (a Fused eager cluster, or a Strict op queued while it compiled) failed earlier"
        + (f" ({type(cause).__name__}: {cause})" if cause else "")
    )
    error.__cause__ = cause
    return error
