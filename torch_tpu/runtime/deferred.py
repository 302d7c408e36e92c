"""Deferred values: a storage's buffer may hold a `Pending` value, whose shape and dtype are known and whose data
is not computed yet (eager's Fused mode records ops instead of running them, `eager.fused`).

Storages and kernels below eager only need the values themselves: `apply` a function to values that may be
pending, `track` a buffer that holds one, get a value's data with `concrete`. The recorder that makes pending
values and runs them lives in eager, above this layer, so it installs itself here (`install`); until it does,
nothing is pending and `apply` just runs its function.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax


class Pending:
    """Output `ref` = (node, index) of the cluster being recorded; `value` is set once the cluster has run."""

    __slots__ = ("aval", "ref", "value")

    def __init__(self, aval: jax.ShapeDtypeStruct, ref: tuple[int, int]) -> None:
        self.aval = aval
        self.ref = ref
        self.value: jax.Array | None = None

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


class _Idle:
    """The state before a recorder is installed: never recording."""

    fused = False


_mode: Any = _Idle()
_record: Callable[[Hashable, Callable, list], Any] | None = None
_flush: Callable[[list], None] | None = None


def install(mode: Any, record: Callable[[Hashable, Callable, list], Any], flush: Callable[[list], None]) -> None:
    """Make `record(key, fn, inputs)` what `apply` does while `mode.fused` is true or an input is pending, and
    `flush(extra)` what computes pending values (and `extra`)."""
    global _mode, _record, _flush
    _mode, _record, _flush = mode, record, flush


def is_pending(value: Any) -> bool:
    """Whether `value` is a recorded value not computed yet."""
    return type(value) is Pending and value.value is None


def apply(key: Hashable, fn: Callable, *inputs: Any) -> Any:
    """`fn(*inputs)` for the storage helpers (view gathers, scatters, casts): recorded in Fused mode, where it then
    fuses with the ops around it instead of running as its own executable, or when an input is pending; else run
    now. `key` must fix `fn`; the inputs' avals are added to it."""
    if _mode.fused or any(type(x) is Pending and x.value is None for x in inputs):
        return _record(key, fn, list(inputs))
    return fn(*[x.value if type(x) is Pending else x for x in inputs])


def track(buffer: Any) -> None:
    """`buffer` holds a Pending value: the next cluster must produce it (while the buffer lives)."""
    buffers[id(buffer)] = weakref.ref(buffer)


def concrete(value: Any) -> Any:
    """The computed value of `value`, running the pending cluster if needed."""
    if type(value) is not Pending:
        return value
    if value.value is None:
        _flush([value])
    return value.value
