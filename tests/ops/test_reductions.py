"""Reductions and scans on `tpu` against CPU PyTorch."""

import math

import pytest
import torch

from tests.helpers import random_tensor
from torch_tpu.testing.compare import check_op, has_derivative

FLOAT, BF16, INT, BOOL = torch.float32, torch.bfloat16, torch.int64, torch.bool


def make(shape, dtype, grad=False):
    """A random tensor (tests/helpers.py): integers in [-4, 4]; gradients for float32 only."""
    return random_tensor(*shape, dtype=dtype, grad=grad and dtype == FLOAT, low=-4, high=4)


# (id, fn, dtypes)
REDUCTIONS = [
    ("sum", lambda x: torch.sum(x), (FLOAT, BF16, INT, BOOL)),
    ("sum_dim", lambda x: torch.sum(x, 1), (FLOAT, BF16, INT, BOOL)),
    ("sum_dims_keepdim", lambda x: torch.sum(x, (0, 2), keepdim=True), (FLOAT, BF16, INT)),
    ("sum_empty_dims", lambda x: torch.sum(x, []), (FLOAT, INT)),
    ("sum_dtype", lambda x: torch.sum(x, -1, dtype=torch.float64), (FLOAT, BF16, INT)),
    ("nansum", lambda x: torch.nansum(torch.where(x > 1, math.nan, x), 1), (FLOAT, BF16)),
    ("mean", lambda x: torch.mean(x), (FLOAT, BF16)),
    ("mean_dim", lambda x: torch.mean(x, (1, -1), keepdim=True), (FLOAT, BF16)),
    ("mean_dtype", lambda x: torch.mean(x, 0, dtype=torch.float64), (FLOAT, INT)),
    ("prod", lambda x: torch.prod(x), (FLOAT, BF16, INT, BOOL)),
    ("prod_dim", lambda x: torch.prod(x, 1, keepdim=True), (FLOAT, BF16, INT)),
    ("amax", lambda x: torch.amax(x, (0, 2)), (FLOAT, BF16, INT, BOOL)),
    ("amin", lambda x: torch.amin(x, -1, keepdim=True), (FLOAT, BF16, INT, BOOL)),
    ("amax_all", lambda x: torch.amax(x), (FLOAT, INT)),
    ("max", lambda x: torch.max(x), (FLOAT, BF16, INT, BOOL)),
    ("min", lambda x: torch.min(x), (FLOAT, BF16, INT, BOOL)),
    ("max_dim", lambda x: torch.max(x, 1), (FLOAT, BF16, INT, BOOL)),
    ("min_dim_keepdim", lambda x: torch.min(x, -1, keepdim=True), (FLOAT, BF16, INT)),
    ("argmax", lambda x: torch.argmax(x), (FLOAT, BF16, INT)),
    ("argmax_dim", lambda x: torch.argmax(x, 1, keepdim=True), (FLOAT, INT)),
    ("argmin_dim", lambda x: torch.argmin(x, 0), (FLOAT, BF16, INT)),
    ("argmin_keepdim", lambda x: torch.argmin(x, keepdim=True), (FLOAT, INT)),
    ("aminmax", lambda x: torch.aminmax(x), (FLOAT, BF16, INT)),
    ("aminmax_dim", lambda x: torch.aminmax(x, dim=1, keepdim=True), (FLOAT, INT)),
    ("var", lambda x: torch.var(x), (FLOAT, BF16)),
    ("var_dim", lambda x: torch.var(x, 1, correction=0, keepdim=True), (FLOAT, BF16)),
    ("std", lambda x: torch.std(x, (0, 2)), (FLOAT, BF16)),
    ("std_correction", lambda x: torch.std(x, -1, correction=2), (FLOAT,)),
    ("var_mean", lambda x: torch.var_mean(x, 1), (FLOAT, BF16)),
    ("std_mean", lambda x: torch.std_mean(x, (0, 1), correction=0, keepdim=True), (FLOAT, BF16)),
    ("any", lambda x: torch.any(x), (FLOAT, INT, BOOL)),
    ("any_dim", lambda x: torch.any(x, 1), (FLOAT, INT, BOOL)),
    ("any_dims", lambda x: torch.any(x, (0, 2), keepdim=True), (FLOAT, BOOL)),
    ("all", lambda x: torch.all(x), (FLOAT, INT, BOOL)),
    ("all_dim", lambda x: torch.all(x, -1), (FLOAT, INT, BOOL)),
    ("all_dims", lambda x: torch.all(x, (0, 1)), (INT, BOOL)),
    ("count_nonzero", lambda x: torch.count_nonzero(x), (FLOAT, INT, BOOL)),
    ("count_nonzero_dims", lambda x: torch.count_nonzero(x, (0, 2)), (FLOAT, INT, BOOL)),
    ("logsumexp", lambda x: torch.logsumexp(x, 1), (FLOAT, BF16, INT)),
    ("logsumexp_dims", lambda x: torch.logsumexp(x, (0, 2), keepdim=True), (FLOAT,)),
    ("vector_norm", lambda x: torch.linalg.vector_norm(x), (FLOAT, BF16)),
    ("vector_norm_1", lambda x: torch.linalg.vector_norm(x, 1, dim=1), (FLOAT, BF16)),
    ("vector_norm_inf", lambda x: torch.linalg.vector_norm(x, math.inf, dim=(0, 2), keepdim=True), (FLOAT, BF16)),
    ("vector_norm_ninf", lambda x: torch.linalg.vector_norm(x, -math.inf, dim=-1), (FLOAT,)),
    ("vector_norm_0", lambda x: torch.linalg.vector_norm(x, 0, dim=-1), (FLOAT,)),
    ("vector_norm_3", lambda x: torch.linalg.vector_norm(x, 3.0, dim=1), (FLOAT, BF16)),
    ("vector_norm_dtype", lambda x: torch.linalg.vector_norm(x, dtype=torch.float64), (FLOAT,)),
    ("norm", lambda x: torch.norm(x), (FLOAT, BF16)),
    ("norm_p1", lambda x: x.norm(1), (FLOAT,)),
    ("norm_dim", lambda x: torch.norm(x, 2, dim=1), (FLOAT, BF16)),
    ("norm_dim_keepdim", lambda x: torch.norm(x, 1.5, dim=(0, 2), keepdim=True), (FLOAT,)),
    ("norm_dtype", lambda x: torch.norm(x, 2, dim=1, dtype=torch.float64), (FLOAT,)),
    ("cumsum", lambda x: torch.cumsum(x, 1), (FLOAT, BF16, INT, BOOL)),
    ("cumsum_dtype", lambda x: torch.cumsum(x, -1, dtype=torch.float64), (FLOAT, INT)),
    ("cumprod", lambda x: torch.cumprod(x, 2), (FLOAT, BF16, INT)),
    ("cummax", lambda x: torch.cummax(x, 1), (FLOAT, BF16, INT, BOOL)),
    ("cummin", lambda x: torch.cummin(x, -1), (FLOAT, BF16, INT)),
    ("logcumsumexp", lambda x: torch.logcumsumexp(x, 1), (FLOAT, BF16)),
]


_NOT_DIFFERENTIABLE = {
    fn for name, fn, _ in REDUCTIONS if name.startswith("aminmax") and not has_derivative(fn, (2, 3, 5))
}


@pytest.mark.parametrize(
    "fn, dtype",
    [pytest.param(fn, dtype, id=f"{name}-{str(dtype)[6:]}") for name, fn, dtypes in REDUCTIONS for dtype in dtypes],
)
def test_reduction(fn, dtype):
    x = make((2, 3, 5), dtype, grad=fn not in _NOT_DIFFERENTIABLE)
    check_op(fn, x, grad=x.requires_grad)


def test_scalar_input():
    x = torch.tensor(1.5, requires_grad=True)
    check_op(
        lambda t: (
            torch.sum(t, 0),
            torch.amax(t, -1),
            torch.max(t, 0),
            torch.argmax(t, 0, keepdim=True),
            torch.cumsum(t, 0),
            torch.cummax(t, 0),
            torch.logcumsumexp(t, 0),
            torch.var(t, 0, correction=0),
            torch.logsumexp(t, 0),
            torch.linalg.vector_norm(t, dim=0),
            torch.prod(t, 0),
            torch.mean(t, 0),
        ),
        x,
        grad=True,
    )


def test_ties_pick_first():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, 4.0, -5.0]])
    check_op(lambda t: (torch.max(t, 1), torch.min(t, 1), torch.argmax(t, 1), torch.argmin(t), torch.argmax(t)), x)


def test_cummax_ties_pick_last():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 1.0, 2.0, 1.0]])
    check_op(lambda t: (torch.cummax(t, 1), torch.cummin(t, 1)), x)


def test_nan_handling():
    x = torch.tensor([[1.0, math.nan, 3.0, math.nan], [2.0, 5.0, -1.0, 0.0]])
    check_op(
        lambda t: (
            torch.max(t, 1),
            torch.min(t, 1),
            torch.argmax(t, 1),
            torch.argmin(t, 1),
            torch.amax(t, 1),
            torch.amin(t, 1),
            torch.max(t),
            torch.cummax(t, 1),
            torch.cummin(t, 1),
            torch.aminmax(t, dim=1),
        ),
        x,
    )


def test_prod_with_zeros_grad():
    x = torch.tensor([[1.5, 0.0, 2.0], [0.0, 3.0, 0.0], [1.0, -2.0, 0.5]], requires_grad=True)
    check_op(lambda t: (torch.prod(t, 1), torch.prod(t), torch.cumprod(t, 1)), x, grad=True)


def test_infinities():
    x = torch.tensor([[-math.inf, -math.inf], [math.inf, 1.0], [0.0, -math.inf]])
    check_op(lambda t: (torch.logsumexp(t, 1), torch.logcumsumexp(t, 1), torch.linalg.vector_norm(t, dim=1)), x)


def test_zero_size():
    x = torch.randn(0, 3)
    check_op(
        lambda t: (
            torch.sum(t),
            torch.sum(t, 0),
            torch.prod(t, 0),
            torch.mean(t, 0),
            torch.amax(t, 1),
            torch.max(t, 1),
            torch.any(t, 0),
            torch.all(t),
            torch.cumsum(t, 0),
            torch.logsumexp(t, 0),
            torch.linalg.vector_norm(t, dim=0),
            torch.var(t, 1),
            torch.count_nonzero(t, 0),
        ),
        x,
    )


@pytest.mark.parametrize("fn", [torch.amax, torch.max, torch.min, torch.argmax, torch.argmin, torch.aminmax])
def test_zero_size_raises(fn):
    with pytest.raises((RuntimeError, IndexError)):
        fn(torch.empty(0, 3, device="tpu"))


def test_int_promotion():
    x = torch.randint(-100, 100, (3, 4), dtype=torch.int8)
    check_op(lambda t: (torch.sum(t), torch.sum(t, 1), torch.prod(t, 0), torch.cumsum(t, 1), torch.cumprod(t, 0)), x)


def test_uint8_any_all():
    x = torch.randint(0, 3, (3, 4), dtype=torch.uint8)
    check_op(lambda t: (torch.any(t, 1), torch.all(t), torch.count_nonzero(t, 1)), x)


def test_mean_of_ints_raises():
    with pytest.raises(RuntimeError):
        torch.mean(torch.arange(4).to("tpu"))


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("fn", [torch.std, torch.var, lambda t: t.std(1), lambda t: t.var(0, keepdim=True)])
def test_std_var_of_integers_raise_as_cpu(fn, dtype):
    x = make((3, 4), dtype)
    with pytest.raises(RuntimeError) as cpu:
        fn(x)
    for fused in (False, True):
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE if fused else torch.tpu.EagerMode.DEFER_NEVER):
            with pytest.raises(RuntimeError) as tpu:
                fn(x.to("tpu")).cpu()
            assert str(tpu.value) == str(cpu.value)  # (JAX adds a note on its traceback: not the message)


def test_out_and_inplace_variants():
    x = torch.randn(3, 4)
    out = torch.empty(3, device="tpu")
    values, indices = torch.empty(0, device="tpu"), torch.empty(0, dtype=torch.int64, device="tpu")
    torch.sum(x.to("tpu"), 1, out=out)
    torch.max(x.to("tpu"), 1, out=(values, indices))
    check_op(lambda t: t.clone().cumsum_(1), x)
    expected = torch.max(x, 1)
    torch.testing.assert_close(out.cpu(), x.sum(1))
    torch.testing.assert_close((values.cpu(), indices.cpu()), tuple(expected))


@pytest.mark.parametrize("dtype", [FLOAT, BF16, INT, BOOL])
def test_hash_tensor(dtype):
    x = make((3, 4, 2), dtype)
    check_op(
        lambda t: (torch.hash_tensor(t), torch.hash_tensor(t, dim=1), torch.hash_tensor(t, (0, 2), keepdim=True)), x
    )


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce(reduce):
    aten = torch.ops.aten
    data = make((6, 3), FLOAT, grad=True)
    lengths, offsets = torch.tensor([2, 0, 3, 1]), torch.tensor([0, 2, 2, 5, 6])
    check_op(lambda d, n: aten.segment_reduce(d, reduce, lengths=n), data, lengths, grad=True)
    check_op(lambda d, o: aten.segment_reduce(d, reduce, offsets=o, initial=1.5), data, offsets, grad=True)
    batched = make((2, 6), FLOAT, grad=True)
    check_op(
        lambda d, n: aten.segment_reduce(d, reduce, lengths=n, axis=1),
        batched,
        torch.tensor([[2, 4], [6, 0]]),
        grad=True,
    )


# Reductions of empty tensors: CPU's value (nan, 0, 1, -inf, empty) or its error (class and message).
EMPTY_REDUCTIONS = {
    "median": torch.median,
    "nanmedian": torch.nanmedian,
    "median_dim0": lambda x: torch.median(x, 0),
    "median_dim1": lambda x: torch.median(x, -1),
    "nanmedian_dim0": lambda x: torch.nanmedian(x, 0),
    "mode": lambda x: torch.mode(x, 0),
    "mode_nonempty_dim": lambda x: torch.mode(x, -1),
    "mean": torch.mean,
    "mean_dim0": lambda x: x.mean(0),
    "var": torch.var,
    "var_dim0": lambda x: x.var(0),
    "std": torch.std,
    "var_mean_dim0": lambda x: torch.var_mean(x, 0),
    "prod": torch.prod,
    "prod_dim0": lambda x: x.prod(0),
    "sum": torch.sum,
    "nansum": torch.nansum,
    "logsumexp_dim0": lambda x: torch.logsumexp(x, 0),
    "norm": torch.norm,
    "norm_dim0": lambda x: torch.norm(x, dim=0),
    "max": torch.max,
    "min": torch.min,
    "max_dim0": lambda x: torch.max(x, 0),
    "min_dim0": lambda x: torch.min(x, 0),
    "max_nonempty_dim": lambda x: torch.max(x, -1),
    "quantile": lambda x: torch.quantile(x, 0.5),
}


def _outcome(fn, x):
    try:
        result = fn(x)
    except Exception as error:  # the error itself is the outcome compared
        return type(error), str(error)
    return tuple(t.cpu() for t in (result if isinstance(result, tuple) else (result,)))


@pytest.mark.parametrize("shape", [(0,), (0, 3)], ids=str)
@pytest.mark.parametrize("name", EMPTY_REDUCTIONS)
def test_empty_reductions_follow_cpu(name, shape):
    fn = EMPTY_REDUCTIONS[name]
    expected, actual = _outcome(fn, torch.zeros(shape)), _outcome(fn, torch.zeros(shape, device="tpu"))
    if isinstance(expected[0], type):
        assert actual == expected
    else:
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
