"""A compiled graph of independent computations — a whole-step compile's optimizer graph — runs its parts,
compiled at the quickest effort, while its whole program compiles at XLA's own where clusters compile in two tiers
(compile/tiers.py), then the whole; the parameters, state and losses are CPU's either way."""

import collections
import copy
import threading

import pytest
import torch

from tests.helpers import HeldBack, assert_steps_agree, cross_entropy_step, tanh_mlp
from torch_tpu.compile import tiers, warm
from torch_tpu.eager import parts
from torch_tpu.runtime import persistent
from torch_tpu.testing.compare import float32_tolerance

pytestmark = [pytest.mark.tpu_device, pytest.mark.usefixtures("fresh_dynamo")]


@pytest.fixture
def two_tiers(monkeypatch):
    """Two tiers on this platform, a small step's optimizer graph split into 3 parts, nothing from disk; each whole
    program compiling beside its parts is held back until the event returned is set, and the efforts of the
    compiles are noted in the list returned with it."""
    monkeypatch.setattr(persistent, "TIERED_COMPILE", "1")
    monkeypatch.setattr(persistent, "EAGER_OPTIONS", {"exec_time_optimization_effort": -1.0})
    monkeypatch.setattr(parts, "PART_EQUATIONS", 1)
    monkeypatch.setattr(parts, "MAX_PARTS", 3)
    monkeypatch.setattr(persistent, "enabled", lambda: False)
    monkeypatch.setattr(tiers, "counts", collections.Counter())
    release, efforts = threading.Event(), []
    compile_soon, compile_now = warm.compile_indexed_soon, persistent._timed_compile
    monkeypatch.setattr(warm, "compile_indexed_soon", lambda *args: HeldBack(compile_soon(*args), release))

    def noted(lowered, options):
        efforts.append(options.get("exec_time_optimization_effort"))
        return compile_now(lowered, options)

    monkeypatch.setattr(persistent, "_timed_compile", noted)
    return release, efforts


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return torch.randn(5, 8, generator=generator), torch.randint(0, 3, (5,), generator=generator)


def test_a_whole_steps_optimizer_graph_runs_its_parts_then_its_whole_program(two_tiers):
    release, efforts = two_tiers
    cpu_model = tanh_mlp()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt, tpu_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (cpu_model, tpu_model))
    cpu_step = cross_entropy_step(cpu_model, cpu_opt)
    tpu_step = torch.compile(cross_entropy_step(tpu_model, tpu_opt), backend="tpu")
    rtol, atol = float32_tolerance(1e-5, 1e-6)
    before = set(tiers._switching)
    for step in range(4):
        x, y = _batch(step)
        expected, got = cpu_step(x, y), tpu_step(x.to("tpu"), y.to("tpu"))
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=rtol, atol=atol)
        switching = [s for s in tiers._switching if s not in before]
        if step == 1:  # the optimizer graph split: its 3 parts at the quickest effort, its whole at XLA's own
            assert tiers.counts == {"split": 1} and len(switching) == 1
            assert efforts.count(-1.0) == 3 and efforts.count(None) >= 1, efforts
            assert isinstance(switching[0]._serving, parts.Parts) and len(switching[0]._serving) == 3
            release.set()
            torch.tpu.finish_compiles()  # the next steps run the whole program
            assert not isinstance(switching[0]._serving, parts.Parts) and switching[0]._final is None
    assert_steps_agree(tpu_model, cpu_model, tpu_opt, cpu_opt)


def test_a_graph_that_does_not_split_compiles_whole(two_tiers):
    """A forward graph is one group: no parts, the program compiled whole at once, the losses CPU's (at float32's
    tolerance on this platform: a TPU's tanh, docs/numerics.md)."""
    release, _ = two_tiers
    rtol, atol = float32_tolerance(1e-5, 1e-6)
    release.set()
    before = set(tiers._switching)  # an earlier test's graphs may live on in the executable cache
    model = tanh_mlp()
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    with torch.no_grad():
        for step in range(2):
            x, _ = _batch(step)
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), model(x), rtol=rtol, atol=atol)
    assert tiers.counts == {} and set(tiers._switching) == before


def test_with_one_tier_nothing_splits(monkeypatch):
    monkeypatch.setattr(persistent, "TIERED_COMPILE", "0")
    monkeypatch.setattr(parts, "PART_EQUATIONS", 1)
    monkeypatch.setattr(tiers, "counts", collections.Counter())
    model = tanh_mlp().to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = torch.compile(cross_entropy_step(model, optimizer), backend="tpu")
    x, y = _batch(0)
    step(x.to("tpu"), y.to("tpu"))
    assert tiers.counts == {}
