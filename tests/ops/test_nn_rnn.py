"""Recurrent cells and layers on `tpu` against CPU PyTorch: the fused LSTM/GRU cells (reached through
lstm_cell / gru_cell / lstm / gru), plain RNN cells, packed sequences; float32 and bfloat16, with gradients."""

import functools

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from tests.helpers import random_tensor
from torch_tpu.testing.compare import assert_close, check_op, to_tpu

FLOAT, BF16 = torch.float32, torch.bfloat16


# Normal floats requiring grad (tests/helpers.py)
make = functools.partial(random_tensor, grad=True)


def cell_args(gates, bias, dtype, states):
    args = [make(3, 4, dtype=dtype)] + [make(3, 5, dtype=dtype) for _ in range(states)]
    args += [make(gates * 5, 4, dtype=dtype), make(gates * 5, 5, dtype=dtype)]
    if bias:
        args += [make(gates * 5, dtype=dtype), make(gates * 5, dtype=dtype)]
    return args


def check_cell(fn, args):
    """float32: against CPU. bfloat16: against CPU in float32, rounded once: the fused cells compute in float32
    (as CUDA's do), while CPU's composite cells round every intermediate to bfloat16."""
    if args[0].dtype == FLOAT:
        check_op(fn, *args, grad=True)
        return
    ours = to_tpu(args)
    reference = [a.detach().float().requires_grad_() for a in args]
    out, expected = fn(*ours), fn(*reference)
    assert_close(out, [e.to(BF16) for e in expected])
    seeds = [torch.randn_like(e) for e in expected]
    grads = torch.autograd.grad(out, ours, to_tpu([s.to(BF16) for s in seeds]))
    assert_close(list(grads), [g.to(BF16) for g in torch.autograd.grad(expected, reference, seeds)])


def lstm_cell(x, h, c, *params):
    return list(torch.lstm_cell(x, (h, c), *params))


@pytest.mark.parametrize("dtype", [FLOAT, BF16])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell(bias, dtype):
    check_cell(lstm_cell, cell_args(4, bias, dtype, states=2))


def test_lstm_cell_cell_state_only_grad():
    """Only `cy` feeds the loss: the fused backward receives no gradient for `hy`."""
    check_op(lambda x, h, c, *params: torch.lstm_cell(x, (h, c), *params)[1], *cell_args(4, True, FLOAT, 2), grad=True)


def test_lstm_cell_hidden_only_grad():
    check_op(lambda x, h, c, *params: torch.lstm_cell(x, (h, c), *params)[0], *cell_args(4, True, FLOAT, 2), grad=True)


@pytest.mark.parametrize("dtype", [FLOAT, BF16])
@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell(bias, dtype):
    check_cell(lambda *args: [torch.gru_cell(*args)], cell_args(3, bias, dtype, states=1))


@pytest.mark.parametrize("cell", [torch.rnn_tanh_cell, torch.rnn_relu_cell], ids=["tanh", "relu"])
def test_rnn_cell(cell):
    check_op(cell, *cell_args(1, True, FLOAT, states=1), grad=True)


LAYERS = {
    "lstm": lambda: nn.LSTM(4, 5),
    "lstm_2layer_bidirectional_batch_first": lambda: nn.LSTM(4, 5, 2, bidirectional=True, batch_first=True),
    "lstm_proj": lambda: nn.LSTM(4, 5, proj_size=3),
    "gru_2layer_bidirectional": lambda: nn.GRU(4, 5, 2, bidirectional=True),
    "gru_no_bias": lambda: nn.GRU(4, 5, bias=False),
    "lstm_no_bias": lambda: nn.LSTM(4, 5, bias=False),
    "rnn_relu": lambda: nn.RNN(4, 5, nonlinearity="relu"),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_recurrent_layer(name):
    module = LAYERS[name]()
    names = [n for n, _ in module.named_parameters()]

    def fn(x, *params):
        return torch.func.functional_call(module.to(x.device), dict(zip(names, params, strict=True)), (x,))

    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    check_op(fn, make(6, 3, 4), *params, grad=True)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_packed_sequence(kind):
    module = getattr(nn, kind)(4, 5, bidirectional=True)
    names = [n for n, _ in module.named_parameters()]
    lengths = torch.tensor([4, 4, 2])

    def fn(x, *params):
        packed = pack_padded_sequence(x, lengths)
        out, _ = torch.func.functional_call(module.to(x.device), dict(zip(names, params, strict=True)), (packed,))
        return pad_packed_sequence(out)[0]

    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    check_op(fn, make(4, 3, 4), *params, grad=True)
