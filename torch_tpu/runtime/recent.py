"""Loading ahead: the programs the last run of the same command asked the persistent tier for, loaded from disk
on threads as soon as the device is up, so that a warm process's first step finds them in memory.

A warm process's first large GPT step on a v5e spent 3.4 s (Strict eager) to 5.1 s (Fused) of its first call
deserializing its largest executables, one after another on the main thread, each where the step first asked for
it. XLA releases the GIL while it deserializes, so here they load while Python builds the model and records the
step. A program asked for before its load has begun is loaded where asked, as before; one the run never asks for
costs its load and its memory, no more.

The list is the keys asked for, in order, that are on disk at exit (at most `MAX_PROGRAMS`), an entry of the tier
under `recent/` (the tier's format: checked, written atomically), one per command line and environment (which
holds the process's device and the job's process count). `TORCH_TPU_LOAD_AHEAD=0` turns it off.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import pathlib
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch_tpu.runtime import persistent

MAX_PROGRAMS = 1024
"""The programs a list holds, and so loads ahead, at most: the first ones a run asked for."""
THREADS = min(4, max(1, (os.cpu_count() or 2) // 2))
"""Threads loading ahead: the main thread keeps a core (a 2-core machine loads on one)."""

_started = threading.Event()


def enabled() -> bool:
    return persistent.enabled() and os.environ.get("TORCH_TPU_LOAD_AHEAD", "1") != "0"


def start() -> None:
    """Once the device is up (`torch.tpu._lazy_init`): load the last run's programs on threads, and have this
    run's list written at exit."""
    if _started.is_set() or not enabled():
        return
    _started.set()
    atexit.register(_write_list)
    keys = persistent.read_entry(_list_path()) or []
    if not keys:
        return
    pool = ThreadPoolExecutor(THREADS, thread_name_prefix="torch_tpu_load_ahead")
    for key in keys[:MAX_PROGRAMS]:
        persistent.ahead[key] = pool.submit(_load, key)
    pool.shutdown(wait=False)  # its threads end with the list


def _load(key: str) -> Any | None:
    """The executable under `key`, or None: also once the main thread has ended (the process exits, and its
    threads are joined: what is left of the list is not worth waiting for)."""
    if not threading.main_thread().is_alive():
        return None
    return persistent.read_program(key)


def _list_path() -> pathlib.Path:
    command = "\0".join([os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "", *sys.argv[1:]])
    digest = hashlib.sha256(f"{persistent.environment()}\n{command}".encode()).hexdigest()
    return persistent.root() / "recent" / f"{digest}.list"


def _write_list() -> None:
    """This run's list, for the next: the keys it asked for that are on disk (what it compiled, the pool's last
    compiles included: their threads are joined before this runs). A run that asked for none leaves the last list."""
    stored = (key for key in persistent.requested if persistent.program_path(key).exists())
    keys = list(itertools.islice(stored, MAX_PROGRAMS))
    if keys:
        persistent.write_entry(_list_path(), keys)
