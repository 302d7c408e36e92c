"""Embedding, dropout, upsampling, pixel shuffle and attention on `tpu` against CPU PyTorch."""

import functools

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import random_tensor
from torch_tpu.testing.compare import check_op

FLOAT, BF16 = torch.float32, torch.bfloat16


# Normal floats requiring grad (tests/helpers.py)
make = functools.partial(random_tensor, grad=True)


INDICES = torch.tensor([[0, 1, 2], [2, 2, 4]])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(padding_idx=2),
        dict(padding_idx=-1),
        dict(scale_grad_by_freq=True),
        dict(padding_idx=0, scale_grad_by_freq=True),
    ],
    ids=["plain", "padding_idx", "negative_padding_idx", "scale_grad_by_freq", "both"],
)
def test_embedding(kwargs):
    check_op(lambda w, i: F.embedding(i, w, **kwargs), make(5, 3), INDICES, grad=True)


def test_embedding_module_bf16():
    module = torch.nn.Embedding(6, 4, padding_idx=1).to(BF16)
    check_op(lambda i: module.to(i.device)(i), INDICES)


def dropout_on_tpu(p, shape=(200, 100), seed=None, training=True):
    if seed is not None:
        torch.manual_seed(seed)
    x = (torch.rand(shape) + 0.5).to("tpu").requires_grad_()
    return x, F.dropout(x, p, training=training)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics(p):
    x, y = dropout_on_tpu(p)
    assert y.device.type == "tpu" and y.shape == x.shape
    kept = (y != 0).cpu()
    assert abs(kept.float().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(y.cpu()[kept], x.detach().cpu()[kept] / (1 - p))
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    expected = torch.where(kept, torch.tensor(1 / (1 - p)), torch.tensor(0.0))
    torch.testing.assert_close(grad.cpu(), expected)


def test_dropout_identity_and_extremes():
    x, y = dropout_on_tpu(0.0)
    torch.testing.assert_close(y.cpu(), x.detach().cpu())
    x, y = dropout_on_tpu(0.5, training=False)
    torch.testing.assert_close(y.cpu(), x.detach().cpu())
    _, y = dropout_on_tpu(1.0)
    assert not y.cpu().any()


def test_dropout_reproducible_with_manual_seed():
    _, first = dropout_on_tpu(0.5, seed=123)
    _, second = dropout_on_tpu(0.5, seed=123)
    _, other = dropout_on_tpu(0.5, seed=124)
    _, next_draw = dropout_on_tpu(0.5)
    assert torch.equal(first.cpu(), second.cpu())
    assert not torch.equal(first.cpu(), other.cpu())
    assert not torch.equal(other.cpu(), next_draw.cpu())


def test_native_dropout_mask():
    x = torch.randn(50, 40).to("tpu")
    out, mask = torch.ops.aten.native_dropout(x, 0.25, True)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    torch.testing.assert_close(out.cpu(), (x.cpu() * mask.cpu() / 0.75))
    out, mask = torch.ops.aten.native_dropout(x, 0.25, False)
    assert mask.cpu().all() and torch.equal(out.cpu(), x.cpu())


# (id, input shape, interpolate kwargs)
UPSAMPLES = [
    ("nearest1d", (2, 3, 5), dict(size=11)),
    ("nearest1d_scale", (2, 3, 5), dict(scale_factor=1.7)),
    ("nearest2d_x2", (2, 3, 4, 5), dict(scale_factor=2)),
    ("nearest2d_size", (2, 3, 4, 5), dict(size=(7, 4))),
    ("nearest2d_scale", (2, 3, 4, 5), dict(scale_factor=(1.7, 0.6))),
    ("nearest3d", (1, 2, 3, 4, 3), dict(scale_factor=(2, 1.5, 1))),
    ("nearest_exact2d", (2, 3, 4, 5), dict(mode="nearest-exact", size=(7, 3))),
    ("nearest_exact1d", (2, 3, 5), dict(mode="nearest-exact", scale_factor=1.7)),
    ("linear1d", (2, 3, 5), dict(mode="linear", scale_factor=2.5)),
    ("linear1d_align", (2, 3, 5), dict(mode="linear", size=8, align_corners=True)),
    ("bilinear2d_x2", (2, 3, 4, 5), dict(mode="bilinear", scale_factor=2)),
    ("bilinear2d_size", (2, 3, 4, 5), dict(mode="bilinear", size=(7, 3))),
    ("bilinear2d_align", (2, 3, 4, 5), dict(mode="bilinear", scale_factor=1.7, align_corners=True)),
    ("bilinear2d_down", (2, 3, 6, 7), dict(mode="bilinear", size=(3, 2))),
    ("bicubic2d", (2, 3, 4, 5), dict(mode="bicubic", scale_factor=1.7)),
    ("bicubic2d_align", (2, 3, 4, 5), dict(mode="bicubic", size=(7, 3), align_corners=True)),
    ("trilinear3d", (1, 2, 3, 4, 3), dict(mode="trilinear", size=(3, 7, 5))),
]


@pytest.mark.parametrize("name, shape, kwargs", UPSAMPLES, ids=[u[0] for u in UPSAMPLES])
def test_upsample(name, shape, kwargs):
    check_op(lambda x: F.interpolate(x, **kwargs), make(*shape), grad=True)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_bf16(mode):
    check_op(lambda x: F.interpolate(x, scale_factor=2, mode=mode), make(2, 3, 4, 5, dtype=BF16), grad=True)


def test_pixel_shuffle():
    check_op(lambda x: F.pixel_shuffle(x, 2), make(2, 8, 3, 4), grad=True)
    check_op(lambda x: F.pixel_unshuffle(x, 2), make(2, 3, 4, 6), grad=True)
    check_op(lambda x: F.pixel_shuffle(x, 3), make(9, 2, 2), grad=True)


ATTENTION = [
    ("plain", (2, 3, 5, 8), (2, 3, 6, 8), {}),
    ("causal", (2, 3, 5, 8), (2, 3, 6, 8), dict(is_causal=True)),
    ("scale", (2, 5, 8), (2, 6, 8), dict(scale=0.3)),
    ("gqa", (2, 4, 5, 8), (2, 2, 6, 8), dict(enable_gqa=True)),
]


@pytest.mark.parametrize("name, q_shape, kv_shape, kwargs", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_scaled_dot_product_attention(name, q_shape, kv_shape, kwargs):
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)
    check_op(fn, make(*q_shape), make(*kv_shape), make(*kv_shape), grad=True)


@pytest.mark.parametrize("kind", ["bool", "float", "fully_masked_row"])
def test_scaled_dot_product_attention_mask(kind):
    if kind == "float":
        mask = make(5, 6)
    else:
        mask = torch.rand(5, 6) > 0.3
        mask[1] = kind == "bool"
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    check_op(fn, make(2, 3, 5, 8), make(2, 3, 6, 8), make(2, 3, 6, 8), mask, grad=True)


def test_scaled_dot_product_attention_bf16():
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    check_op(fn, *(make(2, 3, 5, 8, dtype=BF16) for _ in range(3)))


def test_scaled_dot_product_attention_dropout_reproducible():
    q, k, v = (torch.randn(2, 3, 5, 8).to("tpu") for _ in range(3))
    torch.manual_seed(7)
    first = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(7)
    second = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(first.cpu(), second.cpu())


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm(norm_type):
    weight = torch.randn(5, 3) * 2

    def fn(w, i):
        w = w.clone()
        out = F.embedding(i, w, max_norm=1.5, norm_type=norm_type)
        return out, w

    check_op(fn, weight, INDICES)


def test_max_unpool():
    x = make(2, 3, 6, 8, grad=False)
    out, indices = F.max_pool2d(x, 2, return_indices=True)
    check_op(lambda o, i: F.max_unpool2d(o, i, 2), out.requires_grad_(), indices, grad=True)
    x = make(1, 2, 4, 4, 6, grad=False)
    out, indices = F.max_pool3d(x, 2, return_indices=True)
    check_op(lambda o, i: F.max_unpool3d(o, i, 2), out, indices)


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda x: F.adaptive_avg_pool1d(x, 5), (0, 8, 8)),
        (lambda x: F.unfold(x, 2), (0, 1, 5, 5)),
        (lambda x: F.pad(x, (1, 2), mode="circular"), (0, 3, 3)),
        (lambda x: F.group_norm(x, 1), (0, 2)),
        (lambda x: x.sum(0), (0, 4)),
    ],
    ids=["adaptive_avg_pool1d", "unfold", "pad_circular", "group_norm", "sum_over_empty"],
)
def test_zero_size_batch(fn, shape):
    """A zero-size batch gives empty (or, reduced over, identity) results of the right shape, as on CPU."""
    check_op(fn, make(*shape), grad=True)


BAG_INDICES, BAG_OFFSETS = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6])  # bag 1 is empty


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize(
    "offsets, kwargs",
    [
        (BAG_OFFSETS, {}),
        (BAG_OFFSETS, dict(padding_idx=4)),
        (torch.tensor([0, 3, 3, 6, 8]), dict(include_last_offset=True)),
    ],
    ids=["plain", "padding_idx", "include_last_offset"],
)
def test_embedding_bag(mode, offsets, kwargs):
    check_op(
        lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, **kwargs), make(10, 3), BAG_INDICES, offsets, grad=True
    )


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq(mode):
    """Each row's gradient is divided by its index's frequency. CPU PyTorch 2.13's embedding_bag divides some rows
    by another index's count (pytorch/pytorch#190063), so the reference is built from `F.embedding`."""
    weight = make(10, 3)
    rows = F.embedding(BAG_INDICES, weight, scale_grad_by_freq=True)
    reduce = torch.sum if mode == "sum" else torch.mean
    expected = torch.stack([reduce(rows[start:end], 0) for start, end in ((0, 3), (3, 6), (6, 8))])
    seed = torch.randn_like(expected)
    (expected_grad,) = torch.autograd.grad(expected, weight, seed)
    on_tpu = weight.detach().to("tpu").requires_grad_()
    offsets = torch.tensor([0, 3, 6]).to("tpu")
    actual = F.embedding_bag(BAG_INDICES.to("tpu"), on_tpu, offsets, mode=mode, scale_grad_by_freq=True)
    (grad,) = torch.autograd.grad(actual, on_tpu, seed.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected.detach())
    torch.testing.assert_close(grad.cpu(), expected_grad)


def test_embedding_bag_per_sample_weights():
    check_op(
        lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=2),
        make(10, 3),
        BAG_INDICES,
        BAG_OFFSETS,
        make(8),
        grad=True,
    )


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_input_bf16(mode):
    check_op(lambda w, i: F.embedding_bag(i, w, mode=mode), make(10, 4, dtype=BF16), INDICES, grad=True)


GRID_SAMPLES = [
    (2, mode, padding, align)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for align in (False, True)
]
GRID_SAMPLES += [
    (3, mode, padding, align)
    for mode in ("bilinear", "nearest")
    for padding in ("zeros", "border", "reflection")
    for align in (False, True)
]


@pytest.mark.parametrize(
    "dims, mode, padding_mode, align_corners", GRID_SAMPLES, ids=["-".join(map(str, g)) for g in GRID_SAMPLES]
)
def test_grid_sample(dims, mode, padding_mode, align_corners):
    """Grid points in [-2, 2] reach past the input on every side; gradients w.r.t. the input and the grid."""
    x = make(2, 3, *[5, 4, 6][-dims:])
    grid = (torch.rand(2, *[4, 3, 2][-dims:], dims) * 4 - 2).requires_grad_()
    check_op(
        lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
        x,
        grid,
        grad=True,
    )


@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
def test_grid_sample_exact_edges(padding_mode):
    """Grid points exactly on the border (the clip's gradient is 0 there, as on CPU) and on pixel centers."""
    grid = torch.tensor([[[[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5], [1.0, -0.5]]]], requires_grad=True)
    check_op(
        lambda x, g: F.grid_sample(x, g, padding_mode=padding_mode, align_corners=True),
        make(1, 2, 3, 5),
        grid,
        grad=True,
    )


ANTIALIASED = [
    ("down", dict(size=(3, 5))),
    ("down_align", dict(size=(4, 7), align_corners=True)),
    ("mixed_scales", dict(scale_factor=(1.7, 0.6))),
    ("to_one", dict(size=(1, 1))),
]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("name, kwargs", ANTIALIASED, ids=[a[0] for a in ANTIALIASED])
def test_upsample_antialias(mode, name, kwargs):
    check_op(lambda x: F.interpolate(x, mode=mode, antialias=True, **kwargs), make(2, 3, 10, 20), grad=True)


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_antialias_explicit_scales(align_corners):
    """Scales passed to the op (not recomputed from sizes) set the filter width; align_corners ignores them."""
    check_op(
        lambda x: torch.ops.aten._upsample_bilinear2d_aa(x, (3, 3), align_corners, 1.7, 0.9),
        make(2, 3, 10, 20),
        grad=True,
    )


def test_rrelu_eval_is_leaky_relu():
    check_op(lambda x: F.rrelu(x, 0.1, 0.3, training=False), make(4, 5), grad=True)


@pytest.mark.parametrize("dtype", [FLOAT, BF16])
def test_rrelu_training_draws_slopes(dtype):
    """Training draws each negative element's slope from U(lower, upper) on tpu; the gradient is that slope."""
    x = torch.randn(64, 32).to(dtype).to("tpu").requires_grad_()
    out = F.rrelu(x, 0.1, 0.3, training=True)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    x, out, grad = x.detach().cpu().float(), out.detach().cpu().float(), grad.cpu().float()
    negative = x < 0
    slopes = out[negative] / x[negative]
    assert out.dtype == grad.dtype == torch.float32 and 0.09 < slopes.min() and slopes.max() < 0.31
    assert slopes.std() > 0.03  # drawn, not the mean slope
    torch.testing.assert_close(grad[negative], slopes, rtol=2e-2, atol=1e-3)
    assert torch.equal(out[~negative], x[~negative]) and (grad[~negative] == 1).all()


def test_rrelu_with_noise_writes_noise():
    x, noise = torch.randn(6, 7).to("tpu"), torch.zeros(6, 7).to("tpu")
    out = torch.ops.aten.rrelu_with_noise(x, noise, 0.2, 0.4, True)
    x, noise = x.cpu(), noise.cpu()
    torch.testing.assert_close(out.cpu(), x * noise)
    assert (noise[x > 0] == 1).all() and ((noise[x <= 0] >= 0.2) & (noise[x <= 0] <= 0.4)).all()


UINT8_RESIZES = [
    dict(size=(7, 9)),
    dict(size=(31, 40)),
    dict(size=(400, 410)),
    dict(size=(5, 6), align_corners=True),
    dict(size=(30, 11), align_corners=True),
    dict(scale_factor=(1.7, 0.45)),
]


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("resize", UINT8_RESIZES, ids=str)
def test_uint8_image_resampling_is_cpu_bit_exact(mode, antialias, resize):
    """uint8 images resample in ATen's fixed point (int16 weights, rounded, saturated per dim): bit-exact."""
    image = torch.randint(0, 256, (2, 3, 13, 17), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    kwargs = {"mode": mode, "antialias": antialias, "align_corners": False, **resize}
    expected = F.interpolate(image, **kwargs)
    torch.testing.assert_close(F.interpolate(image.to("tpu"), **kwargs).cpu(), expected, rtol=0, atol=0)
