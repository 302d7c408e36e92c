"""Train an MLP and a small CNN on `tpu` with SGD and AdamW; match CPU PyTorch step for step."""

import copy

import pytest
import torch
import torch.nn.functional as F

from torch_tpu.testing.compare import float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

# fp32 over a few optimizer steps: per-op differences (~1e-6 relative) compound through the updates.
RTOL, ATOL = float32_tolerance(1e-4, 1e-5)
# (on a TPU, the chip's float32 transcendentals -- tanh, exp, log -- widen that: torch_tpu.testing.compare)


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5)
    )


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        # No bias before BatchNorm: its gradient is exactly zero, and Adam would amplify rounding noise in it.
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.0),
        torch.nn.Linear(16, 5),
    )


def batches(kind: str, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (16, 20) if kind == "mlp" else (8, 3, 12, 12)
    return [(torch.randn(*shape), torch.randint(0, 5, (shape[0],))) for _ in range(steps)]


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
}


def train(model, data, make_optimizer, device):
    model = copy.deepcopy(model).to(device)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for inputs, labels in data:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return model, torch.stack(losses)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_training_matches_cpu(kind, optimizer):
    torch.manual_seed(0)
    model = mlp() if kind == "mlp" else cnn()
    data = batches(kind, steps=4)
    cpu_model, cpu_losses = train(model, data, OPTIMIZERS[optimizer], "cpu")
    tpu_model, tpu_losses = train(model, data, OPTIMIZERS[optimizer], "tpu")
    torch.testing.assert_close(tpu_losses.cpu(), cpu_losses, rtol=RTOL, atol=ATOL)
    for (name, ours), theirs in zip(tpu_model.state_dict().items(), cpu_model.state_dict().values(), strict=True):
        assert ours.device.type == "tpu", name
        torch.testing.assert_close(ours.cpu(), theirs, rtol=RTOL, atol=ATOL, msg=name)
