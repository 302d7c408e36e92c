"""Device-side checks: errors such as an out-of-range index, found by the executable that computes the op and
raised at the next synchronisation, as CUDA's device-side asserts are — so a check costs no sync of its own.

A lowering calls `require(ok, error, message, *details)` while it is traced (`ok` a traced bool, `details`
traced integers formatted into `message`). The scope the trace runs in (`collecting`: the dispatcher's traced
lowering, a fused cluster's node, a compiled graph) returns the checks it gathered with its result as a `Checked`
pytree: its children are the result and one packed int64 vector of the checks' values, its static data the checks
themselves, so the checks travel with an executable's output tree (through the persistent cache too). Whoever runs
the executable passes the output to `take`, which keeps the vector in a pending list and returns the result;
`raise_pending` — called where values reach the host (`storage.to_host`: `.item()`, `.cpu()`, `.tolist()`,
`print`) and by `torch.tpu.synchronize()` — reads the pending vectors and raises the first failure (Debug mode:
after every op).

The checks are on by default; TORCH_TPU_CHECK_INDICES=0 or `torch_tpu.set_index_checks(False)` turns them off,
which drops them from the traced programs: the switch is part of the trace context (`runtime.trace_context`),
so of every cache key.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.runtime.trace_context import context

# Past this many unread pending vectors, the oldest half is read and dropped, but for a failure (memory stays
# bounded in a loop that never synchronises).
_MAX_PENDING = 1024


class Check(NamedTuple):
    """One check's static part: the exception class and message raised when it fails; `details` integers computed
    on the device fill the message's `{}` fields."""

    error: type[Exception]
    message: str
    details: int


class _Scopes(threading.local):
    """Per thread (a graph may compile in a background thread), the checks gathered by the traces in progress,
    innermost last."""

    def __init__(self) -> None:
        self.stack: list[list] = []


_scopes = _Scopes()
_pending: list[tuple[tuple[Check, ...], Any]] = []


def set_index_checks(enabled: bool) -> None:
    """Check indices (and the other device-side checks) on the device: on by default; off drops them from the
    programs, for speed (an out-of-range index then reads a clamped or fill value and its write is dropped)."""
    context.index_checks = bool(enabled)  # in the trace context: every cache key then tells the programs apart
    context.refresh()


def index_checks() -> bool:
    """Whether device-side checks are on (TORCH_TPU_CHECK_INDICES, `set_index_checks`)."""
    return context.index_checks


@jax.tree_util.register_pytree_node_class
class Checked:
    """A traced function's result with the packed values of the checks it made (`flags`); `checks` is static."""

    __slots__ = ("result", "flags", "checks")

    def __init__(self, result: Any, flags: Any, checks: tuple[Check, ...]) -> None:
        self.result = result
        self.flags = flags
        self.checks = checks

    def tree_flatten(self) -> tuple[tuple, tuple[Check, ...]]:
        return (self.result, self.flags), self.checks

    @classmethod
    def tree_unflatten(cls, checks: tuple[Check, ...], children: tuple) -> Checked:
        return cls(children[0], children[1], checks)


def require(ok: Any, error: type[Exception], message: str, *details: Any) -> None:
    """Fail with `error(message.format(*details))` where `ok` (a bool array, reduced with all) is False.

    Inside a trace the check joins its scope's outputs; on concrete arrays (a data-dependent lowering running op
    by op) it is pending at once. Nothing happens with checks off."""
    if not context.index_checks:
        return
    values = jnp.stack([jnp.logical_not(jnp.all(ok)).astype(jnp.int64), *(jnp.asarray(d, jnp.int64) for d in details)])
    check = Check(error, message, len(details))
    if _scopes.stack:
        _scopes.stack[-1].append((check, values))
    elif isinstance(values, jax.core.Tracer):
        raise RuntimeError("torch_tpu: a check was traced outside checks.collecting (its result would be lost)")
    else:
        stash((check,), values)


def collecting(fn: Callable) -> Callable:
    """`fn`, returning `Checked(result, flags, checks)` when its trace made checks (else its result as it is)."""

    @functools.wraps(fn)
    def collected(*args: Any, **kwargs: Any) -> Any:
        found: list = []
        _scopes.stack.append(found)
        try:
            result = fn(*args, **kwargs)
        finally:
            _scopes.stack.pop()
        if not found:
            return result
        return Checked(result, jnp.concatenate([values for _, values in found]), tuple(c for c, _ in found))

    return collected


def jit(fn: Callable, **options: Any) -> Callable:
    """`jax.jit(fn, **options)` for a helper that makes checks: called on concrete arrays it runs compiled and
    leaves its checks pending; called inside a trace, it inlines and its checks join that trace's. (One jitted
    function per setting of the switch: jax.jit's own cache does not know it.)"""
    compiled = {enabled: jax.jit(collecting(fn), **options) for enabled in (False, True)}

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        if _scopes.stack:
            return fn(*args)
        return take(compiled[context.index_checks](*args))

    return run


def take(output: Any) -> Any:
    """The result of an executable's `output`, leaving its checks (if it made any) pending."""
    if type(output) is not Checked:
        return output
    stash(output.checks, output.flags)
    return output.result


def stashing(executable: Callable) -> Callable:
    """`executable` (whose output is `Checked`) returning its result, its checks left pending."""

    def run(*args: Any) -> Any:
        output = executable(*args)
        stash(output.checks, output.flags)
        return output.result

    return run


def stash(checks: tuple[Check, ...], flags: Any) -> None:
    """Keep the packed values `flags` of `checks` (computed, or being computed, on the device) for `raise_pending`."""
    _pending.append((checks, flags))
    if len(_pending) > _MAX_PENDING:
        _drain(_MAX_PENDING // 2)


def _drain(count: int) -> None:
    """Read the oldest `count` pending checks (computed long ago: as many ops have been issued since), keeping
    only the first failure among them for `raise_pending`."""
    oldest = _pending[:count]
    del _pending[:count]
    for checks, flags in oldest:
        if _failure(checks, np.asarray(flags)) is not None:
            _pending.insert(0, (checks, flags))
            return


def _failure(checks: tuple[Check, ...], values: np.ndarray) -> Exception | None:
    position = 0
    for check in checks:
        if values[position]:
            return check.error(check.message.format(*values[position + 1 : position + 1 + check.details].tolist()))
        position += 1 + check.details
    return None


def prefetch_pending() -> None:
    """Start copying the pending checks' flags to the host before a read waits for a value, so that the
    `raise_pending` after it waits for no second round trip (on a TPU one is ~0.5 ms of a small training step)."""
    for _, flags in _pending:
        start = getattr(flags, "copy_to_host_async", None)
        if start is not None:
            start()


def raise_pending() -> None:
    """Raise the first failed pending check (in the order the ops ran), forgetting every pending check."""
    if not _pending:
        return
    taken = _pending[:]
    _pending.clear()
    for checks, flags in taken:
        error = _failure(checks, np.asarray(flags))
        if error is not None:
            try:
                raise error
            finally:  # else this frame holds the error holding its traceback holding this frame: a cycle that
                del error  # keeps every frame of the read alive until gc (torch's `_str` disables functorch meanwhile)


@contextlib.contextmanager
def index_checks_set(enabled: bool) -> Iterator[None]:
    """Run the block with device-side checks on or off, restoring the previous setting afterwards."""
    previous = context.index_checks
    set_index_checks(enabled)
    try:
        yield
    finally:
        set_index_checks(previous)
