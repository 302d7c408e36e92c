"""An eager optimizer step is one program in Strict eager (`eager.steps`): one cached executable per step, the
parameters and state equal to CPU's after several steps, the user's mode untouched, and the op-by-op path kept
where it must be (Debug eager, a closure, a step that raised)."""

import collections
import copy

import pytest
import torch

import torch_tpu
from tests.helpers import assert_steps_agree, mse_backward, tanh_mlp
from torch_tpu.eager import steps
from torch_tpu.eager.cache import executables
from torch_tpu.testing.compare import EAGER_MODES, float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

OPTIMIZERS = {
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_for_loop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, foreach=True),
}


def _reads() -> dict[str, int]:
    torch.tpu.synchronize()
    return {e["name"] + str(i): e["read_count"] for i, e in enumerate(torch.tpu._get_cache_stats()["per_entry_stats"])}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_strict_step_is_one_cached_program_and_equals_cpu(name):
    cpu_model = tanh_mlp()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt, tpu_opt = OPTIMIZERS[name](cpu_model.parameters()), OPTIMIZERS[name](tpu_model.parameters())
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER
    for step in range(4):
        mse_backward(cpu_model, "cpu", step)
        mse_backward(tpu_model, "tpu", step)
        cpu_opt.step()
        before = _reads()
        tpu_opt.step()
        after = _reads()
        assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER and not steps.scope.optimizer
        if step >= 2:  # the first steps compile (Adam's state appears at the first): later ones replay
            read = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            assert len(read) == 1 and next(iter(read)).startswith("fused cluster") and set(read.values()) == {1}
    assert_steps_agree(tpu_model, cpu_model, tpu_opt, cpu_opt)


def test_debug_mode_a_closure_and_the_switch_keep_the_step_op_by_op(monkeypatch):
    model = tanh_mlp().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorded = []
    original = steps.fused.flush
    monkeypatch.setattr(
        steps.fused, "flush", lambda *a, **k: recorded.append(steps.fused.recorder.plan[:]) or original(*a, **k)
    )
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        mse_backward(model, "tpu", 0)
        optimizer.step()
    mse_backward(model, "tpu", 1)
    optimizer.step(lambda: None)
    monkeypatch.setattr(steps, "FUSE_OPTIMIZER_STEP", False)
    mse_backward(model, "tpu", 2)
    optimizer.step()
    assert not any(recorded)  # nothing was recorded: every op ran at once
    monkeypatch.setattr(steps, "FUSE_OPTIMIZER_STEP", True)
    optimizer.step()
    assert any(recorded)


def test_a_step_that_raises_leaves_strict_eager_at_the_next_step():
    model = tanh_mlp().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mse_backward(model, "tpu", 0)
    hook = optimizer.register_step_pre_hook(lambda *args: (_ for _ in ()).throw(ValueError("in the step")))
    with pytest.raises(ValueError, match="in the step"):
        optimizer.step()
    hook.remove()
    expected = [p.detach().cpu() - 0.1 * p.grad.cpu() for p in model.parameters()]
    optimizer.step()  # the raised step's scope ends here, before this one records
    assert not steps.scope.optimizer and not steps.modes.state.fused
    for got, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach().cpu(), want)


def _updated(optimizer: torch.optim.Optimizer) -> int:
    """How many device tensors a step updates: the parameters and their optimizer state (not the CPU counters)."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    return len(tensors) + sum(v.device.type == "tpu" for state in optimizer.state.values() for v in state.values())


# Steps that write only the parameters and their state (Nesterov SGD also adds into the gradients, which `.grad`
# holds: they are not consumed).
IN_PLACE = {**OPTIMIZERS, "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("name", IN_PLACE)
def test_a_step_consumes_the_old_parameters_and_state(name, mode):
    """The step's program consumes (donates) the old values, so XLA can write the new ones into their memory: no
    second copy of the model and its state. One old value the user holds is copied instead, and survives."""
    cpu_model = tanh_mlp()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt, tpu_opt = IN_PLACE[name](cpu_model.parameters()), IN_PLACE[name](tpu_model.parameters())
    executables.clear()  # this test's programs only
    with torch.tpu.set_eager_mode(EAGER_MODES[mode]):
        for step in range(3):
            mse_backward(cpu_model, "cpu", step)
            mse_backward(tpu_model, "tpu", step)
            cpu_opt.step()
            torch.tpu.synchronize()
            held = torch_tpu.to_jax(tpu_model[0].bias)  # the user holds this array: it must survive the step
            expected = held.copy()
            tpu_opt.step()
            torch.tpu.synchronize()
            assert not held.is_deleted() and bool((held == expected).all())
    donated = [e["donated"] for e in torch.tpu._get_cache_stats()["per_entry_stats"] if e["source"] == "fused"]
    assert _updated(tpu_opt) - 1 in donated, donated  # the steps after the first: all but the one the user holds
    rtol, atol = float32_tolerance(1e-5, 1e-6)
    for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["adamw_foreach", "adam_for_loop", "rmsprop"])
def test_the_first_step_runs_the_steady_steps_program(name):
    """The state an optimizer's first step creates (`zeros_like` of each parameter) is made without ops
    (`runtime/fills.py`), so it enters the step's program as inputs, as later steps' state does: one program
    compiled for every step, not a first one with the state's zeros inside it."""
    model = tanh_mlp().to("tpu")
    optimizer = OPTIMIZERS[name](model.parameters())
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER
    before = {id(entry): entry.read_count for entry in executables.entries.values()}
    for step in range(3):
        mse_backward(model, "tpu", step)
        optimizer.step()
    torch.tpu.synchronize()
    runs = [
        (entry.name, entry.read_count - before.get(id(entry), 0))
        for entry in executables.entries.values()
        if entry.source == "fused" and entry.read_count != before.get(id(entry), 0)
    ]
    assert len(runs) == 1 and runs[0][1] == 3, runs


def _bfloat16_model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(layers)]).to(torch.bfloat16)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_bfloat16_foreach_step_records_no_op_per_tensor(mode, monkeypatch):
    """An in-place foreach op casts its values to the list's dtypes inside its program: a bfloat16 step records
    as many ops for 2 parameters as for 8 (each write of a float32 value used to record a cast of its own), and
    its parameters and state follow CPU's bit for bit where XLA must round to bfloat16 after each op as CPU's
    opmath does (`allow_excess_precision` off: on a TPU the step's one program otherwise keeps them in float32).
    Both take CPU's gradients, so that the step alone is compared."""
    monkeypatch.setattr(torch.tpu, "allow_excess_precision", False)
    sizes = []
    for layers in (1, 4):
        cpu_model = _bfloat16_model(layers)
        tpu_model = copy.deepcopy(cpu_model).to("tpu")
        cpu_opt, tpu_opt = (OPTIMIZERS["adamw_foreach"](m.parameters()) for m in (cpu_model, tpu_model))
        with torch.tpu.set_eager_mode(EAGER_MODES[mode]):
            for step in range(3):
                x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step), dtype=torch.bfloat16)
                cpu_model.zero_grad()
                cpu_model(x).float().square().mean().backward()
                for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
                    ours.grad = theirs.grad.to("tpu")
                cpu_opt.step()
                torch.tpu.synchronize()
                clusters = dict(torch_tpu.metrics.fused_clusters)
                tpu_opt.step()
                torch.tpu.synchronize()
            ran = torch_tpu.metrics.fused_clusters - collections.Counter(clusters)
            assert sum(ran.values()) == 1, ran  # the step is one cluster
            sizes.append(next(iter(ran)))
        for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
            torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), rtol=0, atol=0)
        for ours, theirs in zip(tpu_opt.state.values(), cpu_opt.state.values(), strict=True):
            torch.testing.assert_close(ours["exp_avg_sq"].cpu(), theirs["exp_avg_sq"], rtol=0, atol=0)
    assert sizes[0] == sizes[1], sizes
