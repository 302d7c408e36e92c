"""A one-element `dist.all_reduce` on a tpu tensor, straight from torch.distributed's call to the check's exchange.

Through torch, `dist.all_reduce(t)` costs ~150 us of CPU before and after its one gloo round trip: torch's
Python, the dispatcher boxing the call into our `c10d::allreduce_` kernel (`kernels.py`), the kernel's generic
path and the completed Work it returns, several times gloo's own ~20 us for a CPU tensor. A scalar reduced every
step (a loss, a token count, a flag) pays it each time. So on the XLA CPU platform, where such a value rides in
the mismatch check's carrier (`host.py`), the call goes straight there: the same description, fingerprint,
carrier and rounding as the kernel's path (so ranks may take either path for the same call and still agree, and
a mismatch still raises on every rank naming both sides before anything is written), the watchdog and the
metrics counting it alike, with the per-(dtype, shape, op) plan and the carrier's tensors made once.

Any call this cannot serve exactly as torch would goes through torch (`_previous`): an async call (its Work),
a tensor subclass or torch function mode, a TorchDispatchMode (CommDebugMode counts the c10d op), the profiler
(it records the op), tracing by torch.compile, a coalescing context, a view or a tensor whose storage is
unwritten, bool, PREMUL_SUM, floating MAX/MIN, TORCH_DISTRIBUTED_DEBUG=DETAIL.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torch_tpu import metrics
from torch_tpu.distributed import handshake, host, watchdog
from torch_tpu.runtime import compat, deferred, dtypes, mapping, storage

_RedOpType = dist.ReduceOp.RedOpType
# torch's reduce ops by name; the kernels add PREMUL_SUM, which the fast path leaves to torch's call.
RED_OP_NAMES = {
    _RedOpType.SUM: "sum",
    _RedOpType.AVG: "avg",
    _RedOpType.MAX: "max",
    _RedOpType.MIN: "min",
    _RedOpType.PRODUCT: "product",
    _RedOpType.BAND: "band",
    _RedOpType.BOR: "bor",
    _RedOpType.BXOR: "bxor",
}
_has_torch_function = torch.overrides.has_torch_function
_dispatch_modes = compat.dispatch_mode_depth
_profiling = compat.profiler_enabled
_is_compiling = torch.compiler.is_compiling
_c10d = dist.distributed_c10d
_Pending = deferred.Pending
_previous: Callable[..., Any] | None = None


class _Plan:
    """What one (dtype, shape, op) of a one-element all_reduce needs, made once: the description the ranks
    compare, the carrier's dtype and reduction, and the dtypes its result is rounded back through."""

    __slots__ = ("description", "op", "wide", "options", "dtype", "compute", "nbytes")

    def __init__(self, tensor: torch.Tensor, op: str, kind: _RedOpType) -> None:
        self.description = f"all_reduce {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} {kind.name}"
        self.op = op
        self.wide = torch.float64 if tensor.dtype.is_floating_point else torch.int64
        self.options = host.carrier_options(op)
        self.dtype = np.dtype(dtypes.to_jax(tensor.dtype))
        self.compute = dtypes.compute_dtype(self.dtype)
        self.nbytes = tensor.element_size()


class _Slot:
    """A group's carrier for one plan (and a NumPy view of its value), made once."""

    __slots__ = ("carrier", "wide")

    def __init__(self, plan: _Plan) -> None:
        self.carrier = handshake.Carrier(plan.wide, plan.options)
        self.wide = self.carrier.pair[1:]


_plans: dict[tuple, _Plan | None] = {}
# Each group's state (`handshake.Group`) -> its slots by plan, reused call after call.
_slots: weakref.WeakKeyDictionary[handshake.Group, dict[_Plan, _Slot]] = weakref.WeakKeyDictionary()


def _plan(tensor: torch.Tensor, op: Any) -> _Plan | None:
    """The plan of this call, or None when it must go through torch (see the module's docstring)."""
    if not isinstance(op, _RedOpType):  # PREMUL_SUM's ReduceOp (its factor), or an int
        return None
    key = (tensor.dtype, tensor.shape, op)
    try:
        return _plans[key]
    except KeyError:
        pass
    plan = None
    name = RED_OP_NAMES.get(op)
    if (
        name is not None
        and tensor.numel() == 1
        and tensor.dtype in host.DTYPES
        and host.in_carrier(tensor, name)
        and not (name in ("band", "bor", "bxor") and tensor.dtype.is_floating_point)
        and not (name == "avg" and not tensor.dtype.is_floating_point)
    ):
        plan = _Plan(tensor, name, op)
    _plans[key] = plan
    return plan


def _slot(state: handshake.Group, plan: _Plan) -> _Slot:
    slots = _slots.get(state)
    if slots is None:
        slots = _slots[state] = {}
    found = slots.get(plan)
    if found is None:
        found = slots[plan] = _Slot(plan)
    return found


def _served(tensor: Any, group: Any, async_op: bool) -> bool:
    """Whether this call may skip torch (the cheap tests first: this is every call's cost)."""
    return (
        not _is_compiling()  # first: torch.compile traces this, and only this, to torch's call
        and not async_op
        and type(tensor) is torch.Tensor
        and tensor.device.type == "tpu"
        and not _has_torch_function((tensor,))
        and not _dispatch_modes()
        and not _profiling()
        and (group is None or isinstance(group, dist.ProcessGroup))
        and host.available()
        and not handshake.detail()
    )


def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
    """`torch.distributed.all_reduce`: a one-element tpu tensor's served here, every other call by torch's."""
    if _served(tensor, group, async_op) and (plan := _plan(tensor, op)) is not None:
        process_group = compat.c10d_group_now(group)
        if process_group is not None:
            buffer = storage.buffer_of(tensor)
            if (
                buffer._array is not None
                and not tensor.is_conj()
                and not tensor.is_neg()
                and mapping.classify(tensor, buffer, tensor.shape, tensor.dtype) is mapping.WHOLE_BUFFER
            ):
                state = handshake.group(process_group)
                watchdog.guarded("all_reduce", state.ranks, _all_reduce, tensor, buffer, state, plan)
                metrics.collectives["allreduce"] += 1
                metrics.collective_bytes["allreduce"] += plan.nbytes
                return None
    return _previous(tensor, op, group, async_op)


def _all_reduce(tensor: torch.Tensor, buffer: storage.DeviceBuffer, state: handshake.Group, plan: _Plan) -> None:
    """The kernel's carrier path (`kernels._all_reduce`), its plan and buffers made once, the value read while
    the check's exchange is under way. The result is a new array for the storage (a copy of 1-8 bytes): cheaper
    than writing the old one in place, which needs a donation program to wait for computations still reading it
    (a JAX worker thread woken on every call)."""
    slot = _slot(state, plan)
    fill = functools.partial(_fill, slot.wide, buffer)
    if handshake.enabled:
        handshake.agree(state, plan.description, slot.carrier, fill)
    else:
        handshake.carry(state, slot.carrier, plan.description, fill)
    host.store(tensor, host.rounded(slot.wide, plan.dtype, plan.compute, plan.op, len(state.ranks)))


def _fill(wide: np.ndarray, buffer: storage.DeviceBuffer) -> None:
    """The carrier's value: the tensor's, widened (exactly: float64 and int64 hold every value of the dtypes)."""
    array = buffer._array
    if type(array) is _Pending:
        array = deferred.concrete(array)
    wide[0] = np.asarray(array).reshape(-1)[0]


def install() -> None:
    """Serve `torch.distributed.all_reduce` here (once per process, over the watchdog's guard of it)."""
    global _previous
    current = _c10d.all_reduce
    if current is all_reduce:
        return
    _previous = current
    dist.all_reduce = _c10d.all_reduce = all_reduce


all_reduce._tpu_dist = True  # the watchdog's guard_api leaves it as it is
