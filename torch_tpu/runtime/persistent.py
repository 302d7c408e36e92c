"""The persistent tier of the compile cache: XLA executables on disk, shared by processes and restarts.

Entries live under `TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT` (default: `$XDG_CACHE_HOME/torch_tpu/xla`, i.e.
`~/.cache/torch_tpu/xla`), in a directory private to the user. An entry's key is a SHA-256 of the program's
StableHLO and of the torch, jax, jaxlib and torch_tpu versions and the platform and device kind, so a new
version or another chip never reads it. `TORCH_TPU_PERSISTENT_CACHE=0` turns the tier off. `compile.warm`
keeps its graph-keyed index (`graphs/`) in the same directory, in the same entry format (`read_entry`,
`write_entry`).

An entry file is a header — magic, the body's length and its BLAKE2b digest — then the body, a pickle of (the
environment, the payload). A reader checks length and digest before unpickling or deserializing anything, so a
truncated, torn or corrupted file is discarded with a warning and the program compiled again, never handed to
XLA. Writes are atomic: the whole file goes to a temporary file in the entry's directory, is flushed to disk and
renamed into place, so readers see the old entry or the new one, never part of one, and two processes writing one
key leave one complete entry (the last rename wins; both wrote the same program).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import pathlib
import pickle
import struct
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from importlib.metadata import version
from typing import Any

import jax

from torch_tpu import metrics, precision
from torch_tpu.runtime import compat, platform

_FORMAT = 2
_MAGIC = b"TTPUXLA2"
_HEADER = struct.Struct(f"<{len(_MAGIC)}sQ32s")  # magic, body length, BLAKE2b-256 digest of the body
DEFAULT_FOOTPRINT = 64 << 10
"""The size estimate of an executable the tier did not serialize (off, or not serializable): a generous bound of
a small op's serialized CPU executable (~10-20 KiB)."""

_footprints: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


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
    """What an executable depends on besides its program: versions, platform, device kind, the compiler's flags,
    and in a multi-process job the process count and the device's id (an executable is bound to its device
    assignment, so rank 1 must not load rank 0's)."""
    device = platform.device()
    parts = [f"{name}={version(name)}" for name in ("torch", "jax", "jaxlib", "torch_tpu")]
    parts += [f"platform={platform.platform()}", f"device={device.device_kind}", f"format={_FORMAT}"]
    parts += [f"processes={jax.process_count()}", f"device_id={device.id}", compiler_flags()]
    return ";".join(parts)


def compiler_flags() -> str:
    """The XLA and libtpu flags set in the environment, which change what XLA compiles (JAX keys its own cache on
    them too): a process started with other flags must not load executables compiled without them. Dump flags,
    which only say where XLA writes its dumps, are left out."""
    parts = []
    for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
        flags = [flag for flag in os.environ.get(name, "").split() if not flag.startswith("--xla_dump")]
        parts.append(f"{name}={' '.join(flags)}")
    return ";".join(parts)


@dataclasses.dataclass
class DiskStats:
    """Counters of the persistent tier, reported by `torch.tpu._get_cache_stats()["persistent"]`: executables
    (`hits`, ...), the graph-keyed index that spares a warm process the lowering (`graph_*`, `compile.warm`; its
    hit loads an executable, so it counts as an executable hit too) and AOTAutograd's own cache as our backend
    uses it (`aot_autograd_*`, counted by PyTorch); `loaded_ahead`: hits that found their executable loaded
    already (`recent`)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    discarded: int = 0
    graph_hits: int = 0
    graph_misses: int = 0
    graph_writes: int = 0
    loaded_ahead: int = 0

    def as_dict(self) -> dict[str, Any]:
        aot = _aot_autograd_counters()
        return {
            "root": str(root()),
            "enabled": enabled(),
            **dataclasses.asdict(self),
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
metrics.tally("persistent", lambda: {key: value for key, value in stats.as_dict().items() if type(value) is int})


def program_path(key: str) -> pathlib.Path:
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
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    try:
        header, payload = pickle.loads(_verified_body(data))
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
        body = pickle.dumps((environment(), payload))
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(_HEADER.pack(_MAGIC, len(body), _digest(body)))
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        return True
    except Exception as error:  # a cache that cannot be written only costs a recompile next time
        warnings.warn(f"torch_tpu: could not write compile-cache entry {path}: {error}", stacklevel=3)
        return False


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=32).digest()


def _verified_body(data: bytes) -> bytes:
    """The body of an entry file's bytes, after checking the header's magic, length and digest."""
    if len(data) < _HEADER.size:
        raise ValueError(f"truncated entry: {len(data)} bytes, shorter than its header")
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError("not an entry of this format")
    body = data[_HEADER.size :]
    if len(body) != length:
        raise ValueError(f"truncated entry: {len(body)} bytes of a {length}-byte body")
    if _digest(body) != digest:
        raise ValueError("checksum mismatch")
    return body


def _deserialize(payload: tuple, devices: Sequence[Any] | None = None) -> Any:
    # Onto this process's device only (by default it is loaded onto every device of the job), or an SPMD
    # program's devices.
    execution_devices = list(devices) if devices is not None else [platform.device()]
    compiled = compat.deserialize_executable(payload, execution_devices)
    _footprints[compiled] = len(payload[0])
    return compiled


requested: dict[str, None] = {}
"""The program keys this process asked the tier for (executables for this process's device), in order: the
list `recent` writes at exit, for the next run of the same command to load ahead."""
ahead: dict[str, Future] = {}
"""Executables loading ahead of their request (`recent.start`), by key: each future's result is the executable or
None."""


def load(key: str, devices: Sequence[Any] | None = None, remember: bool = True) -> Any | None:
    """The executable stored under the program key `key` (loaded onto `devices`, default this process's
    device), or None. `remember`: a program the next run of this command will ask for too (`requested`), not
    one it stands in for meanwhile (a quick program, a part)."""
    if devices is None:
        if remember:
            requested.setdefault(key)
        loading = ahead.pop(key, None)
        # one not begun yet loads here: the list's order is the last run's, and it may wait behind others
        if loading is not None and not loading.cancel():
            compiled = loading.result()
            if compiled is not None:
                stats.loaded_ahead += 1
                return compiled
    return read_program(key, devices)


def read_program(key: str, devices: Sequence[Any] | None = None) -> Any | None:
    """`load` from the file itself: the executable stored under `key`, or None."""
    return read_entry(program_path(key), lambda payload: _deserialize(payload, devices))


os.register_at_fork(after_in_child=ahead.clear)  # a forked child has none of the threads that would load them


def _store(key: str, compiled: Any) -> None:
    try:
        payload = compat.serialize_executable(compiled)
    except Exception as error:
        warnings.warn(f"torch_tpu: could not serialize compile-cache entry {key}: {error}", stacklevel=3)
        return
    _footprints[compiled] = len(payload[0])
    if write_entry(program_path(key), payload):
        stats.writes += 1


def fast_call(compiled: Any) -> Any:
    """The C++ call path of a `jax.stages.Compiled` once it has been called (skips a Python frame per call)."""
    call = getattr(compiled, "_call", None)
    if call is None:
        return compiled
    size = _footprints.get(compiled)
    if size is not None:
        _footprints[call] = size
    return call


def temp_bytes(compiled: Any) -> int | None:
    """The device memory a program needs beside its arguments and outputs while it runs (XLA's buffer plan:
    `memory_analysis().temp_size_in_bytes`), or None where the executable does not say. PJRT's
    `peak_bytes_in_use` may leave it out, so that a step's peak memory is this plus the buffers."""
    try:
        return int(compiled.memory_analysis().temp_size_in_bytes)
    except Exception:  # an executable without an analysis (a platform's, a loaded one's): unknown, not zero
        return None


def footprint(executable: Any) -> int:
    """The bytes an executable (a `Compiled` or its `fast_call`) is estimated to keep resident: its serialized size
    when this tier serialized or loaded it, else `DEFAULT_FOOTPRINT`."""
    try:
        return _footprints.get(executable, DEFAULT_FOOTPRINT)
    except TypeError:  # not weakly referenceable (a plain function: an op run eagerly)
        return DEFAULT_FOOTPRINT


def add_footprint(executable: Any, nbytes: int) -> None:
    """Take `nbytes` as the footprint of an executable made of others (a split cluster's parts, `eager.parts`)."""
    _footprints[executable] = nbytes


def _eager_options(effort: str) -> dict[str, float]:
    """XLA's options for eager per-op executables at `effort` (XLA's `exec_time_optimization_effort`, -1 to 1;
    "default": XLA's own)."""
    if effort.strip().lower() == "default":
        return {}
    try:
        return {"exec_time_optimization_effort": float(effort)}
    except ValueError:
        raise ValueError(
            f"torch_tpu: TORCH_TPU_EAGER_COMPILE_EFFORT={effort!r} is neither a number from -1 to 1 nor 'default'"
        ) from None


# TORCH_TPU_EAGER_COMPILE_EFFORT sets the effort of every eager program: an op's own, a Fused or sealed cluster.
# Unset, an op's program whose arguments and results take less than QUICK_EFFORT_MAX_BYTES is compiled at the
# quickest effort and a larger one at XLA's own; a cluster at the quickest where it only maps elements (no matrix
# product, convolution, reduction, sort, gather or scatter: an optimizer step's), else at XLA's own. On a v5e the
# quickest halved the XLA compiles of the small float32 step's first Strict call (32.7 -> 17.8 s, full-float32
# matmuls the most) with its steps as fast, but made the large bfloat16 step's matmuls run 2.25x as long (Strict
# device time 127 -> 208 ms a step; for its ops without a matrix product alone 127 -> 160); that step's smallest
# matmul touches 25 MiB, the small step's largest program 24 and its largest matmul 11. The large step's AdamW
# over 148 tensors, the largest program its Strict step compiles, took 18.7 s of its first step at XLA's own effort
# and 12.6 at the quickest (the same update in plain JAX: 8.2 against 4.7 s to compile, 2.52 against 2.58 ms a run).
# But ours ran 6.7 ms a step at the quickest against 3.5 at XLA's own (scalars broadcast into whole float32 tensors,
# unfused): where clusters compile in two tiers (`compile_tiered`, a TPU's default), every cluster's final program
# is at XLA's own effort, and the quickest is for what runs while it compiles.
_EFFORT_SETTING = os.environ.get("TORCH_TPU_EAGER_COMPILE_EFFORT")
EAGER_OPTIONS = _eager_options("-1" if _EFFORT_SETTING is None else _EFFORT_SETTING)
EAGER_OPTIONS_BY_SIZE = _EFFORT_SETTING is None
QUICK_EFFORT_MAX_BYTES = 16 << 20


def _operand_bytes(lowered: jax.stages.Lowered) -> int:
    """The bytes of a lowered program's arguments and results, from their shapes (nothing is compiled or run)."""
    total = 0
    for aval in [*jax.tree_util.tree_leaves(lowered.in_avals), *jax.tree_util.tree_leaves(lowered.out_info)]:
        total += math.prod(aval.shape) * getattr(aval.dtype, "itemsize", 0)
    return total


def _eager_program_options(lowered: jax.stages.Lowered, text: str, cluster: bool) -> dict[str, float]:
    """The effort options of an eager program (`text`: its StableHLO; `cluster`: a Fused or sealed cluster's, else
    an op's own): `EAGER_OPTIONS` where set, else by the op's size or the cluster's work."""
    if not EAGER_OPTIONS_BY_SIZE:
        return EAGER_OPTIONS
    if cluster:  # where clusters compile in two tiers, the quickest effort is the stand-in's alone
        return EAGER_OPTIONS if _maps_elements_only(text) and not tiering() else {}
    return EAGER_OPTIONS if _operand_bytes(lowered) < QUICK_EFFORT_MAX_BYTES else {}


_NOT_A_MAP = ("dot_general", "dot ", "convolution", "reduce", "sort", "gather", "scatter", "custom_call")


def _maps_elements_only(text: str) -> bool:
    """Whether a program's StableHLO only maps elements: none of the ops whose code XLA's effort shapes."""
    return not any(f"stablehlo.{op}" in text for op in _NOT_A_MAP)


def compile_lowered(
    lowered: jax.stages.Lowered, devices: Sequence[Any] | None = None, eager: bool = False
) -> tuple[Any, bool]:
    """The executable of `lowered`, from disk if present (and then True), else compiled and stored. `devices`:
    an SPMD program's devices, in its mesh's order (default: the program runs on this process's device); `eager`:
    an eager op's own program (compiled with `EAGER_OPTIONS`, by its size). A Fused cluster's compiles on a pool
    (`compile_soon`, `compile_tiered`)."""
    compiled, from_disk, _ = compile_keyed(lowered, devices, eager)
    return compiled, from_disk


def compile_keyed(
    lowered: jax.stages.Lowered, devices: Sequence[Any] | None = None, eager: bool = False
) -> tuple[Any, bool, str | None]:
    """`compile_lowered`, and the program key the executable is stored under (None with the tier off), which
    `compile.warm` records so that a later process can load the executable without lowering again.

    An SPMD program's executable is bound to its device assignment, which its StableHLO does not name (only the
    device count): the key holds the ids of `devices`, besides the process count and this process's device."""
    options, key, compiled = look_up(lowered, devices, eager)
    if compiled is not None:
        return compiled, True, key
    return compile_and_store(lowered, options, key), False, key


def compile_and_store(lowered: jax.stages.Lowered, options: dict, key: str | None) -> Any:
    """`lowered` compiled with `options`, stored in this tier under `key` (None: the tier is off)."""
    compiled = lowered.compile(options)
    if key is not None:
        _store(key, compiled)
    return compiled


def look_up(
    lowered: jax.stages.Lowered,
    devices: Sequence[Any] | None,
    eager: bool,
    cluster: bool = False,
    remember: bool = True,
) -> tuple[dict, str | None, Any | None]:
    """A program's compile options, its key (None with the tier off) and its executable where stored (None to
    compile, a miss); `remember` as `load`'s."""
    text = lowered.as_text() if cluster or enabled() else ""
    effort = _eager_program_options(lowered, text, cluster) if eager or cluster else {}
    options = precision.compiler_options() | effort
    if not enabled():
        return options, None, None
    key = _program_key(lowered, text, devices, options)
    compiled = load(key, devices, remember)
    if compiled is not None:
        stats.hits += 1
    else:
        stats.misses += 1
    return options, key, compiled


def _program_key(lowered: jax.stages.Lowered, text: str, devices: Sequence[Any] | None, options: dict) -> str:
    """The key a program's executable is stored under: its StableHLO (`text`), the compile options, the
    environment."""
    # The signature too: jax.jit drops unused arguments, so two calling conventions can share one StableHLO.
    signature = f"{lowered.in_tree}\n{lowered.args_info}\n{lowered.out_tree}"
    assignment = "" if devices is None else f"devices={[device.id for device in devices]}\n"
    keyed = f"{environment()}\n{assignment}{sorted(options.items())}\n{signature}\n{text}"
    return hashlib.sha256(keyed.encode()).hexdigest()


class Soon:
    """An executable compiling on a pool (`compile_soon`): call it to wait for (executable, from disk, seconds XLA
    took); `done()` says whether that call would return at once. The first call stores it in this tier, on the
    caller's thread; calls from several threads wait for the one compile."""

    def __init__(self, future: Future | None, key: str | None, loaded: Any = None) -> None:
        self._future, self._key = future, key
        self._result: tuple[Any, bool, float] | None = None if future is not None else (loaded, True, 0.0)
        self._lock = threading.Lock()

    @property
    def key(self) -> str | None:
        """The program key it is stored under (None with the tier off)."""
        return self._key

    def done(self) -> bool:
        future = self._future
        return future is None or future.done()

    def store_when_compiled(self) -> None:
        """Store the executable in this tier as soon as it is compiled, on the pool's thread, not at the first call:
        a program nothing may call before the process ends (`compile_tiered`'s full-effort one) is on disk for the
        next process all the same. A failed compile stores nothing and raises at the call."""
        future = self._future
        if future is not None:
            future.add_done_callback(lambda done: None if done.exception() is not None else self())

    def __call__(self) -> tuple[Any, bool, float]:
        if self._result is None:
            with self._lock:
                if self._result is None:
                    self._result = self._wait()
        return self._result

    def _wait(self) -> tuple[Any, bool, float]:
        future = self._future
        if future is None:
            raise RuntimeError("torch_tpu: this program's compile failed (raised where it was first needed)")
        try:
            compiled, seconds = future.result()
        except BaseException:
            # the future would keep the error, whose traceback grows by every frame it is raised through (the
            # failed values' tensors among their locals): only the raise holds it now
            self._future = future = None
            raise
        if self._key is not None:
            _store(self._key, compiled)
        return compiled, False, seconds


def compile_soon(
    lowered: jax.stages.Lowered, pool: Executor, eager: bool = False, cluster: bool = False, remember: bool = True
) -> Soon:
    """`compile_lowered` with XLA's compile on `pool`, so that the caller goes on meanwhile (XLA releases the GIL
    while it compiles). The options, key and disk read happen now, on the caller's thread: they read settings a
    later change must not reach. `eager`: an eager op's program (`compile_lowered`); `cluster`: a Fused
    cluster's (its effort by its work); `remember` as `load`'s."""
    options, key, compiled = look_up(lowered, None, eager, cluster, remember)
    if compiled is not None:
        return Soon(None, key, compiled)
    return Soon(pool.submit(_timed_compile, lowered, options), key)


TIERED_COMPILE = os.environ.get("TORCH_TPU_TIERED_COMPILE", "auto")
"""A cluster XLA compiles at its own effort runs a stand-in (its ops one by one, `eager.op_by_op`, or a quick
program, `EAGER_OPTIONS`) until that one is compiled (`compile_tiered`): "auto" on a TPU, where a quick program
compiles 2.5-4x faster (on the XLA CPU platform the effort changes neither the compile nor the program much), "1"
everywhere, "0" never."""


def tiering() -> bool:
    """Whether clusters compile in two tiers (`TIERED_COMPILE`, `compile_tiered`)."""
    if TIERED_COMPILE == "auto":
        return platform.platform() == "tpu"
    return TIERED_COMPILE != "0"


def compile_tiered(
    lowered: jax.stages.Lowered, pool: Executor, stand_in: Callable[[], Any] | None = None
) -> tuple[Any, Soon | None]:
    """A cluster's program compiling on `pool` (`compile_soon`); and where that is at XLA's own effort and not on
    disk, something to run meanwhile: `stand_in()` (a `Soon`-like, made once the program's compile is queued), else
    (or where it gives None) a quick program: (the program to run now, the one to switch to once compiled, or
    None). On a v5e a Fused step's
    forward-and-backward cluster compiles in 5.4-6.7 s at the quickest effort against 13-22 s at XLA's own, and
    runs 1.7-1.9x as long: a cold Fused step waited for the slow compile."""
    options, key, compiled = look_up(lowered, None, False, cluster=True)
    if compiled is not None:
        return Soon(None, key, compiled), None
    quick_options = options | EAGER_OPTIONS
    if not tiering() or quick_options == options:
        return Soon(pool.submit(_timed_compile, lowered, options), key), None
    if stand_in is not None:
        final = _full_program(lowered, options, key, pool)  # queued first: the stand-in's compiles follow it
        made = stand_in()
        return (made if made is not None else _quick_program(lowered, quick_options, key, pool)), final
    first = _quick_program(lowered, quick_options, key, pool)
    return first, _full_program(lowered, options, key, pool)


def _quick_program(lowered: jax.stages.Lowered, quick_options: dict, key: str | None, pool: Executor) -> Soon:
    """`compile_tiered`'s quick program: from disk, else compiling on `pool`."""
    # its key: the final program's and the effort (the StableHLO is hashed there already)
    quick_key = None if key is None else hashlib.sha256(f"{key}\n{sorted(EAGER_OPTIONS.items())}".encode()).hexdigest()
    quick = None if quick_key is None else load(quick_key, remember=False)
    if quick_key is not None:
        stats.hits += quick is not None
        stats.misses += quick is None
    if quick is not None:
        return Soon(None, quick_key, quick)
    return Soon(pool.submit(_timed_compile, lowered, quick_options), quick_key)


def _full_program(lowered: jax.stages.Lowered, options: dict, key: str | None, pool: Executor) -> Soon:
    """`compile_tiered`'s final program, compiling on `pool` and stored as soon as it is compiled."""
    final = Soon(pool.submit(_timed_compile, lowered, options), key)
    final.store_when_compiled()
    return final


def compile_stand_in(lowered: jax.stages.Lowered, pool: Executor) -> Soon:
    """A program that stands in for another while that one compiles (`op_by_op`), compiling on `pool` at the
    quickest effort; not stored: a process that has the other on disk never runs it."""
    return Soon(pool.submit(_timed_compile, lowered, precision.compiler_options() | EAGER_OPTIONS), None)


def _timed_compile(lowered: jax.stages.Lowered, options: dict) -> tuple[Any, float]:
    start = time.perf_counter()
    return lowered.compile(options), time.perf_counter() - start
