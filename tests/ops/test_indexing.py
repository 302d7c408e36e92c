"""Indexing, gather/scatter, masks, sorting/selection, searching and counting against CPU PyTorch."""

import functools
import warnings

import pytest
import torch

from tests.helpers import random_tensor
from torch_tpu.testing.compare import check_op

# Data movement is dtype-blind past the element width; bfloat16 runs where values are combined or compared.
DTYPES = [torch.float32, torch.int64, torch.bool]
BF16_READS = ["index_mask", "gather", "masked_fill", "sort"]
BF16_WRITES = ["index_put_accumulate", "scatter_add", "index_add", "put_accumulate", "masked_scatter"]
MASK = torch.tensor([[True, False, True, False], [False, False, True, True], [True, True, False, False]])


# Each call its own generator seeded 0 (tests/helpers.py): the same tensor whatever ran before
make = functools.partial(random_tensor, seed=0)


def idx(*values):
    return torch.tensor(values)


def written(fn):
    """`fn` applied to a clone: a function of the inputs that returns the written tensor."""

    def run(x, *args):
        y = x.clone()
        fn(y, *args)
        return y

    return run


# name -> (function, extra tensor args after `x`, shape of x, shape of a second "values" input or None)
READS = {
    "index_int": (lambda x, i: x[i], [idx(0, 2, -1)], (3, 4)),
    "index_repeated": (lambda x, i: x[i], [idx([0, 2], [0, 0])], (3, 4)),
    "index_two": (lambda x, i, j: x[i, j], [idx(0, 2), idx(1, -1)], (3, 4)),
    "index_broadcast": (lambda x, i, j: x[i, j], [idx([0], [2]), idx(1, 3, 0)], (3, 4)),
    "index_after_slice": (lambda x, i: x[:, i], [idx(1, 0)], (3, 4, 5)),
    "index_separated": (lambda x, i, j: x[i, :, j], [idx(1, 0), idx(2, 3)], (3, 4, 5)),
    "index_ellipsis_none": (lambda x, i: x[None, ..., i], [idx(0, 0)], (3, 4)),
    "index_mask": (lambda x, m: x[m], [MASK], (3, 4)),
    "index_mask_rows": (lambda x, m: x[m[:, 0]], [MASK], (3, 4)),
    "index_mask_inner": (lambda x, m: x[:, m], [MASK], (2, 3, 4)),
    "index_mask_and_int": (lambda x, m, i: x[m[:, 0], i], [MASK, idx(3, 1)], (3, 4)),
    "index_select": (lambda x, i: x.index_select(1, i), [idx(3, 0, 0)], (3, 4)),
    "index_select_scalar": (lambda x, i: x.index_select(0, i), [torch.tensor(2)], (3, 4)),
    "gather": (lambda x, i: x.gather(1, i), [idx([0, 2], [1, 1], [3, 0])], (3, 4)),
    "gather_dim0": (lambda x, i: x.gather(0, i), [idx([0, 2, 1, 1], [1, 0, 2, 2])], (3, 4)),
    "take": (lambda x, i: x.take(i), [idx([0, -1], [5, 3])], (3, 4)),
    "masked_select": (lambda x, m: x.masked_select(m), [MASK], (3, 4)),
    "masked_select_broadcast": (lambda x, m: x.masked_select(m[1]), [MASK], (3, 4)),
    "masked_fill": (lambda x, m: x.masked_fill(m, 1), [MASK], (3, 4)),
    "masked_fill_broadcast": (lambda x, m: x.masked_fill(m[0], 0), [MASK], (3, 4)),
    "index_fill": (lambda x, i: x.index_fill(1, i, 1), [idx(3, 0)], (3, 4)),
    "sort": (lambda x: x.sort(stable=True, dim=1), [], (3, 4)),
    "sort_descending": (lambda x: x.sort(stable=True, dim=0, descending=True), [], (3, 4)),
    "argsort": (lambda x: x.argsort(stable=True, dim=1), [], (3, 4)),
}


@pytest.mark.parametrize(
    "name,dtype", [(n, d) for n in sorted(READS) for d in DTYPES] + [(n, torch.bfloat16) for n in BF16_READS]
)
def test_read(name, dtype):
    fn, extra, shape = READS[name]
    grad = dtype == torch.float32 and not name.startswith(("sort", "argsort"))
    check_op(fn, make(*shape, dtype=dtype, grad=grad), *extra, grad=grad)


WRITES = {
    "setitem_int": (written(lambda y, i, v: y.__setitem__(i, v)), [idx(0, 2)], (4,)),
    "setitem_pair": (written(lambda y, i, j, v: y.__setitem__((i, j), v)), [idx(0, 2), idx(3, 3)], (2,)),
    "setitem_mask_values": (written(lambda y, m, v: y.__setitem__(m, v)), [MASK], (6,)),
    "setitem_mask_rows": (written(lambda y, m, v: y.__setitem__(m[:, 0], v)), [MASK], (2, 4)),
    "setitem_mask_broadcast": (written(lambda y, m, v: y.__setitem__(m[:, 0], v)), [MASK], (4,)),
    "setitem_mask_inner": (written(lambda y, m, v: y.__setitem__((slice(None), m[1]), v)), [MASK], (3, 2)),
    "setitem_mask_and_int": (written(lambda y, m, i, v: y.__setitem__((m[:, 0], i), v)), [MASK, idx(1, 3)], (2,)),
    "index_put": (lambda x, i, v: x.index_put((i,), v), [idx(2, 0)], (2, 4)),
    "index_put_accumulate": (lambda x, i, v: x.index_put((i,), v, accumulate=True), [idx(0, 0, 2)], (3, 4)),
    "index_put_mask_accumulate": (lambda x, m, v: x.index_put((m,), v, accumulate=True), [MASK], (6,)),
    "index_put_": (written(lambda y, i, j, v: y.index_put_((i, j), v, accumulate=True)), [idx(0, 0), idx(1, 1)], (2,)),
    "scatter": (lambda x, i, v: x.scatter(1, i, v), [idx([0, 2], [1, 3], [3, 0])], (3, 2)),
    "scatter_add": (lambda x, i, v: x.scatter_add(1, i, v), [idx([0, 0], [1, 1], [3, 0])], (3, 2)),
    "index_add": (lambda x, i, v: x.index_add(0, i, v), [idx(0, 2, 0)], (3, 4)),
    "index_copy": (lambda x, i, v: x.index_copy(1, i, v), [idx(3, 0)], (3, 2)),
    "masked_scatter": (lambda x, m, v: x.masked_scatter(m, v), [MASK], (8,)),
    "masked_fill_tensor": (lambda x, m, v: x.masked_fill(m, v), [MASK], ()),
    "put": (lambda x, i, v: x.put(i, v), [idx(0, -1, 5)], (3,)),
    "put_accumulate": (lambda x, i, v: x.put(i, v, accumulate=True), [idx(0, 0, 5)], (3,)),
}


@pytest.mark.parametrize(
    "name,dtype", [(n, d) for n in sorted(WRITES) for d in DTYPES] + [(n, torch.bfloat16) for n in BF16_WRITES]
)
def test_write(name, dtype):
    fn, extra, values_shape = WRITES[name]
    accumulates = "accumulate" in name or name in ("index_put_", "scatter_add", "index_add")
    if dtype == torch.bool and accumulates and not name.startswith("index_put"):
        pytest.skip("accumulating into bool is not defined the same way on every backend")
    grad = dtype == torch.float32
    x = make(3, 4, dtype=dtype, grad=grad)
    values = make(*values_shape, dtype=dtype, grad=grad, seed=1)
    check_op(fn, x, *extra, values, grad=grad)


def test_in_place_writes_through_views():
    def build(x, i, m):
        y = x.clone()
        y[1:3] += 1
        y[:, i] = -1
        y[m] *= 2
        y[0][m[0]] = 5
        return y

    check_op(build, make(3, 4, grad=True), idx(0, 3), MASK, grad=True)


def test_setitem_scalar_mask_and_int():
    check_op(written(lambda y, m: y.__setitem__(m, 2.5)), make(3, 4), MASK)
    check_op(written(lambda y, i: y.__setitem__(i, 7)), make(3, 4, dtype=torch.int64), idx(2, 0))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    index = idx([0, 0, 2], [1, 1, 1], [3, 0, 0])
    grad = dtype == torch.float32 and reduce in ("sum", "mean")
    x, src = make(3, 4, dtype=dtype, grad=grad), make(3, 3, dtype=dtype, grad=grad, seed=1)
    check_op(lambda a, i, s: a.scatter_reduce(1, i, s, reduce, include_self=include_self), x, index, src, grad=grad)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_legacy_reduce(reduce):
    index = idx([0, 0], [1, 1], [3, 0])
    check_op(lambda a, i, s: a.scatter(1, i, s, reduce=reduce), make(3, 4), index, make(3, 2, seed=1))
    check_op(lambda a, i: a.scatter(1, i, 2.0, reduce=reduce), make(3, 4), index)
    check_op(lambda a, i: a.scatter(0, i, 1.5), make(3, 4), idx([0, 2], [1, 0]))


def test_nonzero():
    check_op(torch.nonzero, MASK)
    check_op(torch.nonzero, torch.tensor([[0.0, 1.0], [2.0, 0.0]]))
    check_op(torch.nonzero, torch.zeros(2, 3))
    check_op(lambda m: torch.nonzero(m, as_tuple=True), MASK)
    check_op(lambda m: torch.nonzero_static(m, size=8), MASK)
    check_op(lambda m: torch.nonzero_static(m, size=3, fill_value=-2), MASK)


SELECTIONS = {
    "topk": lambda x: x.topk(2, 1),
    "topk_smallest": lambda x: x.topk(2, 0, largest=False),
    "topk_all": lambda x: x.topk(4),
    "kthvalue": lambda x: x.kthvalue(2, 1),
    "kthvalue_keepdim": lambda x: x.kthvalue(3, 0, keepdim=True),
    "median": lambda x: x.median(),
    "median_dim": lambda x: x.median(1),
    "median_keepdim": lambda x: x.median(0, keepdim=True),
    "sort_default": lambda x: x.sort(),
    "msort": lambda x: torch.msort(x),
}


@pytest.mark.parametrize("name", sorted(SELECTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_selection(name, dtype):
    # distinct values: tie order is unspecified for the unstable variants
    x = torch.randperm(12, generator=torch.Generator().manual_seed(3)).reshape(3, 4).to(dtype) - 6
    grad = dtype == torch.float32
    check_op(SELECTIONS[name], x.requires_grad_(grad), grad=grad)


def test_median_nan_propagates():
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, 2.0, 1.0]])
    check_op(lambda a: a.median(1), x)
    check_op(lambda a: a.median(), x)


def test_nanmedian_skips_nan():
    x = torch.tensor([[1.0, float("nan"), 2.0, 5.0], [3.0, 2.0, float("nan"), float("nan")], [float("nan")] * 4])
    check_op(lambda a: a[:2].nanmedian(1), x)  # an all-NaN row's index is unspecified (CPU: nth_element's)
    check_op(lambda a: (a.nanmedian(1).values, a.nanmedian(0, keepdim=True).values), x)
    check_op(lambda a: (a.nanmedian(), a[:2].nanmedian()), x)
    check_op(lambda a: a.nanmedian(1), make(3, 5, grad=True), grad=True)
    check_op(lambda a: a.nanmedian(0), make(4, 3, dtype=torch.int64))


def test_sort_nan_and_ties():
    x = torch.tensor([3.0, 1.0, float("nan"), 1.0, 2.0, -float("inf")])
    check_op(lambda a: a.sort(stable=True), x)
    check_op(lambda a: a.sort(stable=True, descending=True), x)
    check_op(lambda a: a.topk(3), x)
    check_op(lambda a: a.sort(stable=True, dim=1), torch.tensor([[1, 0, 1, 0], [2, 2, 1, 1]]))


def test_keyword_arguments_key_their_executables():
    """Calls naming different keyword arguments with equal values ({stable, descending=True} vs {stable, dim=1};
    out_int32=True vs right=True) run different programs, not one cached executable."""
    x = torch.randn(3, 4, 5, requires_grad=True)
    check_op(lambda a: (a.sort(stable=False, descending=True), a.sort(1, False)), x, grad=True)
    sequence, values = torch.tensor([1.0, 3, 5, 7]), torch.tensor([0.0, 3, 7, 8])
    check_op(
        lambda s, v: (torch.searchsorted(s, v, out_int32=True), torch.searchsorted(s, v, right=True)), sequence, values
    )


def test_mode():
    check_op(lambda a: a.mode(1), torch.tensor([[1, 2, 2, 1, 3], [5, 5, 4, 4, 4]]))
    check_op(lambda a: a.mode(0, keepdim=True), torch.tensor([[1.0, 2, 2, 1], [5, 2, 4, 1], [5, 5, 4, 4]]))


UNIQUES = {
    "unique": (lambda a: torch.unique(a), torch.tensor([[3, 1], [3, 2]])),
    "unique_inverse_counts": (
        lambda a: torch.unique(a, return_inverse=True, return_counts=True),
        torch.tensor([[3, 1], [3, 2]]),
    ),
    "unique_float": (lambda a: torch.unique(a, return_counts=True), torch.tensor([0.5, -1.0, 0.5, 2.0])),
    "unique_dim": (
        lambda a: torch.unique(a, dim=0, return_inverse=True, return_counts=True),
        torch.tensor([[3, 1], [3, 2], [3, 1]]),
    ),
    "unique_dim1": (lambda a: torch.unique(a, dim=1), torch.tensor([[3, 1, 3], [2, 0, 2]])),
    "unique_consecutive": (
        lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True),
        torch.tensor([1, 1, 2, 2, 3, 1, 1]),
    ),
    "unique_consecutive_plain": (lambda a: torch.unique_consecutive(a), torch.tensor([[1, 1], [2, 1]])),
    "unique_consecutive_dim": (
        lambda a: torch.unique_consecutive(a, return_counts=True, dim=0),
        torch.tensor([[3, 1], [3, 1], [3, 2]]),
    ),
}


@pytest.mark.parametrize("name", sorted(UNIQUES))
def test_unique(name):
    fn, x = UNIQUES[name]
    check_op(fn, x)


SEARCHES = {
    "searchsorted": (lambda s, v: torch.searchsorted(s, v), [1.0, 3, 5, 7], [[0.0, 3, 6], [8, 1, 5]]),
    "searchsorted_right": (lambda s, v: torch.searchsorted(s, v, right=True), [1.0, 3, 5, 7], [0.0, 3, 7, 8]),
    "searchsorted_batched": (
        lambda s, v: torch.searchsorted(s, v, side="right"),
        [[1.0, 3, 5, 7], [0, 2, 4, 6]],
        [[0.0, 3, 6], [8, 2, 5]],
    ),
    "searchsorted_sorter": (lambda s, v: torch.searchsorted(s, v, sorter=torch.argsort(s)), [5.0, 1, 7, 3], [0.0, 3]),
    "searchsorted_int32": (lambda s, v: torch.searchsorted(s, v, out_int32=True), [1, 3, 5], [4, 0, 5]),
    "bucketize": (lambda s, v: torch.bucketize(v, s), [1.0, 3, 5, 7], [[0.0, 3, 6], [8, 1, 5]]),
    "bucketize_right": (lambda s, v: torch.bucketize(v, s, right=True), [1.0, 3, 5, 7], [0.0, 3, 7, 8]),
}


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_search(name):
    fn, sequence, values = SEARCHES[name]
    check_op(fn, torch.tensor(sequence), torch.tensor(values))


def test_search_scalar():
    check_op(lambda s: torch.searchsorted(s, 4), torch.tensor([1.0, 3, 5, 7]))
    check_op(lambda s: torch.bucketize(4, s, right=True), torch.tensor([1, 3, 4, 7]))


def test_histc_and_bincount():
    x = torch.randn(50, generator=torch.Generator().manual_seed(0))
    check_op(lambda a: torch.histc(a, 5), x)
    check_op(lambda a: torch.histc(a, 4, min=-1, max=1), x)
    check_op(lambda a: torch.histc(a, 3), torch.full((4,), 2.0))
    check_op(torch.bincount, torch.tensor([1, 3, 3, 0, 5]))
    check_op(lambda a: torch.bincount(a, minlength=8), torch.tensor([1, 3, 3]))
    check_op(lambda a, w: torch.bincount(a, w), torch.tensor([1, 3, 3, 0]), torch.rand(4))
    check_op(lambda a, w: torch.bincount(a, w), torch.tensor([1, 3, 3, 0]), torch.tensor([1, 2, 3, 4]))


def test_unsafe_index_ops():
    aten = torch.ops.aten
    x = make(3, 4, grad=True)
    check_op(lambda a, i: aten._unsafe_index(a, [None, i]), x, idx(3, 0, 3), grad=True)
    check_op(lambda a, i, j: aten._unsafe_index(a, [i, j]), x, idx([0], [2]), idx(1, 3), grad=True)
    check_op(lambda a, i, v: aten._unsafe_index_put(a, [i], v, True), x, idx(0, 0), make(2, 4, seed=1), grad=True)


def test_zero_dim_and_empty():
    scalar = torch.tensor(2.5)
    check_op(torch.nonzero, scalar)
    check_op(torch.nonzero, torch.tensor(0))
    check_op(torch.nonzero, torch.tensor([0.0, 1.5, 0.0]).bfloat16())
    check_op(lambda x, i: x.gather(0, i), scalar, torch.tensor(0))
    check_op(lambda x, i: x.index_select(0, i), scalar, idx(0))
    check_op(lambda x: x.topk(1), scalar)
    check_op(lambda x: x.median(0), scalar)
    check_op(lambda x: x.mode(), scalar)
    check_op(lambda x, m: x[m], make(3, 4), torch.zeros(3, 4, dtype=torch.bool))
    check_op(written(lambda y, m, v: y.__setitem__(m, v)), make(3, 2), idx(True, False, True), torch.tensor(5.0))


def _tensor(d, *values, dtype=None):
    return torch.tensor(values, device=d, dtype=dtype)


# Each entry: an out-of-range index that PyTorch's CPU kernels reject (x: arange(12.) as 3x4, d: its device).
OUT_OF_RANGE = {
    "index": lambda x, d: x.reshape(-1)[:5][_tensor(d, 10)],
    "index_negative": lambda x, d: x[:, _tensor(d, -5)],
    "index_second": lambda x, d: x[_tensor(d, 0), _tensor(d, 4)],
    "index_put": lambda x, d: x.index_put((_tensor(d, 3),), torch.tensor(1.0, device=d)),
    "index_put_accumulate": lambda x, d: x.index_put((_tensor(d, 3),), torch.tensor(1.0, device=d), accumulate=True),
    "setitem": lambda x, d: x.clone().__setitem__(_tensor(d, 5), 1.0),
    "index_select": lambda x, d: x.index_select(1, _tensor(d, 4)),
    "index_select_negative": lambda x, d: x.index_select(1, _tensor(d, -1)),
    "index_select_0d": lambda x, d: x[0, 0].index_select(0, _tensor(d, 1)),
    "gather": lambda x, d: x.gather(1, _tensor(d, [0, 4])),
    "gather_negative": lambda x, d: x.gather(1, _tensor(d, [-1])),
    "scatter": lambda x, d: x.scatter(1, _tensor(d, [4]), 1.0),
    "scatter_negative": lambda x, d: x.scatter(1, _tensor(d, [-1]), 1.0),
    "scatter_add": lambda x, d: x.scatter_add(0, _tensor(d, [3]), x),
    "scatter_reduce": lambda x, d: x.scatter_reduce(1, _tensor(d, [-1]), x, "amax"),
    "embedding": lambda x, d: torch.nn.functional.embedding(_tensor(d, [0, 3]), x),
    "embedding_negative": lambda x, d: torch.nn.functional.embedding(_tensor(d, -1), x),
    "embedding_bag": lambda x, d: torch.nn.functional.embedding_bag(_tensor(d, 1, 5), x, _tensor(d, 0)),
    "one_hot": lambda x, d: torch.nn.functional.one_hot(_tensor(d, 0, 3), num_classes=3),
    "one_hot_negative": lambda x, d: torch.nn.functional.one_hot(_tensor(d, 0, -1), num_classes=3),
    "one_hot_negative_no_classes": lambda x, d: torch.nn.functional.one_hot(_tensor(d, -1)),
    "one_hot_both": lambda x, d: torch.nn.functional.one_hot(_tensor(d, 3, -1), num_classes=3),
    "take": lambda x, d: x.take(_tensor(d, 12)),
    "take_negative": lambda x, d: x.take(_tensor(d, -13)),
    "put": lambda x, d: x.put(_tensor(d, 12), _tensor(d, 1.0)),
    "index_add": lambda x, d: x.index_add(0, _tensor(d, 3), torch.ones(1, 4, device=d)),
    "index_copy": lambda x, d: x.index_copy(0, _tensor(d, 3), torch.ones(1, 4, device=d)),
    "index_fill": lambda x, d: x.index_fill(1, _tensor(d, -5), 1.0),
    "index_reduce": lambda x, d: x.index_reduce(0, _tensor(d, 3), torch.ones(1, 4, device=d), "prod"),
}
MODES = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}


def _cpu_error(fn) -> Exception:
    with pytest.raises((IndexError, RuntimeError)) as caught:
        fn(torch.arange(12.0).reshape(3, 4), "cpu")
    return caught.value


@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_out_of_range_index_raises_as_on_cpu(name, mode):
    """An out-of-range index raises CPU's error class and message, at the latest at the next synchronisation."""
    expected = _cpu_error(OUT_OF_RANGE[name])
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    with torch.tpu.set_eager_mode(MODES[mode]):
        with pytest.raises((IndexError, RuntimeError)) as caught:
            OUT_OF_RANGE[name](x, "tpu")
            torch.tpu.synchronize()
    assert type(caught.value) is type(expected), (caught.value, expected)
    assert str(caught.value) == str(expected).splitlines()[0]


# Ops whose every output is empty, with indices CPU checks all the same (x: an empty or zero-width tensor).
EMPTY_OUTPUT_ERRORS = {
    "index_select": lambda d: torch.zeros(3, 0, device=d).index_select(0, _tensor(d, 5)),
    "index_select_negative": lambda d: torch.zeros(3, 0, device=d).index_select(0, _tensor(d, -1)),
    "scatter": lambda d: torch.zeros(0, device=d).scatter(0, _tensor(d, 5), 1.0),
    "scatter_add": lambda d: torch.zeros(0, device=d).scatter_add(0, _tensor(d, 5), _tensor(d, 1.0)),
    "scatter_reduce": lambda d: torch.zeros(0, device=d).scatter_reduce(0, _tensor(d, 5), _tensor(d, 1.0), "amax"),
    "index_reduce": lambda d: torch.zeros(3, 0, device=d).index_reduce(
        0, _tensor(d, 5), torch.zeros(1, 0, device=d), "prod"
    ),
    "put": lambda d: torch.zeros(0, device=d).put(_tensor(d, 0), _tensor(d, 1.0)),
    "one_hot_zero_classes": lambda d: torch.nn.functional.one_hot(_tensor(d, 0, 1), num_classes=0),
    "one_hot_empty_zero_classes": lambda d: torch.nn.functional.one_hot(torch.zeros(0, dtype=torch.long, device=d), 0),
    "one_hot_empty_no_classes": lambda d: torch.nn.functional.one_hot(torch.zeros(0, dtype=torch.long, device=d)),
}
# ... and the same ops where CPU checks nothing, or an empty index (an index op checks only what it reads).
EMPTY_OUTPUT_VALUES = {
    "index": lambda d: torch.zeros(3, 0, device=d)[_tensor(d, 5)],
    "index_add": lambda d: torch.zeros(3, 0, device=d).index_add(0, _tensor(d, 5), torch.zeros(1, 0, device=d)),
    "index_select": lambda d: torch.zeros(3, 0, device=d).index_select(0, _tensor(d, 2)),
    "scatter_empty_index": lambda d: torch.zeros(3, 0, device=d).scatter(
        0, torch.zeros(1, 0, dtype=torch.long, device=d), 1.0
    ),
    "scatter": lambda d: torch.zeros(0, device=d).scatter(0, torch.zeros(0, dtype=torch.long, device=d), 1.0),
    "one_hot": lambda d: torch.nn.functional.one_hot(torch.zeros(0, 2, dtype=torch.long, device=d), num_classes=3),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(EMPTY_OUTPUT_ERRORS))
def test_empty_output_ops_check_indices_as_on_cpu(name, mode):
    """An op whose outputs are all empty still makes the checks CPU makes: CPU's error class and message."""
    with pytest.raises((IndexError, RuntimeError)) as cpu:
        EMPTY_OUTPUT_ERRORS[name]("cpu")
    with torch.tpu.set_eager_mode(MODES[mode]):
        with pytest.raises((IndexError, RuntimeError)) as caught:
            EMPTY_OUTPUT_ERRORS[name]("tpu")
            torch.tpu.synchronize()
    assert type(caught.value) is type(cpu.value), (caught.value, cpu.value)
    assert str(caught.value) == str(cpu.value).splitlines()[0]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(EMPTY_OUTPUT_VALUES))
def test_empty_output_ops_check_nothing_more_than_cpu(name, mode):
    with torch.tpu.set_eager_mode(MODES[mode]):
        ours = EMPTY_OUTPUT_VALUES[name]("tpu")
        torch.tpu.synchronize()
    expected = EMPTY_OUTPUT_VALUES[name]("cpu")
    assert ours.shape == expected.shape and ours.dtype == expected.dtype


def test_in_range_indices_at_the_edges_pass_the_checks():
    """The last valid index and, where CPU counts them from the end, the most negative one."""
    x = torch.arange(12.0).reshape(3, 4)
    cases = [
        lambda a, d: a[_tensor(d, -3, 2)],
        lambda a, d: a[:, _tensor(d, -4, 3)],
        lambda a, d: a.gather(1, _tensor(d, [3, 0])),
        lambda a, d: a.take(_tensor(d, -12, 11)),
        lambda a, d: a.index_fill(1, _tensor(d, -4), 1.0),
        lambda a, d: torch.nn.functional.embedding(_tensor(d, 2, 0), a),
        lambda a, d: torch.nn.functional.one_hot(_tensor(d, 0, 2), num_classes=3),
        lambda a, d: a.index_put((_tensor(d, -3, 2),), torch.tensor(1.0, device=d), accumulate=True),
    ]
    for case in cases:
        torch.testing.assert_close(case(x.to("tpu"), "tpu").cpu(), case(x, "cpu"), rtol=0, atol=0)


# Writes through a boolean mask whose values do not fit the masked slots, and masks of the wrong shape.
MASK_SHAPE_ERRORS = {
    "values_short": lambda d: torch.arange(4.0, device=d).__setitem__(
        torch.arange(4.0, device=d) > -1, _tensor(d, 7.0, 8.0, 9.0)
    ),
    "values_long": lambda d: torch.arange(4.0, device=d).__setitem__(
        torch.arange(4.0, device=d) > 1, _tensor(d, 7.0, 8.0, 9.0)
    ),
    "values_none_selected": lambda d: torch.arange(4.0, device=d).__setitem__(
        torch.arange(4.0, device=d) > 9, _tensor(d, 7.0, 8.0)
    ),
    "values_empty": lambda d: torch.arange(4.0, device=d).__setitem__(
        torch.arange(4.0, device=d) > 1, torch.ones(0, device=d)
    ),
    "values_inner_dim": lambda d: torch.zeros(2, 3, 4, device=d).__setitem__(
        (slice(None), torch.ones(3, dtype=torch.bool, device=d)), torch.ones(2, 3, 3, device=d)
    ),
    "values_rows_inner": lambda d: torch.zeros(2, 3, 4, device=d).__setitem__(
        (slice(None), _tensor(d, True, False, True)), torch.ones(2, 3, 4, device=d)
    ),
    "values_accumulate": lambda d: torch.arange(4.0, device=d).index_put_(
        (torch.arange(4.0, device=d) > 0,), _tensor(d, 1.0, 2.0), accumulate=True
    ),
    "mask_short": lambda d: torch.ones(3, device=d)[_tensor(d, True, False)],
    "mask_inner": lambda d: torch.zeros(2, 3, 4, device=d)[:, torch.ones(3, 5, dtype=torch.bool, device=d)],
    "mask_write_short": lambda d: torch.ones(3, device=d).__setitem__(_tensor(d, True, False), 1.0),
    "mask_and_int": lambda d: torch.zeros(2, 3, device=d)[_tensor(d, True, False, True), _tensor(d, 0)],
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(MASK_SHAPE_ERRORS))
def test_mask_shape_errors_raise_as_on_cpu(name, mode):
    with pytest.raises((IndexError, RuntimeError)) as expected:
        MASK_SHAPE_ERRORS[name]("cpu")
    with torch.tpu.set_eager_mode(MODES[mode]):
        with pytest.raises((IndexError, RuntimeError)) as caught:
            MASK_SHAPE_ERRORS[name]("tpu")
            torch.tpu.synchronize()
    assert type(caught.value) is type(expected.value)
    assert str(caught.value) == str(expected.value).splitlines()[0]


def test_mask_writes_that_fit_match_cpu():
    """Values broadcast over the masked slots: one row, a row per True element, leading ones."""
    mask = torch.tensor([True, False, True])
    check_op(written(lambda y, m, v: y.__setitem__((slice(None), m), v)), make(2, 3, 4), mask, make(2, 2, 4, seed=1))
    check_op(written(lambda y, m, v: y.__setitem__((slice(None), m), v)), make(2, 3, 4), mask, make(1, 2, 1, 4, seed=1))
    check_op(written(lambda y, m, v: y.__setitem__(m, v)), make(3, 4), mask, make(1, 4, seed=1))
    check_op(
        written(lambda y, m, v: y.__setitem__(m, v)), make(3, 4), torch.zeros(3, dtype=torch.bool), make(4, seed=1)
    )


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8 is now deprecated")
def test_uint8_mask_indexes_as_bool():
    """CPU reads a uint8 index as a bool mask (any nonzero value selects), alone or beside other indices."""
    mask = torch.tensor([[1, 0, 2, 0], [0, 0, 1, 1], [1, 255, 0, 0]], dtype=torch.uint8)
    check_op(lambda x, m: x[m], make(3, 4), mask)
    check_op(lambda x, m: x[:, m[0]], make(3, 4), mask)
    check_op(lambda x, m: x[m[1], 1:], make(4, 3), mask)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        check_op(lambda x, m: (x * 2)[m] + 1, make(3, 4), mask)


UINT8_MASK = torch.tensor([1, 0, 2, 0, 255], dtype=torch.uint8)
UINT8_INDEXING = {
    "getitem": lambda x, m: x[m],
    "getitem_beside_slice": lambda x, m: x[None, m],
    "setitem_values": written(lambda y, m: y.__setitem__(m, torch.arange(3.0, device=y.device))),
    "index_put_accumulate": written(lambda y, m: y.index_put_((m,), torch.ones(3, device=y.device), accumulate=True)),
}


def _warned(fn, *args):
    """`fn(*args)` and the warnings it gives, as (category, message without CPU's "Triggered internally at")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [(w.category, str(w.message).partition(" (Triggered internally")[0]) for w in caught]


@pytest.mark.parametrize("name", sorted(UINT8_INDEXING))
def test_uint8_mask_warns_as_on_cpu(name):
    """CPU's deprecation warning for a uint8 mask, which it still reads as a bool one."""
    x = make(5)
    expected, expected_warnings = _warned(UINT8_INDEXING[name], x, UINT8_MASK)
    actual, actual_warnings = _warned(UINT8_INDEXING[name], x.to("tpu"), UINT8_MASK.to("tpu"))
    assert expected_warnings and actual_warnings == expected_warnings
    torch.testing.assert_close(actual.cpu(), expected)


def test_uint8_where_condition_warns_and_selects():
    """CPU reads a uint8 condition as bool, with a deprecation warning (given once a process: not asked of CPU)."""
    x, y = make(5), make(5, seed=1)
    condition = UINT8_MASK.reshape(5, 1)
    actual, actual_warnings = _warned(torch.where, condition.to("tpu"), x.to("tpu"), y.to("tpu"))
    assert [category for category, _ in actual_warnings] == [UserWarning]
    assert actual_warnings[0][1].startswith("where received a uint8 condition tensor. This behavior is deprecated")
    torch.testing.assert_close(actual.cpu(), torch.where(condition.bool(), x, y))


UINT8_REFUSED = {
    "masked_select": lambda x, m: x.masked_select(m),
    "masked_scatter": lambda x, m: x.masked_scatter(m, x),
}


@pytest.mark.parametrize("name", sorted(UINT8_REFUSED))
def test_uint8_masks_refused_as_on_cpu(name):
    """masked_select and masked_scatter refuse a uint8 mask, as on CPU (masked_scatter with a warning first)."""
    x = make(5)
    with warnings.catch_warnings(record=True) as expected_warnings:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError) as expected:
            UINT8_REFUSED[name](x, UINT8_MASK)
    with warnings.catch_warnings(record=True) as actual_warnings:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError) as actual:
            UINT8_REFUSED[name](x.to("tpu"), UINT8_MASK.to("tpu"))
    assert str(actual.value) == str(expected.value)
    assert [str(w.message) for w in actual_warnings] == [str(w.message) for w in expected_warnings]


def test_boolean_index_put_accumulates():
    """A lone mask (the no-sync path), a mask beside an integer index, broadcast values, gradients."""
    mask = torch.tensor([True, False, True, True])
    accumulate = written(lambda y, m, v: y.index_put_((m,), v, accumulate=True))
    check_op(accumulate, make(4, grad=True), mask, make(3, seed=1, grad=True), grad=True)
    check_op(accumulate, make(4, 2, grad=True), mask, make(3, 2, seed=1, grad=True), grad=True)
    check_op(accumulate, make(4, 2), mask, make(2, seed=1))
    check_op(accumulate, make(4, dtype=torch.int64), mask, idx(1, 2, 3))
    check_op(
        lambda x, m, i, v: x.index_put((m, i), v, accumulate=True), make(4, 2), mask, idx(1, 0, 1), make(3, seed=1)
    )


DTYPE_MISMATCHES = {
    "setitem_list": lambda d: torch.zeros(3, 2, device=d).__setitem__(
        (slice(None), [1]), _tensor(d, 1, 2, 3, dtype=torch.int32).unsqueeze(-1)
    ),
    "setitem_mask": lambda d: torch.zeros(3, device=d).__setitem__(
        _tensor(d, True, False, True), _tensor(d, 1, 2, dtype=torch.int64)
    ),
    "index_put": lambda d: torch.zeros(3, device=d).index_put((_tensor(d, 0, 2),), _tensor(d, True, False)),
    "index_put_accumulate": lambda d: torch.zeros(3, dtype=torch.int64, device=d).index_put_(
        (_tensor(d, 0, 0),), _tensor(d, 1.0, 2.0), accumulate=True
    ),
    "index_put_mask_accumulate": lambda d: torch.zeros(3, dtype=torch.bfloat16, device=d).index_put_(
        (_tensor(d, True, False, True),), _tensor(d, 1.0, 2.0), accumulate=True
    ),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(DTYPE_MISMATCHES))
def test_index_put_of_another_dtype_raises_as_on_cpu(name, mode):
    """index_put (advanced-index assignment) takes values of the tensor's own dtype only, as on CPU."""
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match") as expected:
        DTYPE_MISMATCHES[name]("cpu")
    with torch.tpu.set_eager_mode(MODES[mode]):
        with pytest.raises(RuntimeError) as caught:
            DTYPE_MISMATCHES[name]("tpu")
            torch.tpu.synchronize()
    assert str(caught.value) == str(expected.value)


def test_slice_assignment_of_another_dtype_casts():
    """A basic-index assignment is a copy_, which casts (unlike index_put)."""
    check_op(written(lambda y, v: y[:, 1:2].copy_(v)), make(3, 2), make(3, 1, dtype=torch.int32))
    check_op(
        written(lambda y, v: y.__setitem__((slice(None), slice(1, 2)), v)), make(3, 2), make(3, 1, dtype=torch.int32)
    )


def test_bool_index_put_accumulates_as_or():
    """Accumulating into bool (repeated indices, masks) is a logical or, as on CPU."""
    accumulate = written(lambda y, i, v: y.index_put_((i,), v, accumulate=True))
    values = torch.tensor([True, False, True, False])
    check_op(accumulate, torch.tensor([False, False, True]), idx(0, 0, 1, 2), values)
    check_op(accumulate, torch.tensor([False, True, False, True]), torch.tensor([True, False, True, True]), values[:3])
    check_op(
        written(lambda y, i, j, v: y.index_put_((i, j), v, accumulate=True)),
        make(3, 4, dtype=torch.bool),
        idx(0, 0, 2),
        idx(1, 1, 3),
        values[:3],
    )


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(reduce, include_self, dtype):
    grad = dtype == torch.float32
    x, source = make(3, 4, dtype=dtype, grad=grad), make(3, 3, dtype=dtype, grad=grad, seed=1)
    check_op(
        lambda a, i, s: a.index_reduce(1, i, s, reduce, include_self=include_self), x, idx(0, 2, 0), source, grad=grad
    )
    check_op(lambda a, i, s: a.index_reduce(0, i, s, reduce), make(dtype=dtype), idx(0), make(dtype=dtype, seed=2))


def test_index_fill_tensor_value_gradient():
    value = torch.tensor(1.5).requires_grad_()
    check_op(lambda a, i, v: a.index_fill(1, i, v), make(3, 4, grad=True), idx(3, 0, 3), value, grad=True)


def test_empty_indices():
    check_op(lambda x, i: x.gather(0, i), make(5, grad=True), torch.zeros(2, 0, dtype=torch.int64), grad=True)
    check_op(lambda x: torch.nonzero_static(x, size=2), make(3, 0, 2))
