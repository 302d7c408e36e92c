"""The PJRT platform behind the `tpu` device, chosen once, lazily, from TORCH_TPU_PLATFORM.

On a TPU host the first use opens the device on a thread while the process does Python work it has next: libtpu
takes 6-8 s to bring up a v5e, mostly with the GIL released, and the process imports Dynamo meanwhile (~1.2 s, which
the first op's meta function or an optimizer's constructor would spend after it). On a v5e, a cold process's
import, first op and optimizer: 19.4-20.0 -> 17.9 s (an ad hoc run of bench/cold_start.py's child). Opening as
torch imports us, as Google's TorchTPU does, would hide the rest, but a process that imports torch and never uses
the chip would hold it: a launcher's children could not open theirs (measured: bench/tpu_step.py's child found the
chip in use by its parent).
TORCH_TPU_OPEN_ON_THREAD=0 opens on the calling thread; =1 on a thread on every platform (the tests' setting).
"""

from __future__ import annotations

import fcntl
import functools
import importlib
import os
import sys
import threading

import jax
import torch

from torch_tpu.runtime import compat

_CHOICES = ("auto", "tpu", "gpu", "cpu")
_PLATFORM_NAMES = {"tpu": "TPU", "gpu": "GPU", "cpu": "XLA CPU"}


def requested() -> str:
    """The platform the user asked for with TORCH_TPU_PLATFORM (default `auto`)."""
    choice = os.environ.get("TORCH_TPU_PLATFORM", "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"TORCH_TPU_PLATFORM must be one of {', '.join(_CHOICES)}, got {choice!r}")
    return choice


def _devices_of(platform: str) -> tuple[list[jax.Device], str]:
    """This process's own devices of `platform`, and why there are none (the first line of JAX's error)."""
    # In a multi-process job jax.devices() lists every process's, and a program placed on another process's
    # device cannot run here ("spans non-addressable devices").
    try:
        return jax.local_devices(backend=platform), ""
    except RuntimeError as exc:
        return [], (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# Why a process finds no TPU on a host that has one: libtpu lets one process at a time hold a chip.
ONE_PROCESS = (
    "a TPU chip can be held by one process at a time: run this after that process has exited, and give each "
    "process of a multi-process job a chip of its own"
)


@functools.cache  # once: a second lock of the path in this process would find it held (by itself)
def _hold_device_lock() -> None:
    """TORCH_TPU_DEVICE_LOCK=PATH: hold PATH exclusively for the life of the process, as libtpu holds a TPU chip,
    so that the one-process-per-chip rule can be tested on any platform."""
    path = os.environ.get("TORCH_TPU_DEVICE_LOCK")
    if not path:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # never closed: the lock lasts as long as the process
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RuntimeError(
            f"torch_tpu: the device is already in use by process {holder} (TORCH_TPU_DEVICE_LOCK={path}); {ONE_PROCESS}"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def _open() -> tuple[jax.Device, ...]:
    """This process's JAX devices of the chosen platform, configuring JAX (x64, default device)."""
    choice = requested()
    _hold_device_lock()
    order = ("tpu", "gpu", "cpu") if choice == "auto" else (choice,)
    why = []
    for platform in order:
        found, error = _devices_of(platform)
        if found:
            # torch keeps int64 and float64 as they are; JAX needs x64 for that.
            jax.config.update("jax_enable_x64", True)
            jax.config.update("jax_default_device", found[0])
            return tuple(found)
        why.append(f"{platform}: {error or 'none found'}")
    busy = f"; {ONE_PROCESS}" if any("in use" in reason for reason in why) else ""
    raise RuntimeError(f"torch_tpu: no JAX devices for TORCH_TPU_PLATFORM={choice!r} ({'; '.join(why)}){busy}")


_opened: tuple[jax.Device, ...] | None = None
_opening = threading.Lock()  # held while a thread opens the device
_opener: threading.Thread | None = None
# What a process opening a TPU is about to import anyway: done while the device opens, it costs no time.
IMPORTS_WHILE_OPENING = ("torch._dynamo",)


def devices() -> tuple[jax.Device, ...]:
    """This process's JAX devices of the chosen platform; the first call opens them and configures JAX (x64,
    default device), on a TPU host on a thread while this one imports what a training process needs next."""
    if _opened is None:
        return _open_once()
    return _opened


def is_open() -> bool:
    return _opened is not None


def _open_once() -> tuple[jax.Device, ...]:
    if _opener is None and _on_thread() and threading.current_thread() is threading.main_thread():
        begin_opening()
        for name in IMPORTS_WHILE_OPENING:
            if _opener is not None and _opener.is_alive() and name not in sys.modules:
                importlib.import_module(name)
    return _open_locked()


def _open_locked() -> tuple[jax.Device, ...]:
    """Open the device unless it is open: a failure raises here and leaves it closed, to raise again."""
    global _opened
    with _opening:
        if _opened is None:
            _opened = _open()
        return _opened


def begin_opening() -> None:
    """Start opening the device on a thread, once; `devices()` waits for it (and a fork does: the child must not
    inherit a runtime half brought up)."""
    global _opener
    if _opener is not None or _opened is not None:
        return
    opener = threading.Thread(target=_open_on_thread, name="torch_tpu_open_device")
    try:
        opener.start()
    except RuntimeError:  # no new thread at interpreter shutdown (Python 3.12+): the caller opens it itself
        return
    _opener = opener
    os.register_at_fork(before=_wait_for_opener)


def _wait_for_opener() -> None:
    if _opener is not None and _opener is not threading.current_thread():
        _opener.join()


def _open_on_thread() -> None:
    try:
        _open_locked()
    except Exception:
        return  # the caller's own `devices()` raises it again, on its thread


def _on_thread() -> bool:
    """Whether the first `devices()` opens on a thread: TORCH_TPU_OPEN_ON_THREAD (auto: where a TPU is attached
    and may be chosen, the one platform whose opening takes seconds)."""
    setting = os.environ.get("TORCH_TPU_OPEN_ON_THREAD", "auto").strip().lower()
    if setting in ("0", "1"):
        return setting == "1"
    return requested() in ("auto", "tpu") and compat.tpu_chips_attached() > 0


def _launcher_variable(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def host_device_count() -> int:
    """The `tpu` devices of this host as a launcher counts them: one per process (torchrun's LOCAL_WORLD_SIZE,
    at least LOCAL_RANK + 1), else 1. Code written for CUDA checks `device_id.index < device_count()`."""
    local_rank = _launcher_variable("LOCAL_RANK")
    if local_rank is None:
        return 1
    return max(_launcher_variable("LOCAL_WORLD_SIZE") or 1, local_rank + 1)


def own_index(index: int | None) -> int:
    """The index into this process's devices that `tpu:index` names: the process owns one device, which
    `tpu:0` and, under a launcher, `tpu:LOCAL_RANK` both name (CUDA code selects `cuda:LOCAL_RANK`)."""
    if index is None or index <= 0:  # a negative index is the current device, as in torch.cuda
        return 0
    local_rank = _launcher_variable("LOCAL_RANK")
    if index == local_rank:
        return 0
    also = f" or tpu:{local_rank} (LOCAL_RANK)" if local_rank else ""
    owner = f"; tpu:{index} is local rank {index}'s device" if 0 < index < host_device_count() else ""
    raise RuntimeError(f"torch_tpu: one tpu device per process, tpu:0{also}; cannot select tpu:{index}{owner}")


def check_device(device: torch.device | str | None) -> None:
    """Raise unless `device`, the `tpu` device an allocation or a copy names, is this process's."""
    if device is not None:
        index = device.index if type(device) is torch.device else torch.device(device).index
        if index:
            own_index(index)


def device(index: int = 0) -> jax.Device:
    """The JAX device behind `tpu:index`."""
    found = devices()
    if not 0 <= index < len(found):
        raise RuntimeError(f"torch_tpu: device index {index} out of range; {len(found)} tpu device(s)")
    return found[index]


def platform() -> str:
    """`tpu`, `gpu` or `cpu`: the PJRT platform that runs the `tpu` device."""
    return devices()[0].platform if devices()[0].platform in ("tpu", "cpu") else "gpu"


def device_name(index: int = 0) -> str:
    """A truthful name: the TPU generation, the GPU model, or that the device is emulated on the CPU."""
    dev = device(index)
    kind = platform()
    if kind == "tpu":
        return dev.device_kind
    if kind == "gpu":
        return f"{dev.device_kind} (tpu device emulated on gpu)"
    return "XLA CPU (tpu device emulated on cpu)"


def total_memory(index: int = 0) -> int:
    """Bytes of device memory: PJRT's figure where it gives one, else the host's physical memory."""
    stats = device(index).memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
