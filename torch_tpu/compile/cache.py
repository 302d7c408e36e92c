"""The persistent tier of the compile cache: XLA executables on disk, shared by processes and restarts.

Entries live under `TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT` (default: `$XDG_CACHE_HOME/torch_tpu/xla`, i.e.
`~/.cache/torch_tpu/xla`), in a directory private to the user. An entry's key is a SHA-256 of the program's
StableHLO and of the torch, jax, jaxlib and torch_tpu versions and the platform and device kind, so a new
version or another chip never reads it. Writes are atomic (a temporary file renamed into place); an entry that
fails to load is discarded with a warning and the program is compiled again. `TORCH_TPU_PERSISTENT_CACHE=0`
turns the tier off. `compile.warm` keeps its graph-keyed index (`graphs/`) in the same directory, in the same
entry format (`read_entry`, `write_entry`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import jax
from jax.experimental import serialize_executable

from torch_tpu import precision
from torch_tpu.runtime import platform

_FORMAT = 1


def root() -> pathlib.Path:
    """The cache directory (not created until the first write)."""
    configured = os.environ.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")
    if configured:
        return pathlib.Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "torch_tpu" / "xla"


def enabled() -> bool:
    return os.environ.get("TORCH_TPU_PERSISTENT_CACHE", "1") != "0"


@functools.cache
def environment() -> str:
    """What an executable depends on besides its program: versions, platform, device kind, and in a
    multi-process job the process count and the device's id (an executable is bound to its device assignment,
    so rank 1 must not load rank 0's)."""
    device = platform.device()
    parts = [f"{name}={version(name)}" for name in ("torch", "jax", "jaxlib", "torch_tpu")]
    parts += [f"platform={platform.platform()}", f"device={device.device_kind}", f"format={_FORMAT}"]
    parts += [f"processes={jax.process_count()}", f"device_id={device.id}"]
    return ";".join(parts)


class DiskStats:
    """Counters of the persistent tier, reported by `torch.tpu._get_cache_stats()["persistent"]`: executables
    (`hits`, ...), the graph-keyed index that spares a warm process the lowering (`graph_*`, `compile.warm`; its
    hit loads an executable, so it counts as an executable hit too) and AOTAutograd's own cache as our backend
    uses it (`aot_autograd_*`, counted by PyTorch)."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.discarded = 0
        self.graph_hits = 0
        self.graph_misses = 0
        self.graph_writes = 0

    def as_dict(self) -> dict[str, Any]:
        aot = _aot_autograd_counters()
        return {
            "root": str(root()),
            "enabled": enabled(),
            "hits": self.hits,
            "misses": self.misses,
            "writes": self.writes,
            "discarded": self.discarded,
            "graph_hits": self.graph_hits,
            "graph_misses": self.graph_misses,
            "graph_writes": self.graph_writes,
            "aot_autograd_hits": aot.get("autograd_cache_hit", 0),
            "aot_autograd_misses": aot.get("autograd_cache_miss", 0),
            "aot_autograd_saved": aot.get("autograd_cache_saved", 0),
            "aot_autograd_bypasses": aot.get("autograd_cache_bypass", 0),
        }


def _aot_autograd_counters() -> dict[str, int]:
    """PyTorch's AOTAutograd cache counters, without importing Dynamo when nothing was compiled."""
    utils = sys.modules.get("torch._dynamo.utils")
    return dict(utils.counters["aot_autograd"]) if utils is not None else {}


stats = DiskStats()


def _path(key: str) -> pathlib.Path:
    return root() / key[:2] / f"{key}.xla"


def _private_dirs(path: pathlib.Path) -> None:
    top = root()
    top.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(top, 0o700)
    directory = top
    for part in path.relative_to(top).parts:
        directory = directory / part
        directory.mkdir(mode=0o700, exist_ok=True)


def read_entry(path: pathlib.Path, decode: Callable[[Any], Any] = lambda payload: payload) -> Any | None:
    """`decode(payload)` of the entry at `path`, None if absent; an unreadable entry, or one written by another
    environment, is deleted with a warning (it is recompiled, never trusted)."""
    if not path.exists():
        return None
    try:
        with open(path, "rb") as handle:
            header, payload = pickle.load(handle)
        if header != environment():
            raise ValueError("entry written by another environment")
        return decode(payload)
    except Exception as error:
        stats.discarded += 1
        warnings.warn(f"torch_tpu: discarding unreadable compile-cache entry {path}: {error}", stacklevel=3)
        path.unlink(missing_ok=True)
        return None


def write_entry(path: pathlib.Path, payload: Any) -> bool:
    """Write `payload` (with the environment as header) atomically: a temporary file renamed into place, so
    that concurrent writers and readers never see part of an entry. False (and a warning) if it failed."""
    try:
        _private_dirs(path.parent)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(descriptor, "wb") as handle:
            pickle.dump((environment(), payload), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        return True
    except Exception as error:  # a cache that cannot be written only costs a recompile next time
        warnings.warn(f"torch_tpu: could not write compile-cache entry {path}: {error}", stacklevel=3)
        return False


def load(key: str) -> Any | None:
    """The executable stored under the program key `key`, or None."""
    # Onto this process's device only: by default it is loaded onto every device of the job.
    device = platform.device()
    return read_entry(
        _path(key), lambda payload: serialize_executable.deserialize_and_load(*payload, execution_devices=[device])
    )


def _store(key: str, compiled: Any) -> None:
    try:
        payload = serialize_executable.serialize(compiled)
    except Exception as error:
        warnings.warn(f"torch_tpu: could not serialize compile-cache entry {key}: {error}", stacklevel=3)
        return
    if write_entry(_path(key), payload):
        stats.writes += 1


def fast_call(compiled: Any) -> Any:
    """The C++ call path of a `jax.stages.Compiled` once it has been called (skips a Python frame per call)."""
    return getattr(compiled, "_call", None) or compiled


def compile_lowered(lowered: jax.stages.Lowered) -> tuple[Any, bool]:
    """The executable of `lowered`, from disk if present (and then True), else compiled and stored."""
    compiled, from_disk, _ = compile_keyed(lowered)
    return compiled, from_disk


def compile_keyed(lowered: jax.stages.Lowered) -> tuple[Any, bool, str | None]:
    """`compile_lowered`, and the program key the executable is stored under (None with the tier off), which
    `compile.warm` records so that a later process can load the executable without lowering again."""
    options = precision.compiler_options()
    if not enabled():
        return lowered.compile(options), False, None
    # The signature too: jax.jit drops unused arguments, so two calling conventions can share one StableHLO.
    signature = f"{lowered.in_tree}\n{lowered.args_info}\n{lowered.out_tree}"
    text = f"{environment()}\n{sorted(options.items())}\n{signature}\n{lowered.as_text()}"
    key = hashlib.sha256(text.encode()).hexdigest()
    compiled = load(key)
    if compiled is not None:
        stats.hits += 1
        return compiled, True, key
    stats.misses += 1
    compiled = lowered.compile(options)
    _store(key, compiled)
    return compiled, False, key
