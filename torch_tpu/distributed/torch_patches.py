"""Where torch.distributed's own Python code assumes CUDA or a CPU-only machine, the small changes a tpu job needs.

- DDP with `find_unused_parameters=True`, or `static_graph=True` in its first iteration, copies its local-used
  map to the device through a CPU temporary its C++ reducer allocates with `pin_memory=True`. On PrivateUse1 that
  asks the hooks for a pinned-memory allocator, which Python hooks cannot provide ("... implement
  `getPinnedMemoryAllocator`"). Pinning is a documented no-op mark here (`runtime.pinned`), so during exactly the
  backward passes that make that copy (those that run DDP's `_DDPSink`), CPU `empty_strided` and `empty` allocate
  normally and mark the result when asked to pin. The kernels are installed for that backward only (~0.1 ms): a
  Python kernel on every CPU allocation of the process would make a CPU `clone` several times slower.
- `init_device_mesh(...)` with no group calls torch's `init_process_group()`, which picks the accelerator's backend
  alone (tpu_dist, no CPU backend), so a CPU mesh's collectives found no backend. A CPU mesh gets gloo, as on a
  machine without an accelerator; a tpu mesh gets tpu_dist (whose group serves CPU tensors too).
- `split_group`: torch's C++ split of a tpu_dist group crashed (or, first, failed to deep-copy gloo's options),
  so a tpu_dist group's splits are made with `new_group`; and a `new_group` that leaves a rank out of a
  device-bound group (`device_id=`) asks gloo for a split method it lacks.
- Every DeviceMesh made is recorded (`distributed.meshes`), for compiled graphs over several of its dimensions.
- Where `torch.random.fork_rng` defaults to `device_type="cuda"` (torch 2.12), pipelining's schedule forks its
  stages' tpu devices without naming their type, and the fork asked CUDA for their state ("Found no NVIDIA
  driver"); a fork of devices that are all tpu `torch.device`s forks the tpu's (2.13 passes the type itself).
"""

from __future__ import annotations

import datetime
import functools
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.device_mesh
import torch.nn.parallel.distributed as ddp_module
from torch._C._distributed_c10d import ProcessGroupGloo

from torch_tpu.distributed import meshes
from torch_tpu.runtime import pinned

_CPU = torch._C.DispatchKey.CPU
_PINNABLE = ("empty_strided", "empty.memory_format")


def _pinning_kernel(name: str) -> Callable:
    """CPU `name` that allocates with torch's own CPU kernel and marks the result pinned when asked to pin."""
    original = torch._C._dispatch_get_computed_kernel_for_dispatch_key(f"aten::{name}", _CPU)
    keys = torch._C.DispatchKeySet(_CPU)

    def kernel(*args: Any, pin_memory: bool | None = None, **kwargs: Any) -> torch.Tensor:
        result = original.call_boxed(keys, *args, **kwargs)
        return pinned.mark(result) if pin_memory else result

    return kernel


class _PinningWindow:
    """The pinning kernels installed while at least one tpu DDP backward that needs them is running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._library: torch.library.Library | None = None
        self._kernels: dict[str, Callable] = {}

    def enter(self) -> None:
        with self._lock:
            self._open += 1
            if self._library is not None:
                return
            if not self._kernels:
                self._kernels = {name: _pinning_kernel(name) for name in _PINNABLE}
            library = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": CPU's, on purpose
                warnings.filterwarnings("ignore", "Warning only once for all operators")
                for name, kernel in self._kernels.items():
                    library.impl(name, kernel, "CPU")
            self._library = library

    def exit(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open == 0 and self._library is not None:
                self._library._destroy()  # torch's own CPU kernels are back
                self._library = None

    @property
    def installed(self) -> bool:
        return self._library is not None


pinning_window = _PinningWindow()


def _patch_ddp_sink() -> None:
    sink = ddp_module._DDPSink
    original = sink.backward
    if getattr(original, "_tpu_dist", False):
        return

    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        module = ctx.ddp_weakref()
        if module is None or module.device_type != "tpu":
            return original(ctx, *grad_outputs)
        pinning_window.enter()
        try:
            result = original(ctx, *grad_outputs)  # queues static_graph's delayed all-reduce first
        except BaseException:
            pinning_window.exit()
            raise
        # Final callbacks run in order once the whole backward is done: after the local-used-map copies.
        torch.autograd.Variable._execution_engine.queue_callback(pinning_window.exit)
        return result

    backward._tpu_dist = True
    sink.backward = staticmethod(backward)


def _patch_device_mesh() -> None:
    mesh = getattr(torch.distributed.device_mesh, "DeviceMesh", None)
    original = getattr(mesh, "_setup_world_group_and_device", None)
    if original is None or getattr(original, "_tpu_dist", False):
        return

    def setup(self: Any) -> Any:
        if not dist.is_initialized() and self._device_type in ("cpu", "tpu"):
            from torch_tpu.distributed.process_group import NAME

            dist.init_process_group("gloo" if self._device_type == "cpu" else NAME)
        return original(self)

    setup._tpu_dist = True
    mesh._setup_world_group_and_device = setup
    _record_device_meshes(mesh)


def _record_device_meshes(mesh: type) -> None:
    """Every DeviceMesh made is recorded (`meshes.record`): torch keeps no list of them, and a compiled graph over
    several of a mesh's dimension groups needs the mesh's layout."""
    original = mesh.__init__
    if getattr(original, "_tpu_dist", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        meshes.record(self)

    init._tpu_dist = True
    mesh.__init__ = init


def _uses_tpu_dist(group: dist.ProcessGroup) -> bool:
    names = {entry.split(":")[-1] for entry in dist.get_backend_config(group).split(",")}
    return bool(names & {"tpu_dist", "tpu"})


def _check_splits(split_ranks: list, size: int) -> None:
    seen: set[int] = set()
    for ranks in split_ranks:
        if not ranks:
            raise ValueError("the split group cannot be empty")
        if len(ranks) != len(set(ranks)) or seen & set(ranks):
            raise ValueError(f"split_group: rank lists must not repeat a rank, got {split_ranks}")
        if not all(0 <= rank < size for rank in ranks):
            raise ValueError(f"split_group: ranks must be below the group size {size}, got {split_ranks}")
        seen |= set(ranks)


def _split_group_by_new_group(split_group: Callable) -> Callable:
    """torch's C++ split of a tpu_dist group (gloo backends, one registered as a custom type) crashed the process
    in our runs (a group pairing torch's gloo with tpu_dist's; a tpu_dist default group made again after
    `destroy_process_group`). For the default group the same groups come from `new_group`, which every rank
    calls for every split, in the same order."""

    @functools.wraps(split_group)
    def split(
        parent_pg: dist.ProcessGroup | None = None,
        split_ranks: list | None = None,
        timeout: datetime.timedelta | None = None,
        pg_options: Any = None,
        group_desc: str | None = None,
        backend: str | None = None,
    ) -> dist.ProcessGroup | None:
        default = dist.distributed_c10d._get_default_group()
        parent = parent_pg or default
        if not split_ranks or not _uses_tpu_dist(parent):
            return split_group(parent_pg, split_ranks, timeout, pg_options, group_desc, backend)
        if parent is not default:
            raise RuntimeError(
                f"tpu_dist: split_group of a subgroup with backends {dist.get_backend_config(parent)!r} is not "
                "supported; split the default group, or use new_group"
            )
        _check_splits(split_ranks, default.size())
        mine = None
        for ranks in split_ranks:
            options = {"timeout": timeout, "backend": backend, "pg_options": pg_options, "group_desc": group_desc}
            group = dist.new_group(sorted(ranks), **options)
            if dist.get_rank() in ranks:
                mine = group
                mine.bound_device_id = default.bound_device_id  # as torch's split_group binds its groups
        return mine

    split._tpu_dist = True
    return split


def _fork_rng_of_the_devices_given(fork_rng: Callable) -> Callable:
    """`fork_rng` whose CUDA default gives way to the type of the devices given, where all are tpu devices."""
    backend = torch._C._get_privateuse1_backend_name()

    @functools.wraps(fork_rng)
    def fork(
        devices: Any = None,
        enabled: bool = True,
        _caller: str = "fork_rng",
        _devices_kw: str = "devices",
        device_type: str = "cuda",
    ) -> Any:
        if device_type == "cuda" and devices:
            devices = list(devices)
            if all(isinstance(device, torch.device) and device.type == backend for device in devices):
                device_type = backend
        return fork_rng(devices, enabled, _caller, _devices_kw, device_type)

    fork._tpu_dist = True
    return fork


def install() -> None:
    """Apply the changes (idempotent); nothing runs until DDP, DeviceMesh or split_group is used."""
    _patch_ddp_sink()
    _patch_device_mesh()
    # A rank left out of a `new_group` of a device-bound group (`device_id=`) tells the group's backend to split
    # without it (NCCL's ncclCommSplit); gloo has no communicator to split, and no such method.
    if not hasattr(ProcessGroupGloo, "perform_nocolor_split"):
        ProcessGroupGloo.perform_nocolor_split = lambda self, device: None
    fork_rng = torch.random.fork_rng
    if inspect.signature(fork_rng).parameters["device_type"].default == "cuda" and not hasattr(fork_rng, "_tpu_dist"):
        torch.random.fork_rng = _fork_rng_of_the_devices_given(fork_rng)
    c10d = dist.distributed_c10d
    if not getattr(c10d.split_group, "_tpu_dist", False):
        split = _split_group_by_new_group(c10d.split_group)
        dist.split_group = c10d.split_group = torch.distributed.device_mesh.split_group = split
