"""The persistent compile cache: hits across processes, atomic writes, corrupted entries, privacy, keys."""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

SCRIPT = """
import json, warnings, torch
warnings.simplefilter("always")
x = torch.arange(12.0, device="tpu").reshape(3, 4)
eager = (x * 2 + 1).relu().sum(dim=1)
model = torch.compile(torch.nn.Linear(4, 2).to("tpu"), backend="tpu")
torch.manual_seed(0)
out = model(x)
stats = torch.tpu._get_cache_stats()["persistent"]
print(json.dumps({"eager": eager.cpu().tolist(), "stats": stats, "out_shape": list(out.shape)}))
"""


def run(root: pathlib.Path) -> tuple[dict, str]:
    env = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(root))
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def entries(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(root.glob("*/*.xla"))


def test_second_process_hits_every_entry(tmp_path):
    cold, _ = run(tmp_path)
    assert cold["stats"]["hits"] == 0 and cold["stats"]["misses"] > 0
    assert cold["stats"]["writes"] == cold["stats"]["misses"] == len(entries(tmp_path))
    warm, _ = run(tmp_path)
    assert warm["stats"]["misses"] == 0 and warm["stats"]["hits"] == cold["stats"]["misses"]
    assert warm["eager"] == cold["eager"] == [16.0, 48.0, 80.0]


def test_directory_is_private(tmp_path):
    root = tmp_path / "cache"
    run(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.parent.stat().st_mode) == 0o700 for p in entries(root))


def test_corrupted_entries_are_discarded_and_recompiled(tmp_path):
    cold, _ = run(tmp_path)
    for path in entries(tmp_path):
        path.write_bytes(b"not an executable")
    again, stderr = run(tmp_path)
    assert "discarding unreadable compile-cache entry" in stderr
    assert again["stats"]["discarded"] == cold["stats"]["misses"]
    assert again["eager"] == cold["eager"]
    healed, _ = run(tmp_path)
    assert healed["stats"]["discarded"] == 0 and healed["stats"]["misses"] == 0


def test_truncated_entry_is_discarded(tmp_path):
    run(tmp_path)
    victim = entries(tmp_path)[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    again, stderr = run(tmp_path)
    assert again["stats"]["discarded"] == 1 and "discarding" in stderr


def test_concurrent_writers_never_leave_partial_entries(tmp_path):
    env = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    assert not list(tmp_path.glob("*/.tmp-*"))
    reader, stderr = run(tmp_path)
    assert reader["stats"]["discarded"] == 0 and reader["stats"]["misses"] == 0, stderr


def test_entries_are_keyed_to_the_environment(tmp_path, monkeypatch):
    import shutil

    import jax

    from torch_tpu.compile import cache

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    lowered = jax.jit(lambda a: a * 5).lower(jax.numpy.ones(3))
    _, from_disk = cache.compile_lowered(lowered)
    assert not from_disk
    (written,) = entries(tmp_path)
    _, from_disk = cache.compile_lowered(lowered)
    assert from_disk
    # Another torch/jax/jaxlib/torch_tpu version or platform: another key, so the entry is not used ...
    monkeypatch.setattr(cache, "environment", lambda: "torch=0.0;jax=0.0;platform=elsewhere")
    _, from_disk = cache.compile_lowered(lowered)
    assert not from_disk
    # ... and an entry whose header names another environment is discarded even under a matching name.
    for other in entries(tmp_path):
        if other != written:
            shutil.copy(written, other)
    with pytest.warns(UserWarning, match="another environment"):
        _, from_disk = cache.compile_lowered(lowered)
    assert not from_disk


def test_cache_can_be_disabled(tmp_path, monkeypatch):
    from torch_tpu.compile import cache

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("TORCH_TPU_PERSISTENT_CACHE", "0")
    import jax

    _, from_disk = cache.compile_lowered(jax.jit(lambda a: a - 1).lower(jax.numpy.ones(2)))
    assert not from_disk and not entries(tmp_path)


def test_stats_fields():
    import torch

    (torch.ones(2, device="tpu") + 1).cpu()
    stats = torch.tpu._get_cache_stats()
    assert {"num_cache_reqs", "num_cache_hits", "per_entry_stats", "persistent"} <= set(stats)
    entry = stats["per_entry_stats"][0]
    assert {"read_count", "compilation_duration", "last_read", "name", "source"} <= set(entry)
