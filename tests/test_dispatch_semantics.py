"""Semantics the eager dispatcher owes every op, against CPU: the trace context in every cache key, out= and
in-place writes through views, overlap and out= dtype checks, PyTorch's errors for bad arguments."""

import contextlib

import pytest
import torch

from torch_tpu.eager.cache import executables

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
            torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)  # 0.1 in the default dtype, as on CPU
            # XLA's sqrt is within an ulp (not correctly rounded); computed in float32, it would miss by ~1e-8
            torch.testing.assert_close(got[1], expected[1], rtol=2 * torch.finfo(dtype).eps, atol=0)


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
    assert precision.cache_token() == (torch.float32, "highest", True)
