"""Copying shape ops and the view-backward scatters against CPU PyTorch, with gradients."""

import functools

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import random_tensor
from torch_tpu.testing.compare import check_op, has_derivative

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


# Each call its own generator seeded 0 (tests/helpers.py): the same tensor whatever ran before
make = functools.partial(random_tensor, seed=0)


# name -> (function, input shapes); every op runs for every dtype in DTYPES.
COPIES = {
    "cat": (lambda a, b: torch.cat([a, b], 1), [(2, 3), (2, 4)]),
    "cat_negative_dim": (lambda a, b: torch.cat([a, b, a], -1), [(2, 3), (2, 1)]),
    "stack": (lambda a, b: torch.stack([a, b], -1), [(2, 3), (2, 3)]),
    "stack_first": (lambda a, b: torch.stack([a, b]), [(2, 3), (2, 3)]),
    "flip": (lambda a: a.flip(0, -1), [(2, 3, 4)]),
    "roll": (lambda a: a.roll((1, -2), (0, 2)), [(2, 3, 4)]),
    "roll_flat": (lambda a: a.roll(5), [(2, 3, 4)]),
    "repeat": (lambda a: a.repeat(2, 1, 3), [(2, 3)]),
    "tile": (lambda a: a.tile((2,)), [(2, 3)]),
    "narrow_copy": (lambda a: a.narrow_copy(1, 1, 2), [(2, 3, 4)]),
    "constant_pad": (lambda a: F.pad(a, (1, 2, 0, 1)), [(2, 3, 4)]),
    "constant_pad_crop": (lambda a: F.pad(a, (-1, 2, 1, -1)), [(2, 3, 4)]),
    "slice_scatter": (lambda a, b: torch.slice_scatter(a, b, 1, 1, None, 2), [(3, 5), (3, 2)]),
    "select_scatter": (lambda a, b: torch.select_scatter(a, b, 0, -1), [(3, 5), (5,)]),
    "diagonal_scatter": (lambda a, b: torch.diagonal_scatter(a, b, -1), [(3, 5), (2,)]),
    "as_strided_scatter": (lambda a, b: torch.as_strided_scatter(a, b, (2, 2), (1, 3), 1), [(3, 5), (2, 2)]),
    "repeat_interleave_int": (lambda a: a.repeat_interleave(2, dim=1), [(3, 2)]),
    "repeat_interleave_flat": (lambda a: a.repeat_interleave(3), [(2, 2)]),
}


@pytest.mark.parametrize("name", sorted(COPIES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_op(name, dtype):
    fn, shapes = COPIES[name]
    grad = dtype == torch.float32 and has_derivative(fn, *shapes)
    check_op(fn, *[make(*s, dtype=dtype, grad=grad, seed=i) for i, s in enumerate(shapes)], grad=grad)


def test_constant_pad_value():
    check_op(lambda a: F.pad(a, (2, 0, 1, 1), value=1.5), make(2, 3, 4, grad=True), grad=True)
    check_op(lambda a: F.pad(a, (1, 1), value=7), make(2, 3, dtype=torch.int64))


def test_cat_promotes_and_skips_legacy_empty():
    check_op(lambda a, b: torch.cat([a, b]), make(2, 3, grad=True), torch.ones(1, 3, dtype=torch.int64), grad=True)
    check_op(lambda a, b: torch.cat([a, b]), make(2, 3, grad=True), torch.empty(0), grad=True)
    check_op(lambda a, b: torch.cat([a, b]), make(2, 3, dtype=torch.bfloat16), make(1, 3, dtype=torch.float16))


@pytest.mark.parametrize(
    ("dtypes", "out_dtype"),
    [((torch.float32,), torch.int64), ((torch.float32, torch.int64), torch.int32), ((torch.int64,), torch.bool)],
)
def test_cat_out_of_a_narrower_kind_raises_as_on_cpu(dtypes, out_dtype):
    """CPU's canCast check of cat's inputs against `out=`: a TypeError naming the output dtype."""
    inputs = [make(2, 3, dtype=dtype, seed=i) for i, dtype in enumerate(dtypes)]
    with pytest.raises(TypeError) as expected:
        torch.cat(inputs, out=torch.empty(0, dtype=out_dtype))
    with pytest.raises(TypeError) as caught:
        torch.cat([x.to("tpu") for x in inputs], out=torch.empty(0, dtype=out_dtype, device="tpu"))
    assert str(caught.value) == str(expected.value)
    check_op(lambda a: torch.cat([a, a], out=torch.empty(4, 3, dtype=torch.float64, device=a.device)), inputs[0])


PADS = {
    "reflect": [(1, (2, 1)), (2, (2, 1, 1, 2)), (3, (2, 1, 1, 2, 1, 1))],
    "replicate": [(1, (2, 1)), (2, (2, 1, 3, 0)), (3, (2, 1, 1, 0, 0, 2))],
    "circular": [(1, (2, 1)), (2, (1, 1, 2, 0))],
}


@pytest.mark.parametrize("mode,dims,pad", [(m, d, p) for m, cases in PADS.items() for d, p in cases])
def test_reflection_replication_pad(mode, dims, pad):
    shape = (2, 3, 4, 5, 6)[: dims + 2]
    check_op(lambda a: F.pad(a, pad, mode=mode), make(*shape, grad=True), grad=True)


def test_pad_bfloat16():
    check_op(lambda a: F.pad(a, (2, 1), mode="reflect"), make(2, 3, 4, dtype=torch.bfloat16))
    check_op(lambda a: F.pad(a, (2, 1, 1, 1), mode="replicate"), make(2, 3, 4, dtype=torch.bfloat16))


# Gradients of views flow back through slice_backward, select_backward, diagonal_backward, unfold_backward, ...
VIEW_GRADS = {
    "slice": (lambda a: a[1:, ::2] * 2, (3, 5)),
    "slice_negative": (lambda a: a[:, -3:-1] * 2, (3, 5)),
    "select": (lambda a: a.select(1, -1) * 2, (3, 2, 4)),
    "index_int": (lambda a: a[1] * 2, (3, 4)),
    "diagonal": (lambda a: a.diagonal() * 2, (3, 4)),
    "diagonal_offset": (lambda a: a.diagonal(1, 0, 2) * 2, (3, 2, 4)),
    "transpose": (lambda a: a.t() * 2, (3, 5)),
    "permute": (lambda a: a.permute(2, 0, 1) * 2, (2, 3, 4)),
    "unfold": (lambda a: a.unfold(1, 2, 1) * 2, (3, 5)),
    "unfold_gap": (lambda a: a.unfold(0, 2, 3) * 2, (8, 2)),
    "expand": (lambda a: a.expand(2, 3, 4) * 2, (3, 1)),
    "narrow": (lambda a: a.narrow(0, 1, 2) * 2, (4, 3)),
    "split": (lambda a: a.split([1, 3], 1)[1] * 2, (2, 4)),
    "chunk_cat": (lambda a: torch.cat(a.chunk(2, 1)[::-1], 1), (2, 4)),
    "unbind": (lambda a: a.unbind(1)[2] * 2, (2, 4)),
    "as_strided": (lambda a: a.as_strided((2, 2), (1, 2), 1) * 2, (3, 4)),
}


@pytest.mark.parametrize("name", sorted(VIEW_GRADS))
def test_view_gradient(name):
    fn, shape = VIEW_GRADS[name]
    check_op(fn, make(*shape, grad=True), grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_backward_ops_directly(dtype):
    grad = make(2, 3, dtype=dtype)
    aten = torch.ops.aten
    check_op(lambda g: aten.slice_backward(g, [2, 7], 1, 1, 7, 2), grad)
    check_op(lambda g: aten.select_backward(g, [2, 4, 3], 1, 2), grad)
    check_op(lambda g: aten.diagonal_backward(g, [2, 4, 3], 0, 1, 2), grad)
    check_op(lambda g: aten.unfold_backward(g.reshape(2, 3, 1), [2, 5], 1, 1, 2), grad)


def test_repeat_interleave_tensor():
    check_op(lambda r: torch.repeat_interleave(r), torch.tensor([1, 3, 0, 2]))
    check_op(lambda a, r: a.repeat_interleave(r, dim=0), make(3, 2, grad=True), torch.tensor([1, 0, 2]), grad=True)
    check_op(lambda a, r: a.repeat_interleave(r, dim=1, output_size=5), make(3, 2), torch.tensor([4, 1]))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad_negative_widths_crop(mode):
    x = torch.randn(1, 3, 4, 5).requires_grad_()
    check_op(lambda t: torch.nn.functional.pad(t, [-1, 2, 1, -2], mode=mode), x, grad=True)
    check_op(lambda t: torch.nn.functional.pad(t, [2, -1], mode=mode), x[0], grad=True)


def test_unfold_zero_dim_gradient():
    check_op(lambda t: t.unfold(0, 1, 1) * 2, torch.tensor(1.5).requires_grad_(), grad=True)


def test_flip_zero_dim():
    """A 0-dim tensor flips to itself along dimension 0 or -1, as on CPU."""
    check_op(lambda a: a.flip(0), torch.tensor(3.0, requires_grad=True), grad=True)
    check_op(lambda a: a.flip(-1), torch.tensor(7))
    check_op(lambda a: torch.flip(a, [0]), torch.tensor(True))
