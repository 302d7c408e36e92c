"""`out=` tensors of every layout, against CPU: an op writes through the out's own view (narrowed, transposed,
strided, offset, expanded) and nowhere else in its storage, resizes it only where CPU does, raises CPU's error for
an out with internal overlap, and grows an empty out of another dtype as CPU does."""

import pytest
import torch

from torch_tpu.eager import validation
from torch_tpu.testing.compare import EAGER_MODES as MODES

pytestmark = pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")

LAYOUTS = {  # views of a (4, 7) base: shapes (2, 3), (3, 2) and (6,), with and without internal overlap
    "narrowed": lambda base: base.narrow(1, 2, 3)[:2],
    "transposed": lambda base: base[:3, :2].t(),
    "strided": lambda base: base[::2, ::3],
    "offset_flat": lambda base: base[1, 1:7],
    "expanded": lambda base: base[0, :1].expand(6),
    "expanded_rows": lambda base: base[0, :3].expand(2, 3),
}
# Where CPU writes an expanded out (fills, reductions, matmuls do), what its memory holds is its loops' accident
# (a reduction accumulates every aliased row): there, only the base around the view is compared.
OVERLAPPING = ("expanded", "expanded_rows")


def _outside(layout):
    """The base's elements that `layout` does not reach."""
    mask = torch.zeros(4, 7, dtype=torch.bool)
    LAYOUTS[layout](mask).fill_(True)
    return ~mask if layout in OVERLAPPING else torch.ones(4, 7, dtype=torch.bool)


def _six(device):
    return torch.arange(6.0, device=device)


OPS = {  # each writes 6 elements, shaped (6,), (2, 3) or (3, 2)
    "arange": lambda out, d: torch.arange(0, 6, out=out),
    "linspace": lambda out, d: torch.linspace(0, 5, 6, out=out),
    "logspace": lambda out, d: torch.logspace(0, 2, 6, out=out),
    "eye": lambda out, d: torch.eye(3, 2, out=out),
    "full": lambda out, d: torch.full((2, 3), 2.0, out=out),
    "zeros": lambda out, d: torch.zeros((6,), out=out),
    "add": lambda out, d: torch.add(_six(d), _six(d), out=out),
    "mul": lambda out, d: torch.mul(_six(d).view(2, 3), 3, out=out),
    "sum_dim": lambda out, d: torch.sum(_six(d).view(2, 3, 1).expand(2, 3, 2), 2, out=out),
    "amax_dim": lambda out, d: torch.amax(_six(d).view(3, 2), 1, keepdim=False, out=out),
    "mm": lambda out, d: torch.mm(_six(d).view(2, 3)[:, :2], _six(d).view(2, 3), out=out),
    "cat": lambda out, d: torch.cat([_six(d)[:3].view(1, 3), _six(d)[3:].view(1, 3)], out=out),
    "index_select": lambda out, d: torch.index_select(
        _six(d).view(2, 3), 1, torch.tensor([2, 0, 1], device=d), out=out
    ),
    "cumsum": lambda out, d: torch.cumsum(_six(d).view(3, 2), 0, out=out),
    "where": lambda out, d: torch.where(_six(d) > 2, _six(d), -1.0, out=out),
}


def _outcome(op, layout, device):
    """("ok", the whole base tensor, the out's layout) after `op` writes into `layout` of a base of distinct
    values, or ("raised", class, first line of the message)."""
    base = torch.arange(-1.0, -29.0, -1.0, device=device).view(4, 7)
    out = LAYOUTS[layout](base)
    try:
        result = OPS[op](out, device)
    except Exception as error:
        return ("raised", type(error), str(error).splitlines()[0])
    assert result is out
    return ("ok", base.cpu(), (tuple(out.shape), out.stride(), out.storage_offset()))


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_out_writes_through_its_view_as_on_cpu(op, mode):
    for layout in LAYOUTS:
        expected = _outcome(op, layout, "cpu")
        with torch.tpu.set_eager_mode(MODES[mode]):
            actual = _outcome(op, layout, "tpu")
        assert actual[0] == expected[0], (layout, expected, actual)
        if expected[0] == "raised":
            assert actual[1:] == expected[1:], layout
        else:
            kept = _outside(layout)
            torch.testing.assert_close(actual[1][kept], expected[1][kept], rtol=1.3e-6, atol=1e-5, msg=layout)
            assert actual[2] == expected[2], layout


@pytest.mark.parametrize("mode", sorted(MODES))
def test_linspace_into_an_expanded_out_raises_as_on_cpu(mode):
    with torch.tpu.set_eager_mode(MODES[mode]):
        x = torch.rand(1, device="tpu").expand(10)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single"):
            torch.linspace(1, 10, 10, out=x)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_out_of_another_dtype_with_a_pending_input(mode, monkeypatch):
    """CPU's verdict on the dtypes reads the inputs, which in Fused mode runs the recorded cluster: the result
    computed meanwhile still reaches the out. (CPU is asked until it has allowed a dtype signature: forgotten.)"""
    monkeypatch.setattr(validation, "_out_dtypes_allowed", set())
    outs = []
    for device in ("cpu", "tpu"):
        with torch.tpu.set_eager_mode(MODES[mode]):
            doubled = torch.arange(4.0, device=device)[::2] * 2
            out = torch.zeros(2, dtype=torch.float64, device=device)
            torch.add(doubled[:1].expand(2), 0.5, out=out)
            outs.append(out.cpu())
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)


def _half(device, *shape):
    return (torch.arange(float(max(1, torch.Size(shape).numel())), device=device) / 3).half().reshape(shape)


EMPTY_OUTS = {  # an empty out of another dtype than the result: CPU resizes it and casts (or raises)
    "add_0dim": lambda out, d: torch.add(_half(d), _half(d), out=out),
    "add": lambda out, d: torch.add(_half(d, 2, 3), _half(d, 2, 3), out=out),
    "mul_scalar": lambda out, d: torch.mul(_half(d, 4), 2, out=out),
    "neg": lambda out, d: torch.neg(_half(d, 3), out=out),
    "sum_dim": lambda out, d: torch.sum(_half(d, 2, 3), 1, out=out),
    "amax_dim": lambda out, d: torch.amax(_half(d, 2, 3), 0, out=out),
    "mm": lambda out, d: torch.mm(_half(d, 2, 3), _half(d, 3, 2), out=out),
    "cat": lambda out, d: torch.cat([_half(d, 2), _half(d, 3)], out=out),
    "index_select": lambda out, d: torch.index_select(_half(d, 4), 0, torch.tensor([3, 1], device=d), out=out),
    "arange": lambda out, d: torch.arange(0, 5, out=out),
    "linspace": lambda out, d: torch.linspace(0, 1, 5, out=out),
    "full": lambda out, d: torch.full((2, 2), 1.5, out=out),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("name", sorted(EMPTY_OUTS))
def test_empty_out_of_another_dtype_grows_as_on_cpu(name, dtype):
    outcomes = []
    for device in ("cpu", "tpu"):
        out = torch.empty(0, dtype=dtype, device=device)
        try:
            EMPTY_OUTS[name](out, device)
        except Exception as error:
            outcomes.append(("raised", type(error), str(error).splitlines()[0]))
        else:
            outcomes.append(("ok", out.cpu()))
    expected, actual = outcomes
    assert actual[0] == expected[0], (expected, actual)
    if expected[0] == "raised":
        assert actual[1:] == expected[1:]
    else:
        assert actual[1].dtype == expected[1].dtype
        torch.testing.assert_close(actual[1], expected[1], rtol=0, atol=0)
