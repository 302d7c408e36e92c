"""torch.nn models (TransformerEncoder, LSTM, GRU, a small ResNet) on `tpu` against CPU PyTorch: outputs,
losses, every gradient and the parameters and buffers after a few optimizer steps."""

import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

STEPS = 2


def adamw(params):
    # Adam's first step is -lr * g / (|g| + eps): for |g| near eps it magnifies the gradient's rounding error
    # (e.g. the exactly-zero gradient of attention key biases) by lr / eps; eps=1e-4 keeps that under 1e-6.
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4)


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


def transformer_encoder():
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(32), enable_nested_tensor=False)
    causal = nn.Transformer.generate_square_subsequent_mask(10).isinf()
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, 7:] = True

    def forward(model, batch):
        x, target, causal, padding = batch
        out = model(x, mask=causal, src_key_padding_mask=padding)
        return out, F.mse_loss(out, target)

    batches = [(torch.randn(2, 10, 32), torch.randn(2, 10, 32), causal, padding) for _ in range(STEPS)]
    return model, batches, forward


def recurrent(kind):
    model = getattr(nn, kind)(8, 16, num_layers=2, bidirectional=True, batch_first=True)
    state_layers = 2 * 2

    def forward(model, batch):
        x, target, *state = batch
        out, _ = model(x, tuple(state) if len(state) > 1 else state[0])
        return out, F.mse_loss(out, target)

    def batch():
        state = [torch.randn(state_layers, 3, 16) for _ in range(2 if kind == "LSTM" else 1)]
        return (torch.randn(3, 7, 8), torch.randn(3, 7, 32), *state)

    return model, [batch() for _ in range(STEPS)], forward


class BasicBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        # No conv bias before BatchNorm: its gradient is exactly zero.
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        BasicBlock(8, 8, 1),
        BasicBlock(8, 16, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 5),
    )

    def forward(model, batch):
        x, labels = batch
        out = model(x)
        return out, F.cross_entropy(out, labels)

    return model, [(torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))) for _ in range(STEPS)], forward


MODELS = {
    "transformer_encoder": transformer_encoder,
    "lstm": lambda: recurrent("LSTM"),
    "gru": lambda: recurrent("GRU"),
    "resnet": resnet,
}


OPTIMIZERS = {"adamw": adamw, "sgd": sgd}


@pytest.mark.parametrize("name, optimizer", [
    ("transformer_encoder", "adamw"), ("lstm", "sgd"), ("gru", "adamw"), ("resnet", "sgd"), ("resnet", "adamw"),
])  # fmt: skip
def test_model_trains_like_cpu(name, optimizer, check_training):
    model, batches, forward = MODELS[name]()
    check_training(model.train(), batches, forward, OPTIMIZERS[optimizer])


class TiedLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embedding.weight


def test_moves_keep_tied_weights_and_parameter_identity():
    model = TiedLanguageModel()
    weight = model.embedding.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.head(model.embedding(torch.tensor([1, 2]))).sum().backward()
    expected = (weight - 0.5 * weight.grad).detach().clone()
    model.to("tpu")
    assert (model.head.weight is weight, model.embedding.weight is weight) == (True, True)
    assert (weight.device.type, weight.grad.device.type) == ("tpu", "tpu")
    optimizer.step()  # built before the move, it updates the moved parameter
    torch.testing.assert_close(weight.cpu(), expected)
    model.cpu()
    assert (model.head.weight is weight, weight.device.type) == (True, "cpu")
    model.tpu()
    assert (model.head.weight is weight, weight.device.type) == (True, "tpu")


def test_move_falls_back_with_a_warning_when_a_parameter_cannot_be_swapped():
    model = TiedLanguageModel()
    observer = weakref.ref(model.embedding.weight)  # swap_tensors refuses tensors with weak references
    with pytest.warns(UserWarning, match="could not keep its parameters' identity"):
        model.to("tpu")
    assert observer() is None  # replaced, the default way
    assert (model.embedding.weight.device.type, model.head.weight.device.type) == ("tpu", "tpu")
    assert not torch.__future__.get_swap_module_params_on_conversion()
