"""Softmax family and loss functions on `tpu` against CPU PyTorch (outputs and input gradients)."""

import functools

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import random_tensor
from torch_tpu.testing.compare import check_op

FLOAT, BF16 = torch.float32, torch.bfloat16
aten = torch.ops.aten


# Normal floats requiring grad (tests/helpers.py)
make = functools.partial(random_tensor, grad=True)


SOFTMAXES = [
    ("softmax", lambda x: F.softmax(x, 1)),
    ("softmax_last", lambda x: F.softmax(x, -1)),
    ("log_softmax", lambda x: F.log_softmax(x, 0)),
    ("log_softmax_last", lambda x: F.log_softmax(x, -1)),
    ("softmax_dtype", lambda x: F.softmax(x, 1, dtype=torch.float64)),
    ("softmin", lambda x: F.softmin(x, 2)),
]


@pytest.mark.parametrize("dtype", [FLOAT, BF16])
@pytest.mark.parametrize("name, fn", SOFTMAXES, ids=[s[0] for s in SOFTMAXES])
def test_softmax(name, fn, dtype):
    check_op(fn, make(2, 3, 5, dtype=dtype), grad=True)


def test_softmax_edge_cases():
    check_op(lambda x: (F.softmax(x, 0), F.log_softmax(x, -1)), make(), grad=True)
    check_op(lambda x: F.softmax(x, 1), torch.tensor([[0.0, -torch.inf, 1.0], [2.0, 3.0, -torch.inf]]))


def test_softmax_half_to_float():
    x = make(3, 4, dtype=BF16, grad=False)
    out = aten._softmax(x.to("tpu"), 1, True)
    assert out.dtype == FLOAT
    torch.testing.assert_close(out.cpu(), F.softmax(x.float(), 1))


def test_safe_softmax_fully_masked_row():
    x = torch.tensor([[0.0, 1.0, -torch.inf], [-torch.inf, -torch.inf, -torch.inf]])
    check_op(lambda x: aten._safe_softmax(x, -1), x)


def classes(*shape, high=4):
    return torch.randint(0, high, shape)


# (id, fn, args): fn(*args); float tensors that require grad are differentiated.
LOSSES = [
    ("cross_entropy", lambda x, y: F.cross_entropy(x, y), (make(3, 4), classes(3))),
    ("cross_entropy_ignore", lambda x, y: F.cross_entropy(x, y), (make(3, 4), torch.tensor([1, -100, 3]))),
    (
        "cross_entropy_weight_ignore",
        lambda x, y, w: F.cross_entropy(x, y, weight=w, ignore_index=0),
        (make(4, 4), torch.tensor([1, 3, 0, 2]), torch.rand(4)),
    ),
    (
        "cross_entropy_2d",
        lambda x, y: F.cross_entropy(x, y, reduction="sum"),
        (make(2, 3, 4, 5), classes(2, 4, 5, high=3)),
    ),
    (
        "cross_entropy_2d_weight_ignore",
        lambda x, y, w: F.cross_entropy(x, y, w, ignore_index=1),
        (make(2, 3, 4, 5), classes(2, 4, 5, high=3), torch.rand(3)),
    ),
    ("cross_entropy_3d", lambda x, y: F.cross_entropy(x, y), (make(2, 3, 2, 2, 3), classes(2, 2, 2, 3, high=3))),
    (
        "cross_entropy_label_smoothing",
        lambda x, y: F.cross_entropy(x, y, label_smoothing=0.2),
        (make(3, 4), torch.tensor([1, -100, 3])),
    ),
    (
        "nll_loss_none_ignore",
        lambda x, y: F.nll_loss(x, y, reduction="none", ignore_index=2),
        (make(3, 4), torch.tensor([1, 2, 0])),
    ),
    (
        "nll_loss_sum_weight",
        lambda x, y, w: F.nll_loss(x, y, w, reduction="sum"),
        (make(3, 4), classes(3), torch.rand(4)),
    ),
    ("nll_loss_all_ignored", lambda x, y: F.nll_loss(x, y), (make(2, 4), torch.tensor([-100, -100]))),
    ("nll_loss_unbatched", lambda x, y: F.nll_loss(x, y), (make(4), torch.tensor(2))),
    (
        "nll_loss_forward_total_weight",
        lambda x, y, w: aten.nll_loss_forward(x, y, w, 1, 1),
        (make(3, 4), torch.tensor([1, 2, 0]), torch.rand(4)),
    ),
    ("mse_loss", lambda x, y: F.mse_loss(x, y), (make(2, 3, 4), make(2, 3, 4))),
    ("mse_loss_none", lambda x, y: F.mse_loss(x, y, reduction="none"), (make(2, 3, 4), make(2, 3, 4))),
    ("mse_loss_sum", lambda x, y: F.mse_loss(x, y, reduction="sum"), (make(2, 3, 4), make(2, 3, 4, grad=False))),
    (
        "binary_cross_entropy",
        lambda x, y, w: F.binary_cross_entropy(x, y, weight=w),
        (torch.rand(2, 3, 4).requires_grad_(), torch.rand(2, 3, 4), torch.rand(4)),
    ),
    (
        "binary_cross_entropy_clamped_log",
        lambda x, y: F.binary_cross_entropy(x, y, reduction="none"),
        (torch.tensor([0.0, 1.0, 0.5, 1e-30]).requires_grad_(), torch.tensor([1.0, 0.0, 0.3, 0.5])),
    ),
    (
        "binary_cross_entropy_with_logits",
        lambda x, y: F.binary_cross_entropy_with_logits(x, y),
        (make(2, 3, 4), torch.rand(2, 3, 4)),
    ),
    (
        "binary_cross_entropy_with_logits_weights",
        lambda x, y, w, p: F.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=p, reduction="sum"),
        (make(2, 3, 4), torch.rand(2, 3, 4), torch.rand(4), torch.rand(4)),
    ),
    ("smooth_l1_loss", lambda x, y: F.smooth_l1_loss(x, y), (make(2, 3, 4), make(2, 3, 4))),
    (
        "smooth_l1_loss_beta",
        lambda x, y: F.smooth_l1_loss(x, y, beta=0.5, reduction="none"),
        (make(2, 3, 4), make(2, 3, 4)),
    ),
    ("huber_loss", lambda x, y: F.huber_loss(x, y, delta=0.7), (make(2, 3, 4), make(2, 3, 4))),
    ("huber_loss_sum", lambda x, y: F.huber_loss(x, y, reduction="sum", delta=2.0), (make(2, 3, 4), make(2, 3, 4))),
]


@pytest.mark.parametrize("name, fn, args", LOSSES, ids=[loss[0] for loss in LOSSES])
def test_loss(name, fn, args):
    check_op(fn, *args, grad=True)


def test_smooth_l1_loss_zero_beta():
    x, y, g = make(2, 3, grad=False), make(2, 3, grad=False), torch.tensor(0.5)
    check_op(lambda x, y: aten.smooth_l1_loss(x, y, 1, 0.0), x, y)
    check_op(lambda g, x, y: aten.smooth_l1_loss_backward(g, x, y, 1, 0.0), g, x, y)


@pytest.mark.parametrize(
    "fn, args",
    [
        (lambda x, y: F.cross_entropy(x, y), (make(3, 4, dtype=BF16), classes(3))),
        (lambda x, y: F.mse_loss(x, y), (make(2, 3, dtype=BF16), make(2, 3, dtype=BF16))),
        (lambda x, y: F.smooth_l1_loss(x, y, reduction="none"), (make(2, 3, dtype=BF16), make(2, 3, dtype=BF16))),
    ],
    ids=["cross_entropy", "mse_loss", "smooth_l1_loss"],
)
def test_loss_bf16(fn, args):
    check_op(fn, *args, grad=True)


def test_nll_loss_upcasts_only_the_picked_log_probabilities():
    """A bfloat16 nll_loss converts the one element a row it reads, not the whole input (a GPT's logits: the chip
    spent 2.6 ms a step converting (8192, 32768) of them), and still gives CPU's loss."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.ops.nn.loss import nll_loss_forward

    log_probs, target = jnp.zeros((64, 1024), jnp.bfloat16), jnp.zeros((64,), jnp.uint8)
    text = jax.jit(lambda x, t: nll_loss_forward(x, t, None, 1, -100)).lower(log_probs, target).as_text()
    converted = [line for line in text.splitlines() if "stablehlo.convert" in line and "bf16" in line]
    assert converted and all("64x1024" not in line for line in converted), converted
    check_op(lambda x, y: F.nll_loss(x, y), make(3, 4, dtype=BF16), classes(3), grad=True)


UINT8_TARGETS = [
    ("nll_loss", lambda x, y: F.nll_loss(x, y, reduction="sum")),
    ("nll_loss_ignore_255", lambda x, y: F.nll_loss(x, y, ignore_index=255)),
    ("cross_entropy", lambda x, y: F.cross_entropy(x, y, ignore_index=255)),
    ("cross_entropy_smoothing", lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1)),
    ("nll_loss_weight", lambda x, y: F.nll_loss(x, y, torch.linspace(0.5, 2, 4, device=x.device), reduction="none")),
    ("nll_loss_unbatched", lambda x, y: F.nll_loss(x[1], y[1])),
]


@pytest.mark.parametrize("name, fn", UINT8_TARGETS, ids=[loss[0] for loss in UINT8_TARGETS])
def test_nll_loss_takes_uint8_targets(name, fn):
    """CPU's nll_loss takes uint8 class indices as well as int64 ones (255 a valid ignore_index for them)."""
    target = classes(3).to(torch.uint8)
    if "255" in name:
        target[1] = 255
    check_op(fn, make(3, 4), target, grad=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.bool])
@pytest.mark.parametrize("loss", [F.nll_loss, F.cross_entropy], ids=["nll_loss", "cross_entropy"])
def test_nll_loss_refuses_other_integer_targets_as_cpu(loss, dtype):
    """Targets of any other dtype raise CPU's RuntimeError naming it."""
    x, target = make(3, 4, grad=False), classes(3).to(dtype)
    with pytest.raises(RuntimeError) as expected:
        loss(x, target)
    with pytest.raises(RuntimeError) as actual:
        loss(x.to("tpu"), target.to("tpu"))
    assert str(actual.value) == str(expected.value)


MARGIN_LOSSES = [
    ("multi_margin", lambda x, y: F.multi_margin_loss(x, y), (make(4, 5), classes(4, high=5))),
    (
        "multi_margin_p2_margin_sum",
        lambda x, y: F.multi_margin_loss(x, y, p=2, margin=0.7, reduction="sum"),
        (make(4, 5), classes(4, high=5)),
    ),
    (
        "multi_margin_weight_none",
        lambda x, y, w: F.multi_margin_loss(x, y, weight=w, reduction="none"),
        (make(4, 5), classes(4, high=5), torch.rand(5)),
    ),
    ("multi_margin_unbatched", lambda x, y: F.multi_margin_loss(x, y, margin=-0.5), (make(5), torch.tensor(3))),
    (
        "multilabel_margin",
        lambda x, y: F.multilabel_margin_loss(x, y),
        (make(4, 5), torch.tensor([[4, -1, 0, -1, 2], [0, 0, 4, 1, 4], [-1, 3, -1, 1, 0], [4, 3, 2, 1, 0]])),
    ),
    (
        "multilabel_margin_none",
        lambda x, y: F.multilabel_margin_loss(x, y, reduction="none"),
        (make(3, 4), torch.tensor([[1, 2, -1, 0], [3, -1, 0, 0], [0, 1, 2, 3]])),
    ),
    (
        "multilabel_margin_sum_unbatched",
        lambda x, y: F.multilabel_margin_loss(x, y, reduction="sum"),
        (make(7), torch.tensor([2, 0, 6, -1, 4, -1, 6])),
    ),
]


@pytest.mark.parametrize("name, fn, args", MARGIN_LOSSES, ids=[loss[0] for loss in MARGIN_LOSSES])
def test_margin_loss(name, fn, args):
    check_op(fn, *args, grad=True)


def test_margin_losses_at_the_hinge():
    """Exactly at the margin the hinge's gradient is 0, as in CPU PyTorch (not a subgradient split)."""
    x = torch.tensor([[1.0, 0.0, 1.0], [0.5, 1.5, 0.5]], requires_grad=True)
    check_op(lambda x, y: F.multi_margin_loss(x, y), x, torch.tensor([0, 1]), grad=True)
    check_op(lambda x, y: F.multilabel_margin_loss(x, y), x, torch.tensor([[0, -1, 0], [1, -1, 0]]), grad=True)


CTC_LENGTHS = dict(input_lengths=[12, 10, 3, 0], target_lengths=[5, 3, 4, 0])  # the third cannot align


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss(reduction, zero_infinity):
    log_probs = torch.randn(12, 4, 6).log_softmax(2).requires_grad_()
    targets = torch.randint(1, 6, (4, 5))
    check_op(
        lambda lp, t: F.ctc_loss(lp, t, **CTC_LENGTHS, reduction=reduction, zero_infinity=zero_infinity),
        log_probs,
        targets,
        grad=True,
    )


@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss_raw_gradient(concatenated):
    """`_ctc_loss_backward` is ATen's formula for log-softmax inputs (it includes `exp(log_probs)`), so it is
    checked on unnormalized inputs too; 1-d targets hold the sequences back to back."""
    targets = torch.randint(1, 6, (4, 5))
    if concatenated:
        targets = torch.cat([row[:n] for row, n in zip(targets, CTC_LENGTHS["target_lengths"], strict=True)])
    lengths = CTC_LENGTHS["input_lengths"], CTC_LENGTHS["target_lengths"]
    check_op(lambda x, t: aten._ctc_loss(x, t, *lengths, 0, True)[0], make(12, 4, 6), targets, grad=True)


def test_ctc_loss_unbatched_and_blank():
    log_probs = torch.randn(9, 5).log_softmax(1).requires_grad_()
    check_op(lambda lp, t: F.ctc_loss(lp, t, [9], [4], blank=4), log_probs, torch.tensor([0, 1, 1, 3]), grad=True)
