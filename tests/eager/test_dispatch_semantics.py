"""Semantics the eager dispatcher owes every op, against CPU: the trace context in every cache key, out= and
in-place writes through views, overlap and out= dtype checks, PyTorch's errors for bad arguments."""

import contextlib

import pytest
import torch

import torch_tpu
from torch_tpu.eager.cache import executables
from torch_tpu.runtime import platform, trace_context

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

MODES = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _float_scalar_then_sqrt(device):
    """x + 0.1 and sqrt(x) of an int tensor: both take the default dtype, which Python floats do."""
    x = torch.arange(3, device=device)
    return [(x + 0.1).cpu(), torch.sqrt(x).cpu()]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("first,second", [(torch.float32, torch.float64), (torch.float64, torch.float32)])
def test_results_follow_the_default_dtype_set_between_calls(mode, first, second):
    with torch.tpu.set_eager_mode(MODES[mode]):
        for dtype in (first, second):
            with default_dtype(dtype):
                expected = _float_scalar_then_sqrt("cpu")
                got = _float_scalar_then_sqrt("tpu")
            assert [g.dtype for g in got] == [e.dtype for e in expected] == [dtype, dtype]
            # 0.1 in the default dtype, as on CPU: exact, but a TPU's emulated float64 addition is not correctly
            # rounded (measured 3 ulp on a v5e); taken in float32 it would be off by ~1e-8
            ulps = 8 if dtype == torch.float64 and platform.platform() == "tpu" else 0
            torch.testing.assert_close(got[0], expected[0], rtol=ulps * torch.finfo(dtype).eps, atol=0)
            # XLA's sqrt is within an ulp (not correctly rounded), the TPU's emulated float64 one within a few
            # (measured 3.5 ulp of sqrt(2) on a v5e); computed in float32, it would miss by ~1e-8
            sqrt_ulps = 8 if dtype == torch.float64 and platform.platform() == "tpu" else 2
            torch.testing.assert_close(got[1], expected[1], rtol=sqrt_ulps * torch.finfo(dtype).eps, atol=0)


def test_set_default_tensor_type_reaches_the_key():
    x = torch.arange(3, device="tpu")
    assert (x + 1.5).dtype == torch.float32
    previous = torch.get_default_dtype()
    with pytest.warns(UserWarning):
        torch.set_default_tensor_type(torch.DoubleTensor)
    try:
        assert (x + 1.5).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def _mm_entries():
    return sum(e["name"] == "aten.mm.default" for e in executables.stats()["per_entry_stats"])


@pytest.mark.parametrize(
    "columns,setting",
    [
        (3, lambda blocks: torch.set_float32_matmul_precision("medium")),
        (4, lambda blocks: setattr(torch.backends.cuda.matmul, "allow_tf32", True)),
        (5, lambda blocks: blocks.enter_context(torch.tpu.precision(torch.tpu.Precision.HIGH))),
    ],
    ids=["set_float32_matmul_precision", "allow_tf32", "tpu_precision"],
)
def test_precision_changed_between_two_calls_traces_anew(columns, setting):
    from torch_tpu import precision

    a, b = torch.randn(5, 7, device="tpu"), torch.randn(7, columns, device="tpu")
    expected = (a.cpu() @ b.cpu()).double()
    torch.testing.assert_close((a @ b).cpu().double(), expected, rtol=1e-5, atol=1e-5)
    before = _mm_entries()
    a @ b
    assert _mm_entries() == before  # the same setting replays
    traced = []
    original = precision.for_dot
    blocks = contextlib.ExitStack()
    try:
        precision.for_dot = lambda: traced.append(original()) or traced[-1]
        setting(blocks)
        assert precision.current() is not precision.Precision.HIGHEST
        torch.testing.assert_close((a @ b).cpu().double(), expected, rtol=1e-2, atol=1e-2)
    finally:
        precision.for_dot = original
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        blocks.close()
    assert _mm_entries() == before + 1  # traced again, under the new level
    assert traced and traced[-1] is not precision.for_dot()
    assert trace_context.cache_token() == (torch.float32, "highest", True, torch_tpu.index_checks())


def _outcome(call, device):
    """What `call(device)` gives: ("ok", CPU copies of its tensors) or ("raised", class, message)."""
    try:
        result = call(device)
    except Exception as error:
        return ("raised", type(error), str(error))
    return ("ok", [t.cpu() for t in result])


def _assert_same_outcome(call):
    expected, actual = _outcome(call, "cpu"), _outcome(call, "tpu")
    assert actual[0] == expected[0], (expected, actual)
    if expected[0] == "raised":
        assert actual[1] is expected[1] and expected[2].splitlines()[0] in actual[2], (expected, actual)
    else:
        for e, a in zip(expected[1], actual[1], strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


def _arange(device, n=4):
    return torch.arange(float(n), device=device)


OVERLAPS = {  # in-place and out= writes whose inputs share the written tensor's memory
    "partial_inplace": lambda d: [(x := _arange(d))[1:].add_(x[:3])],
    "partial_inplace_kwarg": lambda d: [(x := _arange(d))[1:].add_(other=x[:3])],
    "partial_out": lambda d: [torch.add((x := _arange(d))[:3], 1, out=x[1:])],
    "partial_transposed": lambda d: [(x := _arange(d, 9).view(3, 3)).add_(x.t())],
    "partial_mul_scalar_view": lambda d: [(x := _arange(d)).mul_(x[:1].expand(4).contiguous()), x],
    "full_inplace": lambda d: [(x := _arange(d)).add_(x), x],
    "full_same_view": lambda d: [(x := _arange(d))[:2].add_(x[:2]), x],
    "disjoint_halves": lambda d: [(x := _arange(d))[:2].add_(x[2:]), x],
    "non_dense_columns": lambda d: [(x := _arange(d, 6).view(2, 3))[:, 0].add_(x[:, 1]), x],
    "expanded_self": lambda d: [torch.zeros(1, device=d).expand(3).add_(1)],
    "expanded_out": lambda d: [torch.add(torch.ones(3, device=d), 1, out=torch.zeros(1, device=d).expand(3))],
    "unrelated": lambda d: [(x := _arange(d)).add_(_arange(d)), x],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(OVERLAPS))
def test_writes_overlapping_their_inputs_as_on_cpu(name, mode):
    with torch.tpu.set_eager_mode(MODES[mode]):
        _assert_same_outcome(OVERLAPS[name])


OUT_DTYPES = {  # out= of another dtype than the result: CPU's canCast and same-dtype rules, per op
    "add_float_into_long": lambda d: torch.add(torch.ones(2, device=d), torch.ones(2, device=d), out=_long(d)),
    "add_long_into_float": lambda d: torch.add(_long(d), _long(d), out=torch.zeros(2, device=d)),
    "add_float_into_double": lambda d: torch.add(torch.ones(2, device=d), 0.1, out=_double(d)),
    "neg_long_into_float": lambda d: torch.neg(_long(d), out=torch.zeros(2, device=d)),
    "sqrt_long_into_long": lambda d: torch.sqrt(_long(d), out=_long(d)),
    "sqrt_long_into_double": lambda d: torch.sqrt(_long(d) + 2, out=_double(d)),
    "mm_into_double": lambda d: torch.mm(torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), out=_double(d, 2)),
    "sum_into_long": lambda d: torch.sum(torch.ones(2, 2, device=d), 0, out=_long(d)),
    "eq_into_float": lambda d: torch.eq(_long(d), 0, out=torch.zeros(2, device=d)),
}


def _long(device, *shape):
    return torch.zeros(*(shape or (2,)), dtype=torch.long, device=device)


def _double(device, *shape):
    return torch.zeros(*(shape or (2,)), dtype=torch.float64, device=device)


@pytest.mark.parametrize("name", sorted(OUT_DTYPES))
def test_out_dtype_rules_as_on_cpu(name):
    _assert_same_outcome(lambda d: [OUT_DTYPES[name](d)])
    _assert_same_outcome(lambda d: [OUT_DTYPES[name](d)])  # a second time: CPU's verdict, remembered


BAD_CALLS = {  # bad arguments: CPU's exception class and message, not JAX's or a meta kernel's
    "eye_negative": lambda d: torch.eye(-1, device=d),
    "empty_negative": lambda d: torch.empty(-1, device=d),
    "full_negative": lambda d: torch.full((2, -1), 1.0, device=d),
    "randperm_negative": lambda d: torch.randperm(-1, device=d),
    "arange_step_sign": lambda d: torch.arange(0, 10, -1, device=d),
    "clamp_no_bounds": lambda d: torch.clamp(torch.ones(2, device=d)),
    "complex_mixed_dtypes": lambda d: torch.complex(
        torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)
    ),
    "amax_empty_dim": lambda d: torch.empty(0, 3, device=d).amax(0),
    "argmax_empty_dim": lambda d: torch.empty(0, 3, device=d).argmax(0),
    "sum_repeated_dim": lambda d: torch.ones(2, 3, device=d).sum((0, 0)),
    "mm_shapes": lambda d: torch.mm(torch.ones(2, 3, device=d), torch.ones(2, 3, device=d)),
    "add_shapes": lambda d: torch.ones(2, device=d) + torch.ones(3, device=d),
    "sum_dim_out_of_range": lambda d: torch.ones(2, device=d).sum(3),
    "cat_ranks": lambda d: torch.cat([torch.ones(2, device=d), torch.ones(2, 2, device=d)]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_arguments_raise_as_on_cpu(name, mode):
    with torch.tpu.set_eager_mode(MODES[mode]):
        _assert_same_outcome(lambda d: [BAD_CALLS[name](d)])


def test_cpu_errors_leave_the_cpu_generator_alone():
    state = torch.random.get_rng_state()
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        torch.normal(torch.zeros(2, device="tpu"), -1.0)
    assert torch.equal(torch.random.get_rng_state(), state)
