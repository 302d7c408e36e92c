"""A cold cluster of independent computations runs as several programs while its whole one compiles
(`eager.parts`, `programs.compile_soon`): an optimizer step split so, in Strict and Fused eager, equals CPU's and
consumes its old state as the one program does, then switches to the whole program; the split keeps together what
must stay together, leaves alone what it cannot split and is the same in every process; a second process loads
the whole program from the persistent tier, split or not in the first."""

import copy
import json
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu
from tests.helpers import HeldBack, assert_steps_agree, mse_backward, tanh_mlp
from torch_tpu.eager import parts, programs
from torch_tpu.eager.cache import executables
from torch_tpu.runtime import persistent
from torch_tpu.testing.compare import EAGER_MODES

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

OPTIMIZERS = {
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_for_loop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
}


@pytest.fixture
def split_every_cluster(monkeypatch):
    """Every cluster that can split does, into at most 3 parts (a small model's step is below the size bound), the
    persistent tier off (nothing from disk); a split cluster's whole program, compiling beside its parts, is not
    switched to until the test sets the event returned, so that the steps before run the parts."""
    monkeypatch.setattr(parts, "PART_EQUATIONS", 1)
    monkeypatch.setattr(parts, "MAX_PARTS", 3)
    monkeypatch.setattr(persistent, "enabled", lambda: False)
    release, compile_soon = threading.Event(), programs.compile_soon

    def held_back(*args):
        first, better = compile_soon(*args)
        return first, HeldBack(better, release) if isinstance(first, parts.Compiling) else better

    monkeypatch.setattr(programs, "compile_soon", held_back)
    executables.clear()  # no program of this test's clusters compiled before
    return release


def _split_steps() -> list[int]:
    """The part counts of the split clusters cached now."""
    return [len(e.executable) for e in executables.entries.values() if isinstance(e.executable, parts.Parts)]


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_split_step_equals_cpu_and_consumes_its_old_state(name, mode, split_every_cluster):
    cpu_model = tanh_mlp()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt, tpu_opt = OPTIMIZERS[name](cpu_model.parameters()), OPTIMIZERS[name](tpu_model.parameters())
    with torch.tpu.set_eager_mode(EAGER_MODES[mode]):
        for step in range(4):
            mse_backward(cpu_model, "cpu", step)
            mse_backward(tpu_model, "tpu", step)
            torch.tpu.synchronize()  # the step's inputs computed: it may consume them all
            cpu_opt.step()
            tpu_opt.step()
            if step == 2:
                torch.tpu.synchronize()
                assert 3 in _split_steps()  # 4 parameters, each updated on its own: 3 parts
                split_every_cluster.set()
                torch.tpu.finish_compiles()  # the next step runs the whole program
        torch.tpu.synchronize()
    assert not _split_steps()
    updated = len(list(tpu_model.parameters())) + sum(
        v.device.type == "tpu" for state in tpu_opt.state.values() for v in state.values()
    )
    donated = [e["donated"] for e in torch.tpu._get_cache_stats()["per_entry_stats"] if e["source"] == "fused"]
    assert updated in donated, donated  # every parameter and state tensor consumed, across the parts
    assert_steps_agree(tpu_model, cpu_model, tpu_opt, cpu_opt)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_with_two_tiers_the_parts_compile_at_the_quickest_effort_and_the_whole_at_xlas_own(
    mode, split_every_cluster, monkeypatch
):
    """Where clusters compile in two tiers (a TPU's default) a split cluster's parts stand in for its whole program,
    compiled at the quickest effort (not its ops one by one: the large GPT step's foreach ops took 6-8 s each to
    compile on a v5e), while the whole compiles at XLA's own."""
    efforts, compile_now = [], persistent._timed_compile

    def noted(lowered, options):
        efforts.append(options.get("exec_time_optimization_effort"))
        return compile_now(lowered, options)

    monkeypatch.setattr(persistent, "TIERED_COMPILE", "1")
    monkeypatch.setattr(persistent, "EAGER_OPTIONS", {"exec_time_optimization_effort": -1.0})
    monkeypatch.setattr(persistent, "_timed_compile", noted)
    cpu_model = tanh_mlp()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt, tpu_opt = (OPTIMIZERS["adamw_foreach"](m.parameters()) for m in (cpu_model, tpu_model))
    stepping = []  # the efforts of the optimizer steps' compiles
    with torch.tpu.set_eager_mode(EAGER_MODES[mode]):
        for step in range(3):
            mse_backward(cpu_model, "cpu", step)
            mse_backward(tpu_model, "tpu", step)
            torch.tpu.synchronize()
            efforts.clear()
            cpu_opt.step()
            tpu_opt.step()
            torch.tpu.synchronize()
            stepping += efforts
            if step == 1:
                assert 3 in _split_steps()
                assert stepping.count(-1.0) == 3 and stepping.count(None) == 1, stepping  # 3 parts, the whole
                split_every_cluster.set()
                torch.tpu.finish_compiles()
    assert not _split_steps()
    assert_steps_agree(tpu_model, cpu_model, tpu_opt, cpu_opt)


def test_a_value_the_user_holds_survives_a_split_step(split_every_cluster):  # the parts run every step
    model = tanh_mlp().to("tpu")
    optimizer = OPTIMIZERS["adamw_foreach"](model.parameters())
    for step in range(3):
        mse_backward(model, "tpu", step)
        torch.tpu.synchronize()
        held = torch_tpu.to_jax(model[0].bias)
        expected = np.asarray(held)
        optimizer.step()
        torch.tpu.synchronize()
        assert not held.is_deleted()
        np.testing.assert_array_equal(np.asarray(held), expected)
    assert _split_steps()


def _chains(count: int, shared_result: bool = False):
    """`count` update chains over (parameter, gradient) pairs and one shared scalar, like an optimizer's step; with
    `shared_result`, every chain also adds a sum over all the gradients (one computation joining them)."""

    def step(lr, *pairs):
        params, grads = pairs[:count], pairs[count:]
        total = sum(jnp.sum(g) for g in grads) if shared_result else 0.0
        return tuple(jnp.tanh(p - lr * g * 2.0 + 1.0) * 0.5 + total for p, g in zip(params, grads, strict=True))

    avals = [jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)]
    avals += [jax.ShapeDtypeStruct((4, i + 1), jnp.float32) for i in range(count)] * 2
    return step, avals


def _split(fn, avals, donated=(), max_parts=3):
    return parts.split(jax.jit(fn, donate_argnums=donated).trace(*avals), donated, avals, max_parts, "chains")


def test_independent_chains_split_into_balanced_parts_that_compute_the_same(monkeypatch):
    monkeypatch.setattr(parts, "PART_EQUATIONS", 1)
    step, avals = _chains(5)
    pieces = _split(step, avals, donated=tuple(range(1, 6)))
    assert pieces is not None and len(pieces) == 3
    assert sorted(o for piece in pieces for o in piece.outputs) == list(range(5))
    assert all(0 in piece.leaves for piece in pieces)  # the shared scalar: read by every part, consumed by none
    assert sorted(len(piece.outputs) for piece in pieces) == [1, 2, 2]
    args = [np.float32(0.1)] + [
        np.random.default_rng(i).standard_normal(a.shape, np.float32) for i, a in enumerate(avals[1:])
    ]
    whole = jax.jit(step)(*args)
    split = parts.Compiling(pieces, parts_pool())()[0]
    assert len(split) == 3
    inputs = [jnp.asarray(a) for a in args]
    for ours, theirs in zip(split(*inputs), whole, strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert [x.is_deleted() for x in inputs] == [False] + [True] * 5 + [False] * 5  # the parameters consumed
    again = _split(step, avals, donated=tuple(range(1, 6)))  # every process splits alike: the same programs
    assert [p.lowered.as_text() for p in again] == [p.lowered.as_text() for p in pieces]


def parts_pool():
    from torch_tpu.eager import fused

    return fused.compiler()


def test_chains_joined_by_a_shared_result_or_a_consumed_input_stay_together(monkeypatch):
    monkeypatch.setattr(parts, "PART_EQUATIONS", 1)
    step, avals = _chains(4, shared_result=True)
    assert _split(step, avals) is None  # one group: the sum joins every chain

    def reads_twice(lr, a, b, c, d, e, f):  # `a` is consumed, and both its chain and c's read it
        others = (jnp.exp(x) * 2.0 + lr for x in (b, d, e, f))
        return a * lr + 1.0, jnp.sin(c + a) - 1.0, *others

    square = jax.ShapeDtypeStruct((3, 3), jnp.float32)
    avals = [jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)] + [square] * 6
    pieces = _split(reads_twice, avals, donated=(1,))
    assert pieces is not None
    holding = [piece for piece in pieces if 1 in piece.leaves]
    assert len(holding) == 1 and {0, 1} <= set(holding[0].outputs)


def test_what_cannot_split_stays_one_program(monkeypatch):
    step, avals = _chains(5)
    assert _split(step, avals) is None  # below PART_EQUATIONS
    monkeypatch.setattr(parts, "PART_EQUATIONS", 1)
    assert _split(step, avals, max_parts=1) is None

    def passes_an_input_through(lr, a, b):
        return a * lr, jnp.exp(b), b

    avals = [avals[0], jax.ShapeDtypeStruct((2,), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.float32)]
    assert _split(passes_an_input_through, avals) is None


WARM = """
import json, torch
from torch_tpu.eager import parts
from torch_tpu.eager.cache import executables
parts.PART_EQUATIONS = 1
from tests.helpers import tanh_mlp
model = tanh_mlp().to("tpu")  # (seeded: the batch below follows the same draws)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(5, 8).to("tpu")
model(x).square().mean().backward()
optimizer.step()  # one step: the process ends before it could switch to the whole program
torch.tpu.synchronize()
split = [len(e.executable) for e in executables.entries.values() if isinstance(e.executable, parts.Parts)]
stats = torch.tpu._get_cache_stats()["persistent"]
print(json.dumps({"split": split, "stats": stats, "weight": model[0].weight.cpu().tolist()}))
"""


@pytest.mark.children
def test_a_second_process_loads_the_whole_program_of_a_split_step(tmp_path):
    env = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path), TORCH_TPU_CLUSTER_PARTS="3")
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", WARM], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["split"] == [3] and warm["split"] == []  # the whole program, stored when it compiled, from disk
    assert cold["stats"]["misses"] > 0 and warm["stats"]["misses"] == 0
    # not the parts: stored where they were compiled at the whole's effort, not where they stood in for it at the
    # quickest (two tiers, a TPU's default)
    assert warm["stats"]["hits"] == cold["stats"]["misses"] - (0 if persistent.tiering() else 3)
    assert warm["weight"] == cold["weight"]
    # nor in the next run's list (`runtime.recent`): the whole program and the step's others
    (listed,) = [persistent.read_entry(path) for path in (tmp_path / "recent").glob("*.list")]
    assert warm["stats"]["loaded_ahead"] == warm["stats"]["hits"] == len(listed)
