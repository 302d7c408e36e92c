"""Loading ahead (`runtime.recent`): a second run of the same command finds the programs the first one asked for
loaded already and computes what the first computed; a program asked for before its load began loads where asked;
a damaged list is discarded; a process that is ending loads nothing more."""

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.helpers import adamw_losses
from torch_tpu.runtime import persistent, recent
from torch_tpu.testing.compare import float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

STEPS = """
import json, torch
from tests.helpers import adamw_losses
losses = adamw_losses("tpu", steps=2)
print(json.dumps({"losses": losses, "stats": torch.tpu._get_cache_stats()["persistent"]}))
"""


def _run(root, *argv: str, **env: str) -> dict:
    environment = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(root), **env)
    command = [sys.executable, "-c", STEPS, *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.children
def test_a_second_run_of_the_command_finds_its_programs_loaded(tmp_path):
    cold = _run(tmp_path)
    warm = _run(tmp_path)
    other = _run(tmp_path, "another", "command line")  # no list of its own yet
    off = _run(tmp_path, TORCH_TPU_LOAD_AHEAD="0")
    asked = cold["stats"]["misses"]
    assert asked > 0 and cold["stats"]["hits"] == 0 and cold["stats"]["loaded_ahead"] == 0
    assert warm["stats"]["misses"] == 0 and warm["stats"]["hits"] == warm["stats"]["loaded_ahead"] == asked
    assert other["stats"]["hits"] == asked and other["stats"]["loaded_ahead"] == 0
    assert off["stats"]["hits"] == asked and off["stats"]["loaded_ahead"] == 0
    assert warm["losses"] == other["losses"] == off["losses"] == cold["losses"]  # the same programs
    rtol, atol = float32_tolerance(1e-5, 1e-6)  # two steps of a small MLP: a few float32 roundings apart
    cpu = adamw_losses("cpu", steps=2)
    torch.testing.assert_close(torch.tensor(cold["losses"]), torch.tensor(cpu), rtol=rtol, atol=atol)


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A program stored in a fresh tier: its key, and the array it computes from `jnp.arange(4.0)`."""
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    x = jnp.arange(4.0)
    compiled = jax.jit(lambda v: v * 3 + 1).lower(x).compile()
    persistent._store("ab" * 32, compiled)
    return "ab" * 32, x


def test_a_program_asked_for_before_its_load_began_loads_where_asked(stored, monkeypatch):
    key, x = stored
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(gate.wait)  # the one thread loading ahead is on another program
        queued = pool.submit(recent._load, key)
        monkeypatch.setitem(persistent.ahead, key, queued)
        before = persistent.stats.loaded_ahead
        loaded = persistent.load(key, remember=False)
        gate.set()
    assert busy.result() and queued.cancelled() and key not in persistent.ahead
    assert persistent.stats.loaded_ahead == before  # read here, not waited for
    assert loaded(x).tolist() == [1.0, 4.0, 7.0, 10.0]


def test_a_program_loading_ahead_is_waited_for_and_a_failed_load_reads_the_file(stored, monkeypatch):
    key, x = stored
    loading = ThreadPoolExecutor(1)
    done = loading.submit(recent._load, key)
    done.result()
    monkeypatch.setitem(persistent.ahead, key, done)
    before = persistent.stats.loaded_ahead
    assert persistent.load(key, remember=False)(x).tolist() == [1.0, 4.0, 7.0, 10.0]
    assert persistent.stats.loaded_ahead == before + 1
    failed: Future = Future()
    failed.set_result(None)  # (a damaged entry, discarded by the thread that read it)
    monkeypatch.setitem(persistent.ahead, key, failed)
    assert persistent.load(key, remember=False)(x).tolist() == [1.0, 4.0, 7.0, 10.0]
    assert persistent.stats.loaded_ahead == before + 1
    loading.shutdown()


def test_a_process_that_is_ending_loads_nothing_more(stored, monkeypatch):
    key, _ = stored

    class Ended:
        def is_alive(self) -> bool:
            return False

    monkeypatch.setattr(recent.threading, "main_thread", Ended)
    monkeypatch.setattr(persistent, "read_program", lambda *args: pytest.fail("read while the process ends"))
    assert recent._load(key) is None


def test_a_damaged_list_is_discarded_and_nothing_loads_ahead(stored, monkeypatch):
    key, _ = stored
    path = recent._list_path()
    persistent.write_entry(path, [key])
    path.write_bytes(path.read_bytes()[:-3])
    registered = []
    monkeypatch.setattr(recent, "_started", threading.Event())
    monkeypatch.setattr(recent.atexit, "register", registered.append)
    with pytest.warns(UserWarning, match="discarding unreadable compile-cache entry"):
        recent.start()
    assert key not in persistent.ahead and not path.exists()
    assert registered == [recent._write_list]  # this run's list is still written at exit
