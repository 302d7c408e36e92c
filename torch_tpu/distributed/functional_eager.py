"""The functional collectives' eager kernels on tpu, and `torch.tpu.distributed.spmd_safe`.

By default an eager functional collective runs alone, as torch's own kernel does it (a clone and the c10d
collective, `distributed.kernels`): in Fused mode it is a materialisation point, so the cluster recorded before
it runs first and ranks whose code diverges meet at that collective instead of inside a larger program.
Code marked `@spmd_safe` promises that every rank runs the same ops; there, in Fused mode, a collective is
recorded into the cluster like any op (its lowering, `distributed.functional`), and the cluster runs as one SPMD
program over the group's devices (`distributed.spmd`), agreed on by the ranks before its first run.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from torch_tpu.distributed import functional, spmd
from torch_tpu.eager import fused, modes
from torch_tpu.ops.registry import graph_lowering
from torch_tpu.runtime import storage, trace_context

F = TypeVar("F", bound=Callable[..., Any])
_TORCH_KERNEL = torch._C.DispatchKey.CompositeExplicitAutograd


class _Marked(threading.local):
    depth = 0


_marked = _Marked()


def spmd_safe(fn: F) -> F:
    """Mark `fn` as run alike by every rank of its collectives' groups: in Fused mode its functional collectives
    may be recorded into the cluster with the ops around them (one program) instead of ending it."""

    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _marked.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _marked.depth -= 1

    return marked


def _trace(op: Any, key: tuple, fn: Callable, leaves: list, ranks: tuple[int, ...]) -> fused.Trace:
    found = fused.recorder.traces.get(key)
    if found is None:
        avals = spmd.program(ranks).output_avals(fn, leaves)
        found = fused.recorder.traces[key] = fused.Trace(fn, avals, len(fused.recorder.traces))
    return found


def _record(op: Any, args: tuple) -> Any:
    """Record the collective `op(*args)` into the Fused cluster; its outputs are pending tensors."""
    group = functional.group_name(args[-1])
    ranks = functional.group_ranks(group)
    if fused.recorder.ranks not in (None, ranks):  # one cluster, one group: run what is recorded so far first
        fused.flush()
    tensors = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
    statics = (*args[1:-1], group)
    lowering = graph_lowering(op).fn
    listed = isinstance(args[0], (list, tuple))

    def collective(*arrays: Any) -> Any:
        return lowering(list(arrays) if listed else arrays[0], *statics)

    leaves = [storage.value(t) for t in tensors]
    signature = tuple((tuple(t.shape), t.dtype) for t in tensors)
    key = ("funcol", str(op), tuple(tuple(s) if isinstance(s, list) else s for s in statics), signature)
    trace = _trace(op, (*key, trace_context.cache_token()), collective, leaves, ranks)
    outputs = fused.record(trace, leaves)
    if len(ranks) > 1:
        fused.recorder.ranks = ranks
    if listed:
        return [storage.wrap(x) for x in outputs]
    return storage.wrap(outputs)


def _kernel(op: Any) -> Callable:
    def kernel(*args: Any) -> Any:
        if modes.state.fused and _marked.depth:
            return _record(op, args)
        return op._op_dk(_TORCH_KERNEL, *args)  # torch's own: a clone, then the c10d collective

    return kernel


_library: torch.library.Library | None = None


def install() -> None:
    """Give the functional collectives PrivateUse1 kernels (torch's run on every other device), once."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("_c10d_functional", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": the composite one, on purpose
        warnings.filterwarnings("ignore", "Warning only once for all operators")
        for op in functional.COLLECTIVES:
            library.impl(op._schema.name.split("::")[1], _kernel(op), "PrivateUse1")
    _library = library
