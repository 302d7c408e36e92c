"""Shared by the model tests: one training step of a model on CPU and on `tpu`, compared piece by piece."""

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch.utils._pytree import tree_map

from torch_tpu.testing.compare import float32_tolerance

# fp32 through a whole model and an optimizer update: per-op differences (~1e-6 relative) compound.
RTOL, ATOL = float32_tolerance(1e-4, 1e-5)
# (on a TPU, the chip's float32 transcendentals -- tanh, exp, log -- widen that: torch_tpu.testing.compare)


@dataclass
class Step:
    outputs: list[torch.Tensor]
    losses: list[torch.Tensor]
    grads: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]


def _to(value, device):
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def train(model: torch.nn.Module, batches: list, forward: Callable, make_optimizer: Callable, device: str) -> Step:
    """`len(batches)` optimizer steps of a copy of `model` on `device`.

    `forward(model, batch)` returns (output, loss). Gradients are those of the first step; `state` is the
    state dict (parameters and buffers) after the last one.
    """
    model = copy.deepcopy(model).to(device)
    if hasattr(model, "tie_weights"):  # `Module.to` unties shared parameters on a PrivateUse1 device
        model.tie_weights()
    optimizer = make_optimizer(model.parameters())
    outputs, losses, grads = [], [], {}
    for batch in batches:
        optimizer.zero_grad()
        output, loss = forward(model, _to(batch, device))
        loss.backward()
        if not grads:
            grads = {name: _cpu(p.grad) for name, p in model.named_parameters()}
        optimizer.step()
        outputs.append(_cpu(output))
        losses.append(_cpu(loss))
    for name, value in model.state_dict().items():
        assert value.device.type == device, name
    return Step(outputs, losses, grads, {name: _cpu(v) for name, v in model.state_dict().items()})


def _assert_close(ours, theirs, what: str) -> None:
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL, msg=lambda message: f"{what}: {message}")


def assert_steps_match(ours: Step, theirs: Step) -> None:
    _assert_close(ours.outputs, theirs.outputs, "outputs")
    _assert_close(ours.losses, theirs.losses, "losses")
    assert ours.grads.keys() == theirs.grads.keys()
    for name, grad in theirs.grads.items():
        _assert_close(ours.grads[name], grad, f"grad of {name}")
    assert ours.state.keys() == theirs.state.keys()
    for name, value in theirs.state.items():
        _assert_close(ours.state[name], value, f"{name} after the last step")


@pytest.fixture
def check_training():
    """`check_training(model, batches, forward, make_optimizer)`: train on CPU and on tpu; assert they match."""

    def check(model, batches, forward, make_optimizer):
        theirs = train(model, batches, forward, make_optimizer, "cpu")
        ours = train(model, batches, forward, make_optimizer, "tpu")
        assert_steps_match(ours, theirs)

    return check
