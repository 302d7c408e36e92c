"""Fixtures of the eager tests that watch XLA's compiles on the background pool (Fused eager's sealed clusters,
Strict eager's cold ops: tests/eager/test_fused_compile.py, test_warmup.py)."""

import threading
import time

import pytest

from torch_tpu.eager import fused, warmup
from torch_tpu.runtime import persistent


@pytest.fixture
def compiles(monkeypatch):
    """XLA's compiles on the pool: their count and the most that ran at once. While `pair` is set, each waits (up
    to 10 s) for another to run beside it, so that whether they overlap does not depend on how fast the machine
    records; `failing` names programs (by a word of their text) whose compile raises `error()` after `fail_after`
    seconds; `slow` seconds each compile waits first, as on a chip, where a step's ops are still queued when its
    optimizer's cluster is cut. The persistent tier is off, so that every program compiles; both background compiles
    are on, and a cluster compiles once (no quick program first, as on a TPU)."""
    seen = {"running": 0, "most": 0, "count": 0, "pair": False, "failing": (), "fail_after": 0.0, "slow": 0.0}
    seen["error"] = lambda: RuntimeError("an XLA compile that failed")
    changed = threading.Condition()
    compile_now = persistent._timed_compile

    def held(lowered, options):
        time.sleep(seen["slow"])
        if any(name in lowered.as_text() for name in seen["failing"]):
            time.sleep(seen["fail_after"])
            raise seen["error"]()
        with changed:
            seen["running"] += 1
            seen["count"] += 1
            seen["most"] = max(seen["most"], seen["running"])
            changed.notify_all()
            if seen["pair"]:
                changed.wait_for(lambda: seen["running"] >= 2, timeout=10)
        try:
            return compile_now(lowered, options)
        finally:
            with changed:
                seen["running"] -= 1

    monkeypatch.setattr(persistent, "_timed_compile", held)
    monkeypatch.setattr(persistent, "enabled", lambda: False)
    monkeypatch.setattr(persistent, "TIERED_COMPILE", "0")  # a program each (tests/eager/test_tiered_compile.py)
    monkeypatch.setattr(fused, "ASYNC_COMPILE", True)
    monkeypatch.setattr(warmup, "ASYNC_COMPILE", True)
    return seen
