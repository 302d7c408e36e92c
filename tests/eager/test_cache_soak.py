"""Tier 1 of the executable cache is bounded: least recently used entries go, by count and by estimated bytes,
and an evicted executable is really released — the process's memory mappings (XLA maps each executable's code,
against the kernel's vm.max_map_count) stop growing however many distinct programs run."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_tpu.eager.cache import Entry, ExecutableCache
from torch_tpu.runtime import persistent

# Distinct programs, each its own executable: a multiply of the first n elements of one buffer (the view's shape
# is compiled in), every `FUSED_EVERY`th one a fused cluster instead. Prints the mapping count every `EVERY`.
SOAK = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from torch_tpu.eager.cache import executables

    def mappings():
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)

    programs, every = int(sys.argv[1]), int(sys.argv[2])
    data = torch.ones(programs + 8, device="tpu")
    samples, start = [], time.perf_counter()
    for n in range(1, programs + 1):
        if n % 7 == 0:
            with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                value = (data[:n] + 1.0) * 3.0
            torch.tpu.synchronize()
        else:
            value = data[:n] * 2.0
        if n % every == 0:
            assert value[-1].item() == (6.0 if n % 7 == 0 else 2.0)
            samples.append(mappings())
            print(n, samples[-1], round(time.perf_counter() - start, 1), flush=True)
    stats = executables.stats()
    print(json.dumps({"samples": samples, "seconds": time.perf_counter() - start, "entries": stats["num_entries"],
                      "inserts": stats["num_inserts"], "evictions": stats["num_evictions"]}))
    """
)


def soak(programs: int, every: int, max_entries: int, timeout: float, log: Path) -> dict:
    """Runs SOAK in a fresh process; its progress lines go to `log` as they come (a long soak can be watched)."""
    env = dict(os.environ, TORCH_TPU_EXECUTABLE_CACHE_ENTRIES=str(max_entries), TORCH_TPU_PERSISTENT_CACHE="0")
    with open(log, "w") as out:
        done = subprocess.run(
            [sys.executable, "-c", SOAK, str(programs), str(every)],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=timeout,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(log.read_text().strip().splitlines()[-1])


def _entry(name: str) -> Entry:
    return Entry(name, lambda: name)


def test_least_recently_read_entries_are_evicted_first():
    cache = ExecutableCache(max_entries=10)
    for i in range(10):
        cache.insert(i, _entry(str(i)))
    for i in range(5):  # read the older half: the newer half is now the least recently read
        cache.entries[i].last_read += 1000.0
    cache.insert(10, _entry("10"))
    assert len(cache.entries) <= 10 and cache.num_evictions >= 1
    assert set(range(5)) <= set(cache.entries) and 10 in cache.entries
    assert not any(k in cache.entries for k in range(5, 5 + cache.num_evictions))
    assert cache.num_inserts == 11 and cache.stats()["num_evictions"] == cache.num_evictions


def test_count_bound_holds_over_many_inserts():
    cache = ExecutableCache(max_entries=64)
    for i in range(1000):
        cache.insert(i, _entry(str(i)))
        assert len(cache.entries) <= 64
    assert cache.num_inserts == 1000 and cache.num_evictions == 1000 - len(cache.entries)
    assert 999 in cache.entries


def test_byte_bound_uses_the_footprint_estimate():
    cache = ExecutableCache(max_entries=1000, max_bytes=5 * persistent.DEFAULT_FOOTPRINT)
    for i in range(20):
        cache.insert(i, _entry(str(i)))
        assert cache.nbytes <= cache.max_bytes
    assert len(cache.entries) <= 5 and cache.nbytes == sum(e.nbytes for e in cache.entries.values())


def test_reinserting_a_key_does_not_count_its_bytes_twice():
    cache = ExecutableCache(max_entries=10)
    cache.insert("k", _entry("a"))
    cache.insert("k", _entry("b"))
    assert cache.nbytes == persistent.DEFAULT_FOOTPRINT and cache.entries["k"].name == "b"


def test_footprint_is_the_serialized_size(tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    ones = jax.numpy.ones(5, jax.numpy.float32)
    compiled, _ = persistent.compile_lowered(jax.jit(lambda a: a * 3 + 1).lower(ones))
    compiled(ones)
    (entry,) = tmp_path.glob("*/*.xla")
    size = persistent.footprint(persistent.fast_call(compiled))
    assert size == persistent.footprint(compiled) and 0 < size < entry.stat().st_size


@pytest.mark.parametrize("name", ["TORCH_TPU_EXECUTABLE_CACHE_ENTRIES", "TORCH_TPU_EXECUTABLE_CACHE_BYTES"])
def test_bounds_are_configurable_and_checked(monkeypatch, name):
    monkeypatch.setenv(name, "123")
    cache = ExecutableCache()
    assert 123 in (cache.max_entries, cache.max_bytes)
    monkeypatch.setenv(name, "0")
    with pytest.raises(ValueError, match=name):
        ExecutableCache()


def test_mappings_stop_growing_under_a_bound(tmp_path):
    """160 distinct programs through a 16-entry table: once the table is full the count is flat (unbounded, it
    grows by ~3 mappings per program: ~290 over the samples compared)."""
    result = soak(programs=160, every=16, max_entries=16, timeout=600, log=tmp_path / "soak.log")
    samples = result["samples"]
    assert result["entries"] <= 16 and result["evictions"] >= 140, result
    assert max(samples[3:]) - samples[3] < 100, samples


def _trend(samples: list[int], every: int) -> float:
    """Least-squares slope of the mapping count, in mappings per program."""
    n = len(samples)
    mean_x, mean_y = (n - 1) / 2, sum(samples) / n
    cov = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(samples))
    return cov / sum((i - mean_x) ** 2 for i in range(n)) / every


def test_trend_is_the_slope_per_program():
    assert _trend([100, 130, 160, 190], every=10) == pytest.approx(3.0)
    assert _trend([6500, 6400, 6900, 6450, 6350], every=1000) == pytest.approx(-0.025)


@pytest.mark.slow
def test_soak_tens_of_thousands_of_programs(tmp_path):
    """The default bound (2,048 entries), 30,000 distinct programs in one process: no crash, and once the table is
    full the mapping count has no upward trend. Unbounded, each program adds ~3 mappings (90,000 over the run,
    past vm.max_map_count); bounded, glibc's and XLA's allocators make a sawtooth of a few hundred mappings around
    a flat line, so the check is the slope (under 0.05 per program, 60x below unbounded) and the band (1,500)."""
    result = soak(programs=30000, every=1000, max_entries=2048, timeout=9000, log=tmp_path / "soak.log")
    samples = result["samples"][2:]  # from 3,000 programs: the table filled at 2,048
    print(json.dumps(result))
    assert result["entries"] <= 2048 and result["inserts"] >= 30000, result
    assert _trend(samples, every=1000) < 0.05 and max(samples) - min(samples) < 1500, result["samples"]
