"""`torch.tpu`: the device module (CUDA-shaped), registered for the renamed PrivateUse1 backend."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import torch

from torch_tpu import precision as _precision
from torch_tpu.eager import fused, modes, programs
from torch_tpu.eager.cache import executables as _executables
from torch_tpu.eager.modes import EagerMode, set_eager_mode
from torch_tpu.precision import Precision, precision
from torch_tpu.random import (
    get_rng_state,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
)
from torch_tpu.runtime import backward_thread, checks, platform, recent
from torch_tpu.runtime import memory as _memory_stats
from torch_tpu.runtime.deferred import buffers as _pending_buffers
from torch_tpu.runtime.memory import memory as _memory

# The public names (tests/test_public_api.py holds them): TorchTPU 0.2.0's `torch.tpu` API that exists here, and
# ours (device, DeviceProperties, memory statistics, is_bf16_supported, seed/seed_all). `eager_mode` and
# `allow_excess_precision` are properties of the module (read and assign `torch.tpu.eager_mode`).
__all__ = [
    "DeviceProperties",
    "EagerMode",
    "Event",
    "Precision",
    "Stream",
    "allow_excess_precision",  # noqa: F822  (a property of _DeviceModule)
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "distributed",  # noqa: F822  (torch_tpu.distributed, a layer above, sets it: tpu_dist's public names)
    "profiler",  # noqa: F822  (torch_tpu.profiler, a layer above, sets it: TpuProfilerConfig)
    "eager_mode",  # noqa: F822  (a property of _DeviceModule)
    "empty_cache",
    "finish_compiles",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "ops",  # noqa: F822  (torch_tpu.kernels.prebuilt, a layer above, sets it: the prebuilt kernels)
    "pallas",  # noqa: F822  (torch_tpu.kernels, a layer above, sets it: jax_op, register_lowering)
    "precision",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_eager_mode",
    "set_rng_state",
    "stream",
    "synchronize",
]


def _lazy_init() -> None:
    """Pick the PJRT platform and configure JAX, once; then load the last run's programs ahead (`recent`), and
    have this thread run its backward passes itself (`backward_thread`)."""
    platform.devices()
    recent.start()
    backward_thread.apply()


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return platform.is_open()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """The host's `tpu` devices, one per process: under a launcher its LOCAL_WORLD_SIZE, else 1.

    A process owns exactly one device (one process per chip). It is `tpu:0`, the index its tensors report and
    `current_device()` returns, and under a launcher `tpu:LOCAL_RANK` names it too, so CUDA-style code
    (`set_device(LOCAL_RANK)`, `torch.device("tpu", local_rank)`, `init_process_group(device_id=...)`, which
    checks the index against this count) runs unchanged; any other index raises.
    """
    return platform.host_device_count()


def current_device() -> int:
    return 0


def set_device(device: int | str | torch.device) -> None:
    """Select the process's device: `tpu:0`, or its local rank as launchers pass it (`set_device(LOCAL_RANK)`)."""
    _index(device)


class device:
    """Context manager selecting a tpu device: the process's one device, under either of its names."""

    def __init__(self, device: Any) -> None:
        _index(device)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _index(device: Any) -> int:
    """The index into this process's devices of `device` (None, an index, a string or a torch.device)."""
    if device is None:
        return 0
    if not isinstance(device, int):
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"torch_tpu: expected a tpu device, got {device}")
        device = device.index
    return platform.own_index(device)


def get_device_name(device: Any = None) -> str:
    """The platform's true name, e.g. "TPU v6e" or "XLA CPU (tpu device emulated on cpu)"."""
    _lazy_init()
    return platform.device_name(_index(device))


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int
    platform: str
    type: str = "tpu"


def get_device_properties(device: Any = None) -> DeviceProperties:
    _lazy_init()
    index = _index(device)
    return DeviceProperties(platform.device_name(index), platform.total_memory(index), platform.platform())


def synchronize(device: Any = None) -> None:
    """Wait for all work issued to the device so far (in Fused mode, run the pending cluster first)."""
    fused.flush()
    if is_initialized():
        for array in jax.live_arrays():
            array.block_until_ready()
    checks.raise_pending()  # failed device-side checks (an out-of-range index) raise here, as CUDA's asserts do


# Memory statistics in CUDA's shape (runtime/memory.py says where each figure comes from; docs/memory.md).


def memory_stats(device: Any = None) -> dict[str, Any]:
    """`torch.cuda.memory_stats`'s keys, for this device."""
    return _memory_stats.stats(_index(device))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    return _memory_stats.stats_as_nested_dict(_index(device))


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """`torch.cuda.memory_summary`'s table, labelled for TPU."""
    return _memory_stats.summary(_index(device), abbreviated)


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live `tpu` storages."""
    _index(device)
    return _memory.allocated


def max_memory_allocated(device: Any = None) -> int:
    _index(device)
    return _memory.peak


def memory_reserved(device: Any = None) -> int:
    """Bytes the device holds for this process: PJRT's figure where it has one, else as allocated."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    return _memory_stats.mem_get_info(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    _index(device)
    _memory.reset_peak()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _index(device)
    _memory.reset_accumulated()


def empty_cache() -> None:
    """Drop torch_tpu's caches of device arrays (PJRT keeps no cache of freed memory to release)."""
    _memory_stats.empty_cache()


def memory_snapshot() -> list[dict[str, Any]]:
    """`torch.cuda.memory_snapshot`'s segments: every live buffer on the device, with the stack that made it."""
    return _memory_stats.snapshot(0)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 runs on every platform (natively on TPU, via XLA elsewhere)."""
    return True


_PRIVATE_USE_1 = int(torch._C._autograd.DeviceType.PrivateUse1)
_stream_ids = itertools.count(1)
_current = threading.local()


@jax.jit
def _next_marker(previous: jax.Array) -> jax.Array:
    return previous + 1


_last_marker: list[jax.Array] = []


def _unissued() -> bool:
    """Whether work is held back from the device: recorded in Fused eager, or sealed or queued (Strict eager's
    warm-up) while a program compiles."""
    return bool(_pending_buffers) or bool(fused._sealed)


def _marker() -> jax.Array:
    """A one-byte program on this process's device, issued now: ready once all work issued before it is done."""
    if not _last_marker:
        _last_marker.append(jax.device_put(np.uint8(0), platform.device()))
    _last_marker[0] = marker = _next_marker(_last_marker[0])
    return marker


class Stream(torch.Stream):
    """A `torch.Stream` of the tpu device (so `tensor.record_stream`, FSDP2 and `torch.Stream` APIs accept it).

    A device runs its work in the order it was issued (PJRT's one execution queue per device; JAX's dataflow orders
    the rest), so every stream is that queue: waits between streams have nothing to do, and synchronising a stream
    waits for the device. Each stream has its own id, so streams compare and hash as distinct objects.
    """

    def __new__(cls, device: Any = None, priority: int = 0) -> Stream:
        return super().__new__(
            cls, stream_id=next(_stream_ids), device_index=_index(device), device_type=_PRIVATE_USE_1
        )

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, stream: torch.Stream) -> None:
        return None

    def wait_event(self, event: torch.Event) -> None:
        return None

    def query(self) -> bool:
        """Whether all work issued to the device is done (without waiting for it)."""
        return not _unissued() and all(array.is_ready() for array in jax.live_arrays())

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        self._previous = current_stream()
        _current.stream = self
        return self

    def __exit__(self, *exc: object) -> None:
        _current.stream = self._previous


class Event(torch.Event):
    """A `torch.Event` of the tpu device that marks the work issued before `record()` without waiting for it.

    `record()` dispatches a one-byte marker program: the device runs its work in order, so the marker is ready
    exactly when everything issued before it is done. `synchronize()` and `query()` wait for or ask about that
    marker only (not the whole device); `wait()` has nothing to do, every stream being the device's one queue. In
    Fused mode, work still recorded when the event is recorded runs when the event is waited for. With
    `enable_timing`, `record()` waits for its marker, so that `elapsed_time` measures the work.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Event:
        return super().__new__(cls, "tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._marker: jax.Array | None = None
        self._after_pending = False
        self._time: float | None = None

    def record(self, stream: torch.Stream | None = None) -> None:
        self._after_pending = _unissued()
        self._marker = _marker()
        if self.enable_timing:
            self.synchronize()
            self._time = time.perf_counter()

    def synchronize(self) -> None:
        if self._after_pending:
            fused.flush()
            self._marker = _marker()
            self._after_pending = False
        if self._marker is not None:
            self._marker.block_until_ready()
        checks.raise_pending()

    def query(self) -> bool:
        return not self._after_pending and (self._marker is None or self._marker.is_ready())

    def wait(self, stream: torch.Stream | None = None) -> None:
        return None

    def elapsed_time(self, end: Event) -> float:
        if self._time is None or end._time is None:
            raise RuntimeError("torch_tpu: both events must be recorded with enable_timing=True before elapsed_time")
        return (end._time - self._time) * 1000.0


def _make_default_stream() -> Stream:
    stream = torch.Stream.__new__(Stream, stream_id=0, device_index=0, device_type=_PRIVATE_USE_1)
    stream.priority = 0
    return stream


_default_stream = _make_default_stream()


def current_stream(device: Any = None) -> Stream:
    """The stream selected by `torch.tpu.stream(...)` on this thread, else the default stream."""
    return getattr(_current, "stream", _default_stream)


def default_stream(device: Any = None) -> Stream:
    return _default_stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    """Select `stream` as this thread's current stream (None: leave it as it is)."""
    if stream is None:
        yield
        return
    with stream:
        yield


def finish_compiles() -> None:
    """Wait for the programs compiling in the background at XLA's full effort while quick ones run in their place
    (a cold Fused cluster on a TPU, `TORCH_TPU_TIERED_COMPILE`), and run those from now on: what a benchmark calls
    after its warm-up steps, so that it times the steady state."""
    programs.finish_compiles()


def _get_cache_stats() -> dict[str, Any]:
    """Executable-cache counters: num_cache_reqs, num_cache_hits, per_entry_stats."""
    return _executables.stats()


def _module_attribute(get: Callable[[], Any], assign: Callable[[Any], None]) -> property:
    """A device-module attribute that reads `get()` and whose assignment calls `assign(value)`."""
    return property(lambda module: get(), lambda module, value: assign(value))


class _DeviceModule(types.ModuleType):
    """Gives `torch.tpu.eager_mode` and `torch.tpu.allow_excess_precision` property semantics (read and assign)."""

    eager_mode = _module_attribute(modes.get_mode, modes.set_mode)
    allow_excess_precision = _module_attribute(_precision.allow_excess_precision, _precision.set_allow_excess_precision)


sys.modules[__name__].__class__ = _DeviceModule
