"""A whole training step under torch.compile (zero_grad, forward, backward, optimizer.step) with a stock torch.optim
optimizer: its step counters live on the device (PyTorch's capturable path, which Dynamo takes for CUDA), so the
compiled step moves nothing between host and device, and it computes what the same eager step computes on CPU."""

import copy

import pytest
import torch

import torch_tpu
from tests.helpers import cross_entropy_step
from torch_tpu.runtime import arguments, storage
from torch_tpu.testing.compare import assert_close

pytestmark = [pytest.mark.tpu_device, pytest.mark.usefixtures("fresh_dynamo")]

OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "adam_foreach": lambda params: torch.optim.Adam(params, lr=1e-2, foreach=True),
    "adam_for_loop": lambda params: torch.optim.Adam(params, lr=1e-2, foreach=False),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.9),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(device, make_optimizer, batches, compiled, on_step=None):
    model = _model().to(device)
    optimizer = make_optimizer(model.parameters())

    step = cross_entropy_step(model, optimizer)
    if compiled:
        step = torch.compile(step, backend="tpu")
    losses = []
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        if on_step is not None:
            on_step(i)
        losses.append(step(x, y).detach())
    return model, optimizer, torch.stack(losses).cpu()


def _counting_transfers(monkeypatch):
    """Counts of storage.to_device/to_host calls, which a compiled graph makes for each CPU tensor it reads or
    writes (a host round trip per tensor, per step)."""
    counts = {"to_device": 0, "to_host": 0}
    for name in counts:
        original = getattr(storage, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(storage, name, counted)
    return counts


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_compiled_whole_step_keeps_the_step_counters_on_the_device_and_matches_cpu(name, monkeypatch):
    torch.manual_seed(1)
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(4)]
    cpu_model, _, cpu_losses = _train("cpu", OPTIMIZERS[name], batches, compiled=False)
    counts = _counting_transfers(monkeypatch)
    at_step_three = {}
    tpu_model, optimizer, tpu_losses = _train(
        "tpu", OPTIMIZERS[name], batches, compiled=True, on_step=lambda i: i == 3 and at_step_three.update(counts)
    )
    after = dict(counts)
    # Tanh's and the optimizers' square roots: the TPU's float32 transcendentals (testing.compare's tolerance)
    assert_close(tpu_losses, cpu_losses)
    for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
        assert_close(ours.detach(), theirs.detach())
    assert all(group["capturable"] for group in optimizer.param_groups)
    steps = [state["step"] for state in optimizer.state.values()]
    assert steps and all(step.device.type == "tpu" and step.item() == len(batches) for step in steps)
    # the last step, compiled already, moved no tensor of its own either way (its batch moves by .to(device))
    assert after["to_device"] - at_step_three["to_device"] == 0
    assert after["to_host"] - at_step_three["to_host"] == 1  # the losses' stack, read once
    # the next step reads every parameter and state tensor as the very array its storage holds (its buffer)
    state = [*tpu_model.parameters(), *(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))]
    _, buffers, _ = arguments.read(state, range(len(state)))
    assert all(buffer is storage.buffer_of(t) for buffer, t in zip(buffers, state, strict=True))


def test_compiled_autograd_whole_step_matches_cpu():
    """With compiled autograd on, Dynamo hands the backward to the backend as a graph of its own, which allocates
    the gradients it accumulates (`new_empty_strided`)."""
    torch.manual_seed(1)
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(3)]
    cpu_model, _, cpu_losses = _train("cpu", OPTIMIZERS["adamw"], batches, compiled=False)
    with torch._dynamo.config.patch(compiled_autograd=True):
        tpu_model, _, tpu_losses = _train("tpu", OPTIMIZERS["adamw"], batches, compiled=True)
    assert_close(tpu_losses, cpu_losses)
    for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
        assert_close(ours.detach(), theirs.detach())
        assert_close(ours.grad, theirs.grad)


def test_an_optimizer_with_state_moves_its_step_counters_to_the_device_and_steps_eagerly_after():
    """Dynamo sets capturable only on a group whose state is not made yet; after an eager step it moves the CPU
    step counters to the parameters' device instead (as for CUDA) and leaves the group's flag. Eager steps after
    the compiled ones then read those counters on the device, and everything still equals CPU."""
    torch.manual_seed(1)
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(4)]
    cpu_model, _, cpu_losses = _train("cpu", OPTIMIZERS["adamw"], batches, compiled=False)
    model = _model().to("tpu")
    optimizer = OPTIMIZERS["adamw"](model.parameters())
    step = cross_entropy_step(model, optimizer)
    compiled = torch.compile(step, backend="tpu")
    runs = [step, compiled, compiled, step]
    losses = [run(*(t.to("tpu") for t in batch)).detach() for run, batch in zip(runs, batches, strict=True)]
    assert_close(torch.stack(losses).cpu(), cpu_losses)
    for ours, theirs in zip(model.parameters(), cpu_model.parameters(), strict=True):
        assert_close(ours.detach(), theirs.detach())
    assert not any(group["capturable"] for group in optimizer.param_groups)
    assert all(state["step"].device.type == "tpu" for state in optimizer.state.values())


def test_a_cpu_optimizer_is_left_as_pytorch_leaves_it():
    model = copy.deepcopy(_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    @torch.compile(backend="eager")
    def step(x):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    step(torch.randn(4, 6))
    assert not any(group["capturable"] for group in optimizer.param_groups)


def test_a_compiled_step_updates_parameters_and_state_in_their_own_memory():
    """The graph's write-backs are donated: each parameter's and moment's new value lies in the device memory that
    held the old one (XLA aliases the donated input to its output), so a step needs no second copy of the model."""
    model = _model().to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    step = torch.compile(cross_entropy_step(model, optimizer), backend="tpu")
    x, y = torch.randn(8, 6, device="tpu"), torch.randint(0, 3, (8,), device="tpu")
    step(x, y)
    state = [optimizer.state[p][name] for p in model.parameters() for name in ("exp_avg", "exp_avg_sq", "step")]
    updated = [*model.parameters(), *state]
    expected = [t.detach().cpu() for t in updated]
    # addresses, not the arrays: a reference held here would make the graph take a copy
    before = [torch_tpu.to_jax(t).unsafe_buffer_pointer() for t in updated]
    step(x, y)
    assert [torch_tpu.to_jax(t).unsafe_buffer_pointer() for t in updated] == before
    assert not any(torch.equal(t.detach().cpu(), e) for t, e in zip(updated, expected, strict=True))


def test_an_array_held_elsewhere_is_copied_not_consumed():
    """A tensor whose array the user also holds (torch_tpu.to_jax) keeps that array: the graph gets a copy."""
    weights = torch.zeros(4, device="tpu")
    held = torch_tpu.to_jax(weights)

    @torch.compile(backend="tpu")
    def bump(t):
        t.add_(1)

    bump(weights)
    bump(weights)
    assert not held.is_deleted() and held.tolist() == [0.0] * 4
    assert weights.tolist() == [2.0] * 4
