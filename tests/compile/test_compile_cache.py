"""The persistent compile cache: hits across processes, atomic writes, corrupted entries, privacy, keys, and the
warm-start layers (AOTAutograd's cache, the graph-keyed index)."""

import json
import os
import pathlib
import shutil
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


def run(root: pathlib.Path, script: str = SCRIPT, **extra_env: str) -> tuple[dict, str]:
    # PyTorch's cache directory (AOTAutograd's entries) is private to the test too, beside the root.
    env = dict(
        os.environ,
        TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(root),
        TORCHINDUCTOR_CACHE_DIR=str(root.parent / f"{root.name}-inductor"),
        **extra_env,
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
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


def test_entries_are_keyed_to_the_compilers_flags(tmp_path, monkeypatch):
    """A process started with other XLA flags compiles again (they change the executables); flags that only say
    where XLA dumps its programs do not count."""
    from torch_tpu.runtime import persistent

    cold, _ = run(tmp_path)
    other, _ = run(tmp_path, XLA_FLAGS="--xla_backend_optimization_level=2")
    assert other["stats"]["hits"] == 0 and other["stats"]["misses"] == cold["stats"]["misses"]
    assert other["eager"] == cold["eager"]
    again, _ = run(tmp_path, XLA_FLAGS="--xla_backend_optimization_level=2")
    assert again["stats"]["misses"] == 0
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2 --xla_dump_to=/tmp/somewhere")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_some_flag=true")
    keyed = persistent.compiler_flags()
    assert "XLA_FLAGS=--xla_backend_optimization_level=2;" in keyed and "dump" not in keyed
    assert keyed.endswith("LIBTPU_INIT_ARGS=--xla_tpu_some_flag=true")


FILLS = """
import json, torch
zeros = torch.zeros(5, 7, device="tpu")
full = torch.full((3,), 2.5, device="tpu")
ones = torch.ones(2, 2, dtype=torch.bfloat16, device="tpu")
stats = torch.tpu._get_cache_stats()["persistent"]
print(json.dumps({"values": [zeros.cpu().tolist(), full.cpu().tolist(), ones.float().cpu().tolist()], "stats": stats}))
"""


def test_a_second_process_loads_the_fill_helpers_programs(tmp_path):
    """Fills of fresh storages (zeros, full, ones: an optimizer's new state) make their arrays with small jitted
    helpers, one program per shape and dtype: a warm process loads them instead of compiling them again."""
    cold, _ = run(tmp_path, FILLS)
    warm, _ = run(tmp_path, FILLS)
    assert cold["stats"]["misses"] == 3 and cold["stats"]["hits"] == 0  # zeros 5x7, full float32 3, full bf16 2x2
    assert warm["stats"]["misses"] == 0 and warm["stats"]["hits"] == 3
    expected = [[[0.0] * 7] * 5, [2.5] * 3, [[1.0, 1.0], [1.0, 1.0]]]
    assert cold["values"] == warm["values"] == expected


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


@pytest.mark.parametrize("damage", ["truncated", "flipped", "header_only", "empty"])
def test_damaged_entry_is_never_deserialized(tmp_path, monkeypatch, damage):
    """The header's length and digest are checked before XLA sees a byte: a damaged entry is discarded with a
    warning (not handed to `deserialize_and_load`, which may crash on it), compiled again and rewritten (the next
    read loads it)."""
    import jax
    from jax.experimental import serialize_executable

    from torch_tpu.runtime import persistent

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    ones = jax.numpy.ones(4, jax.numpy.float32)
    lowered = jax.jit(lambda a: a * 7).lower(ones)
    persistent.compile_lowered(lowered)
    (path,) = entries(tmp_path)
    data = path.read_bytes()
    middle = len(data) * 3 // 4  # inside the serialized executable
    path.write_bytes(
        {
            "truncated": data[:-1],
            "flipped": data[:middle] + bytes([data[middle] ^ 0x55]) + data[middle + 1 :],
            "header_only": data[: persistent._HEADER.size],
            "empty": b"",
        }[damage]
    )
    calls = []
    real = serialize_executable.deserialize_and_load
    monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *a, **k: calls.append(a) or real(*a, **k))
    discarded = persistent.stats.discarded
    with pytest.warns(UserWarning, match="discarding unreadable compile-cache entry"):
        compiled, from_disk = persistent.compile_lowered(lowered)
    assert not from_disk and not calls and persistent.stats.discarded == discarded + 1
    assert compiled(ones).tolist() == [7.0] * 4
    compiled, from_disk = persistent.compile_lowered(lowered)
    assert from_disk and len(calls) == 1 and compiled(ones).tolist() == [7.0] * 4


def test_concurrent_writers_never_leave_partial_entries(tmp_path):
    env = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    assert not list(tmp_path.glob("*/.tmp-*"))
    reader, stderr = run(tmp_path)
    assert reader["stats"]["discarded"] == 0 and reader["stats"]["misses"] == 0, stderr


def _hammer(root: str, worker: int, rounds: int, size: int) -> dict:
    """A spawned process: writes one shared entry (`worker`'s byte repeated) and reads it back, `rounds` times;
    returns what it read that was not one whole entry of some worker."""
    os.environ["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = root
    from torch_tpu.runtime import persistent

    path = pathlib.Path(root) / "sh" / "shared.xla"
    bad = []
    for i in range(rounds):
        if i % 2 == worker % 2:
            assert persistent.write_entry(path, bytes([worker]) * size)
        payload = persistent.read_entry(path)
        if payload is not None and (len(payload) != size or len(set(payload)) != 1):
            bad.append((len(payload), sorted(set(payload))[:4]))
    return {"bad": bad, "discarded": persistent.stats.discarded}


def _compile_same(root: str) -> tuple[list, bool]:
    """A spawned process: the same program through the persistent tier; its result and whether it was loaded."""
    os.environ["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = root
    import jax

    from torch_tpu.runtime import persistent

    ones = jax.numpy.ones(6, jax.numpy.float32)
    compiled, from_disk = persistent.compile_lowered(jax.jit(lambda a: jax.numpy.cumsum(a) * 3).lower(ones))
    return compiled(ones).tolist(), from_disk


def test_concurrent_writers_and_readers_of_one_key_see_whole_entries(tmp_path, monkeypatch):
    """Four processes (spawned) replace one entry and read it back in turns: every read is a whole entry of one
    writer (the rename is atomic; the digest would catch anything else), nothing is discarded, and no temporary
    file is left behind."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(4) as pool:
        runs = [pool.apply_async(_hammer, (str(tmp_path), worker, 60, 1 << 20)) for worker in range(4)]
        results = [run.get(timeout=300) for run in runs]
    assert all(r["bad"] == [] and r["discarded"] == 0 for r in results), results
    assert not list(tmp_path.rglob(".tmp-*"))
    from torch_tpu.runtime import persistent

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    last = persistent.read_entry(tmp_path / "sh" / "shared.xla")
    assert len(last) == 1 << 20 and len(set(last)) == 1


def test_concurrent_compiles_of_one_program_agree(tmp_path):
    """Processes compiling one program at once each get a working executable, and leave one loadable entry."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(3) as pool:
        runs = [pool.apply_async(_compile_same, (str(tmp_path),)) for _ in range(3)]
        results = [run.get(timeout=300) for run in runs]
    expected = [3.0 * (i + 1) for i in range(6)]
    assert all(values == expected for values, _ in results), results
    assert len(entries(tmp_path)) == 1 and not list(tmp_path.rglob(".tmp-*"))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        values, from_disk = pool.apply_async(_compile_same, (str(tmp_path),)).get(timeout=300)
    assert values == expected and from_disk


def test_entries_are_keyed_to_the_environment(tmp_path, monkeypatch):
    import shutil

    import jax

    from torch_tpu.runtime import persistent as cache

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


def test_eager_compile_effort_is_applied_and_keyed(tmp_path, monkeypatch):
    """An eager op's executable is compiled at XLA's quickest effort by default (only an eager op's), at XLA's own
    with TORCH_TPU_EAGER_COMPILE_EFFORT=default; the effort is in the key (an executable compiled at another is not
    taken from disk), and the ops compute what CPU does at either."""
    import jax

    from torch_tpu.runtime import persistent as cache

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    lowered = jax.jit(lambda a: a * 3).lower(jax.numpy.ones(4))
    seen, original = [], type(lowered).compile
    monkeypatch.setattr(
        type(lowered), "compile", lambda self, options=None: seen.append(options) or original(self, options)
    )
    assert cache.EAGER_OPTIONS == {"exec_time_optimization_effort": -1.0} and cache.EAGER_OPTIONS_BY_SIZE
    cache.compile_lowered(lowered, eager=True)
    assert seen[-1]["exec_time_optimization_effort"] == -1.0
    monkeypatch.setattr(cache, "EAGER_OPTIONS", {})
    _, from_disk = cache.compile_lowered(lowered, eager=True)
    assert not from_disk and "exec_time_optimization_effort" not in seen[-1]
    _, from_disk = cache.compile_lowered(lowered)  # not an eager op: XLA's own effort, as just stored
    assert from_disk
    quick, _ = run(tmp_path / "child")
    own, _ = run(tmp_path / "child", TORCH_TPU_EAGER_COMPILE_EFFORT="default")
    again, _ = run(tmp_path / "child", TORCH_TPU_EAGER_COMPILE_EFFORT="-1")
    assert quick["eager"] == own["eager"] == again["eager"] == [16.0, 48.0, 80.0]
    assert quick["stats"]["hits"] == 0 and again["stats"]["misses"] == 0
    # at XLA's own effort the eager ops' executables are compiled again; the compiled model's graph is shared
    assert own["stats"]["misses"] > 0 and own["stats"]["hits"] > 0
    assert own["stats"]["hits"] + own["stats"]["misses"] == quick["stats"]["misses"]


def test_a_large_eager_program_keeps_xlas_own_effort(monkeypatch):
    """Unset, the quickest effort is for an op's programs under QUICK_EFFORT_MAX_BYTES of arguments and results (a
    large matmul ran 2.25x as long at it on a v5e), and for a cluster that only maps elements whatever its size (an
    optimizer step's) unless clusters compile in two tiers (there its stand-in is quick, its program not); a number
    set in TORCH_TPU_EAGER_COMPILE_EFFORT applies to every one."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.runtime import persistent as cache

    monkeypatch.setenv("TORCH_TPU_PERSISTENT_CACHE", "0")
    half = cache.QUICK_EFFORT_MAX_BYTES // 2 // 4  # float32 elements: argument + result = the limit
    quickest = {"exec_time_optimization_effort": -1.0}

    def effort(fn, n: int, cluster: bool = False) -> dict:
        lowered = jax.jit(fn).lower(jax.ShapeDtypeStruct((n // 4, 4), jnp.float32))
        return cache._eager_program_options(lowered, lowered.as_text(), cluster)

    adam_like = lambda a: a * 0.9 + jnp.sqrt(a * a) / (a + 1e-8)
    at_limit = jax.jit(adam_like).lower(jax.ShapeDtypeStruct((half // 4, 4), jnp.float32))
    assert cache._operand_bytes(at_limit) == cache.QUICK_EFFORT_MAX_BYTES
    assert effort(adam_like, half - 4) == quickest and effort(adam_like, half) == {}
    assert effort(adam_like, half, cluster=True) == quickest
    assert effort(lambda a: a.sum(0), 8, cluster=True) == {}  # a reduction
    assert effort(lambda a: a @ jnp.eye(4), 8, cluster=True) == {}  # a matrix product
    monkeypatch.setattr(cache, "TIERED_COMPILE", "1")  # a TPU's default: the quickest is the stand-in's alone
    assert effort(adam_like, half, cluster=True) == {} and effort(adam_like, half - 4) == quickest
    monkeypatch.setattr(cache, "EAGER_OPTIONS_BY_SIZE", False)
    assert effort(adam_like, half) == effort(lambda a: a @ jnp.eye(4), 8, cluster=True) == quickest


def test_a_fused_cluster_compiles_at_its_works_effort(monkeypatch):
    """A Fused cluster that only maps elements compiles at the quickest effort, one with a matrix product at
    XLA's own."""
    import jax
    import torch

    seen, original = [], jax.stages.Lowered.compile
    monkeypatch.setattr(
        jax.stages.Lowered, "compile", lambda self, options=None: seen.append(options) or original(self, options)
    )
    x = torch.arange(6.0, device="tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        y = (x * 2 + 1).cpu()
        z = (x.reshape(2, 3) @ x.reshape(3, 2) + 1).cpu()
    torch.testing.assert_close(y, torch.arange(6.0) * 2 + 1, rtol=0, atol=0)
    torch.testing.assert_close(z, torch.arange(6.0).reshape(2, 3) @ torch.arange(6.0).reshape(3, 2) + 1)
    assert [options.get("exec_time_optimization_effort") for options in seen[-2:]] == [-1.0, None]


def test_a_bad_eager_compile_effort_is_named():
    from torch_tpu.runtime import persistent as cache

    assert cache._eager_options("default") == {} and cache._eager_options("0.5") == {
        "exec_time_optimization_effort": 0.5
    }
    with pytest.raises(ValueError, match="TORCH_TPU_EAGER_COMPILE_EFFORT='fast'"):
        cache._eager_options("fast")


def test_cache_can_be_disabled(tmp_path, monkeypatch):
    from torch_tpu.runtime import persistent as cache

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


# A training step: forward and backward graphs through AOTAutograd; FACTOR changes the graph, EXCESS=0 the
# precision state it is lowered under (torch.tpu.allow_excess_precision).
STEP = """
import json, os, torch
factor = float(os.environ.get("FACTOR", "2"))
torch.tpu.allow_excess_precision = os.environ.get("EXCESS", "1") == "1"
torch.manual_seed(0)
model = torch.nn.Linear(4, 3).to("tpu")
x = torch.arange(8.0).reshape(2, 4).to("tpu")  # all of its storage: the forward's first call is the one foreseen

@torch.compile(backend="tpu")
def step(x):
    loss = (model(x) * factor).tanh().sum()
    loss.backward()
    return loss

loss = step(x)
out = {"loss": loss.item(), "grad": model.weight.grad.cpu().tolist()}
print(json.dumps({**out, "stats": torch.tpu._get_cache_stats()["persistent"]}))
"""


@pytest.fixture(scope="module")
def cold_step(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """One cold run of STEP; each test copies its caches (and the -inductor sibling) to start warm."""
    root = tmp_path_factory.mktemp("warm") / "cache"
    cold, _ = run(root, STEP)
    return root, cold


def warm_copy(cold_step, tmp_path: pathlib.Path) -> pathlib.Path:
    root, _ = cold_step
    shutil.copytree(root, tmp_path / "cache")
    shutil.copytree(root.parent / "cache-inductor", tmp_path / "cache-inductor")
    return tmp_path / "cache"


def test_cold_process_fills_both_warm_layers(cold_step):
    _, cold = cold_step
    stats = cold["stats"]
    assert stats["aot_autograd_hits"] == 0 and stats["aot_autograd_saved"] == stats["aot_autograd_misses"] == 1
    assert stats["graph_hits"] == 0 and stats["graph_writes"] == stats["graph_misses"] == 2  # forward, backward


def test_warm_process_skips_aot_autograd_and_lowering(cold_step, tmp_path):
    _, cold = cold_step
    warm, stderr = run(warm_copy(cold_step, tmp_path), STEP)
    stats = warm["stats"]
    assert stats["aot_autograd_hits"] == 1 and stats["aot_autograd_misses"] == 0, stderr[-3000:]
    assert stats["graph_hits"] == 2 and stats["graph_misses"] == 0
    assert stats["misses"] == 0 and stats["writes"] == 0
    assert warm["loss"] == cold["loss"] and warm["grad"] == cold["grad"]  # the same executables, bit for bit


def test_a_warm_process_compiling_ahead_loads_the_backward_from_the_index(cold_step, tmp_path):
    """The forward's and backward's programs compiled ahead (compile/ahead.py) are looked up under the keys their
    first calls use."""
    _, cold = cold_step
    warm, stderr = run(warm_copy(cold_step, tmp_path), STEP, TORCH_TPU_COMPILE_AHEAD="1")
    stats = warm["stats"]
    assert stats["graph_hits"] == 2 and stats["graph_misses"] == 0 and stats["misses"] == 0, stderr[-3000:]
    assert warm["loss"] == cold["loss"] and warm["grad"] == cold["grad"]


def test_changed_graph_misses_both_layers(cold_step, tmp_path):
    _, cold = cold_step
    changed, _ = run(warm_copy(cold_step, tmp_path), STEP, FACTOR="3")
    stats = changed["stats"]
    assert stats["aot_autograd_hits"] == 0 and stats["aot_autograd_misses"] == 1
    assert stats["graph_hits"] == 0 and stats["graph_misses"] == 2
    assert changed["loss"] != cold["loss"]


def test_changed_precision_misses_the_graph_index(cold_step, tmp_path):
    # The ATen graphs are the same (AOTAutograd's entry hits); what they lower to may not be.
    changed, _ = run(warm_copy(cold_step, tmp_path), STEP, EXCESS="0")
    stats = changed["stats"]
    assert stats["aot_autograd_hits"] == 1
    assert stats["graph_hits"] == 0 and stats["graph_misses"] == 2 and stats["graph_writes"] == 2


def test_graph_key_covers_inputs_precision_and_constants():
    import jax.numpy as jnp
    import torch

    from torch_tpu.compile import warm

    class Scaled(torch.nn.Module):
        def __init__(self, scale: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("scale", scale)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    one, two = (warm.graph_fingerprint(torch.fx.symbolic_trace(Scaled(torch.tensor(v)))) for v in (1.0, 2.0))
    assert one != two and one == warm.graph_fingerprint(torch.fx.symbolic_trace(Scaled(torch.tensor(1.0))))
    torch.ones(1, device="tpu")  # the platform first: it turns on x64, which changes jnp's default dtype
    key = warm.graph_key(one, [jnp.ones(3)])
    assert key == warm.graph_key(one, [jnp.ones(3)])
    assert key != warm.graph_key(two, [jnp.ones(3)])
    assert key != warm.graph_key(one, [jnp.ones(4)])
    assert key != warm.graph_key(one, [jnp.ones(3, jnp.float32)])
    assert key != warm.graph_key(one, [jnp.ones(3), 5])
    # the RNG key's value is an input, not part of the program; an abstract value (compile/ahead.py) is its array
    import jax
    import numpy as np

    drawn = [warm.graph_key(one, [np.array([seed, 7], np.uint32), jnp.ones(3)]) for seed in (1, 2)]
    abstract = [jax.ShapeDtypeStruct((2,), np.uint32), jax.ShapeDtypeStruct((3,), jnp.ones(3).dtype)]
    assert drawn[0] == drawn[1] == warm.graph_key(one, abstract)
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        assert key != warm.graph_key(one, [jnp.ones(3)])


# A user's lowering of a user's op, its body changed between processes (BODY) under the same name.
USER_LOWERING = """
import json, os, torch
from torch_tpu.ops.registry import lower

@torch.library.custom_op("warm_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * float(os.environ["FACTOR"])

scale.register_fake(lambda x: torch.empty_like(x))
exec(f"def scaled(x):\\n    return x * {os.environ['FACTOR']}")
lower(torch.ops.warm_test.scale.default)(scaled)

x = torch.arange(4.0)
compiled = torch.compile(lambda x: torch.ops.warm_test.scale(x) + 1, backend="tpu")(x.to("tpu"))
stats = torch.tpu._get_cache_stats()["persistent"]
print(json.dumps({"compiled": compiled.cpu().tolist(), "cpu": (scale(x) + 1).tolist(), "stats": stats}))
"""


def test_changed_user_lowering_misses_the_warm_layers(tmp_path):
    root = tmp_path / "cache"
    first, stderr = run(root, USER_LOWERING, FACTOR="2")
    assert first["compiled"] == first["cpu"] == [1.0, 3.0, 5.0, 7.0], stderr[-3000:]
    again, _ = run(root, USER_LOWERING, FACTOR="2")
    assert again["stats"]["graph_hits"] == 1 and again["compiled"] == first["compiled"]  # unchanged: it hits
    changed, _ = run(root, USER_LOWERING, FACTOR="3")
    assert changed["compiled"] == changed["cpu"] == [1.0, 4.0, 7.0, 10.0]
    assert changed["stats"]["graph_hits"] == 0 and changed["stats"]["graph_misses"] == 1


def test_lowering_content_covers_code_closures_and_helpers():
    import jax.numpy as jnp

    from torch_tpu.compile import warm

    def content(fn):
        return warm._content(fn, set())

    def scaled(factor):
        return lambda x: x * factor

    def helper(x):
        return jnp.tanh(x)

    def calls_helper(x):
        return helper(x) + 1

    assert content(scaled(2)) == content(scaled(2)) and content(scaled(2)) != content(scaled(3))
    before = content(calls_helper)
    helper.__code__ = (lambda x: jnp.sin(x)).__code__  # the helper a lowering calls changes: so does its content
    assert content(calls_helper) != before
    opaque = object()
    with pytest.raises(warm.Unidentified):  # what it cannot read, it does not guess: that graph is not indexed
        content(lambda x: x * opaque)


def test_constant_fingerprint_reads_expanded_constants():
    import torch

    from torch_tpu.compile import warm

    # A size-1 expanded constant is "contiguous" with stride 0 (T5's graphs hold one); its bytes are its value.
    expanded = torch.tensor(2.0).expand(1, 1)
    assert warm._constant_token(expanded) == warm._constant_token(torch.tensor([[2.0]]))
    assert warm._constant_token(expanded) != warm._constant_token(torch.tensor([[3.0]]))


# A GPT-style training step: token and position embeddings (`torch.arange`), LayerNorm, causal attention (a mask
# from `torch.ones`), AdamW (Dynamo's `_foreach_lerp_` calls `torch.full_like`), on tpu and on CPU alike.
GPT_STEP = """
import json, torch
import torch.nn.functional as F
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(16, 8), nn.Embedding(6, 8)
        self.ln = nn.LayerNorm(8)
        # No bias on q, k, v: the key's bias has a zero gradient (softmax ignores it), AdamW would scale noise.
        self.qkv, self.head = nn.Linear(8, 24, bias=False), nn.Linear(8, 16)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.ln(self.wte(idx) + self.wpe(torch.arange(t, device=idx.device)))
        q, k, v = self.qkv(x).split(8, dim=-1)
        causal = torch.ones(t, t, dtype=torch.bool, device=idx.device).tril()
        scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~causal, float("-inf"))
        return self.head(x + scores.softmax(-1) @ v)

def train(device, compiled):
    torch.manual_seed(0)
    model = Tiny().to(device)
    # eps 1e-3: AdamW's normalisation would turn float32 rounding of near-zero gradients into lr-sized steps.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)
    idx, targets = (torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(s)) for s in (1, 2))

    def step(idx, targets):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(idx).view(-1, 16), targets.view(-1))
        loss.backward()
        optimizer.step()
        return loss

    step = torch.compile(step, backend="tpu") if compiled else step
    losses = [step(idx.to(device), targets.to(device)).item() for _ in range(2)]
    return {"losses": losses, "params": [p.detach().cpu().tolist() for p in model.parameters()]}

tpu = train("tpu", True)
stats = torch.tpu._get_cache_stats()["persistent"]
print(json.dumps({"tpu": tpu, "cpu": train("cpu", False), "stats": stats}))
"""


def test_gpt_step_hits_aot_autograd_cache_in_a_warm_process(tmp_path):
    """Neither graph (forward+backward, AdamW's step) bypasses AOTAutograd's cache: the factories torch_tpu wraps
    for `pin_memory=True` are marked cacheable (they made PyTorch bypass both, so a warm process redid
    AOTAutograd)."""
    import torch

    root = tmp_path / "cache"
    cold, stderr = run(root, GPT_STEP)
    stats = cold["stats"]
    assert stats["aot_autograd_bypasses"] == 0, stderr[-3000:]
    assert stats["aot_autograd_saved"] == stats["aot_autograd_misses"] == 2
    warm, stderr = run(root, GPT_STEP)
    stats = warm["stats"]
    assert stats["aot_autograd_bypasses"] == 0 and stats["aot_autograd_misses"] == 0, stderr[-3000:]
    assert stats["aot_autograd_hits"] == 2
    assert stats["graph_misses"] == 0 and stats["graph_hits"] == cold["stats"]["graph_writes"] > 0
    assert warm["tpu"] == cold["tpu"]  # the same executables, bit for bit
    # Two AdamW steps of a float32 model of width 8 (reductions of 8-48 terms): a few ulps.
    torch.testing.assert_close(warm["tpu"]["losses"], warm["cpu"]["losses"], rtol=1.3e-6, atol=1e-6)
    for ours, cpu in zip(warm["tpu"]["params"], warm["cpu"]["params"], strict=True):
        torch.testing.assert_close(ours, cpu, rtol=1.3e-6, atol=2e-6)


def _cacheable_in_a_graph(name: str) -> bool:
    import torch
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_node_safe

    node = torch.fx.Graph().call_function(getattr(torch, name), ())
    try:
        check_node_safe(node)
    except BypassAOTAutogradCache:
        return False
    return True


def test_every_wrapped_factory_is_cacheable_in_a_graph():
    from torch_tpu.runtime import pinned

    assert [name for name in pinned.FACTORIES if not _cacheable_in_a_graph(name)] == []


INDUCTOR_CONFIG_FIRST = """
import json, torch, torch._inductor.config
import torch_tpu
from torch_tpu.runtime import pinned
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_node_safe
bypassed = []
for name in pinned.FACTORIES:
    try:
        check_node_safe(torch.fx.Graph().call_function(getattr(torch, name), ()))
    except BypassAOTAutogradCache:
        bypassed.append(name)
print(json.dumps({"bypassed": bypassed, "wrapped": hasattr(torch.arange, "__wrapped_original__")}))
"""


def test_wrapped_factories_are_cacheable_when_inductor_config_loads_first(tmp_path):
    result, _ = run(tmp_path / "cache", INDUCTOR_CONFIG_FIRST, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert result == {"bypassed": [], "wrapped": True}


def test_the_copy_of_a_donated_input_comes_from_the_persistent_tier(tmp_path, monkeypatch):
    """The copy of a donated input held elsewhere (compiled steps, Fused clusters, donating kernels) is a
    persistent-tier program (a warm process loads it), a new array equal to its source; an array over several
    devices keeps its sharding (plain jax.jit)."""
    import jax.numpy as jnp
    import numpy as np

    from torch_tpu.runtime import storage

    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    source = jnp.arange(21.0).reshape(7, 3)
    copied = storage.copy_array(source)
    assert copied is not source and len(entries(tmp_path)) == 1
    np.testing.assert_array_equal(np.asarray(copied), np.asarray(source))
    source.delete()
    assert np.asarray(copied)[6, 2] == 20.0  # its own buffer
    done = subprocess.run(
        [sys.executable, "-c", SPREAD_COPY],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2"),
    )
    assert done.returncode == 0 and done.stdout.split()[-1] == "2", done.stderr[-3000:]
    assert len(entries(tmp_path)) == 1  # the child's copy over two devices was not stored


SPREAD_COPY = """
import jax, jax.numpy as jnp, numpy as np
from torch_tpu.runtime import storage
mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
spread = jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
copied = storage.copy_array(spread)
assert np.asarray(copied).tolist() == list(range(8))
print(len(copied.sharding.device_set))
"""
