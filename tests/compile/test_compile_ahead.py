"""A compiled training graph's programs compiled ahead of their first calls (compile/ahead.py): taken by the calls they
were compiled for, reshaping inputs that arrive in another shape until the exact program is ready, left unused by a
call unlike the one foreseen; the gradients are CPU's either way."""

import copy

import pytest
import torch
import torch.nn.functional as F

from torch_tpu.compile import ahead
from torch_tpu.testing import compare

pytestmark = pytest.mark.tpu_device

# float32's on this platform: on a TPU the chip's (its exp and log in a loss's softmax, a forward at "high")
RTOL, ATOL = compare.float32_tolerance(1e-5, 1e-6)


@pytest.fixture
def on(monkeypatch):
    """Compile ahead here (the default, "auto", is on a TPU only); each test counts its own programs, from graphs
    of static shapes (Dynamo's own: a shape it saw before would make a dimension dynamic)."""
    torch._dynamo.reset()
    monkeypatch.setattr(ahead, "COMPILE_AHEAD", "1")
    monkeypatch.setattr(ahead, "counts", ahead.collections.Counter())


def _models(out: int = 5) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, out))
    return model, torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")


def _assert_grads(ours: torch.nn.Module, model: torch.nn.Module) -> None:
    for got, expected in zip(ours.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=RTOL, atol=ATOL)


def test_forward_and_backward_compile_when_the_graphs_arrive_and_their_first_calls_take_them(on):
    model, ours = _models()
    x = torch.randn(4, 6)
    out = ours(x.to("tpu"))
    assert ahead.counts == {"started": 2, "taken": 1}  # the backward's program compiling before the backward runs
    out.square().sum().backward()
    assert ahead.counts == {"started": 2, "taken": 2}
    model(x).square().sum().backward()
    _assert_grads(ours, model)


def test_a_gradient_that_arrives_reshaped_is_reshaped_until_the_exact_program_is_ready(on, monkeypatch):
    """`logits.view(-1, classes)` in the loss gives the backward its incoming gradient as the storage's (32, 5)
    array of a (4, 8, 5) tensor: the ahead program runs on it reshaped, then the exact one, compiled meanwhile
    (`torch.tpu.finish_compiles()` waits for it); the gradients are CPU's before and after."""
    reshaping = []
    init = ahead.Reshaping.__init__
    monkeypatch.setattr(ahead.Reshaping, "__init__", lambda self, *a: reshaping.append(self) or init(self, *a))
    model, ours = _models()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ours)]
    torch.manual_seed(1)
    for step in range(3):
        x, target = torch.randn(4, 8, 6), torch.randint(0, 5, (32,))
        for m, optimizer, device in ((model, optimizers[0], "cpu"), (ours, optimizers[1], "tpu")):
            optimizer.zero_grad()
            F.cross_entropy(m(x.to(device)).view(-1, 5), target.to(device)).backward()
        _assert_grads(ours, model)
        for optimizer in optimizers:
            optimizer.step()
        if step == 0:
            assert ahead.counts == {"started": 2, "taken": 2} and len(reshaping) == 1
            assert reshaping[0]._shapes  # reshaping the gradient
            torch.tpu.finish_compiles()  # waits for the exact program and switches to it
            assert reshaping[0]._final is None and reshaping[0]._shapes == {}


def test_a_forward_whose_input_arrives_viewed_compiles_its_own(on):
    """The batch a caller viewed (`view(4, 6)` of 24 elements) arrives as its storage's array in another shape, as it
    will every call: the forward's first call compiles the program that takes it so rather than wait for the one
    compiling ahead (a warm process loads it from the index); the backward takes its own; the gradients are CPU's."""
    model, ours = _models()
    x = torch.randn(24)
    out = ours(x.to("tpu").view(4, 6))
    assert ahead.counts == {"started": 2, "unused": 1}
    out.square().sum().backward()
    assert ahead.counts == {"started": 2, "unused": 1, "taken": 1}
    model(x.view(4, 6)).square().sum().backward()
    _assert_grads(ours, model)


def test_a_first_call_unlike_the_one_foreseen_compiles_its_own(on):
    """The forward (and the graphs) under one float32 matmul precision, the backward under another: the forward
    takes its program, but the backward's trace context differs, so its ahead program is not taken."""
    model, ours = _models()
    x = torch.randn(4, 6)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        out = ours(x.to("tpu"))
    finally:
        torch.set_float32_matmul_precision(previous)
    out.square().sum().backward()
    assert ahead.counts == {"started": 2, "taken": 1, "unused": 1}
    model(x).square().sum().backward()
    _assert_grads(ours, model)


def test_the_setting_is_on_a_tpu_by_default(monkeypatch):
    from torch_tpu.runtime import platform

    monkeypatch.setattr(ahead, "COMPILE_AHEAD", "auto")
    assert ahead.enabled() == (platform.platform() == "tpu")
    monkeypatch.setattr(ahead, "COMPILE_AHEAD", "0")
    assert not ahead.enabled()
    monkeypatch.setattr(ahead, "COMPILE_AHEAD", "1")
    assert ahead.enabled()


def test_a_failed_ahead_compile_leaves_the_first_call_to_compile(on, monkeypatch):
    """The programs compiled ahead failed (here: their compiles raised on the thread): the forward's and the
    backward's first calls compile their own, as without compiling ahead, and the gradients are CPU's."""
    from concurrent.futures import Future

    from torch_tpu.runtime import persistent

    def failed(*args, **kwargs):
        future = Future()
        future.set_exception(RuntimeError("XLA failed"))
        return persistent.Soon(future, None)

    monkeypatch.setattr(ahead.warm, "executable_soon", failed)
    model, ours = _models()
    x = torch.randn(4, 6)
    ours(x.to("tpu")).square().sum().backward()
    assert ahead.counts == {"started": 2, "unused": 2}
    model(x).square().sum().backward()
    _assert_grads(ours, model)
