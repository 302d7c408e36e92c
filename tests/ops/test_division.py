"""Division is correctly rounded in every floating dtype: bit-identical to CPU for tensor / number, tensor / 0-dim
tensor, tensor / broadcast row and tensor / tensor, with every rounding mode, in eager and under torch.compile.

(XLA's algebraic simplifier turns a division by a broadcast into a multiplication by a reciprocal, one ulp off
for about a third of the quotients; see `elementwise.true_divide`.)
"""

import pytest
import torch

DTYPES = (torch.float32, torch.float64, torch.bfloat16)
MODES = (None, "trunc", "floor")


def _assert_bitwise(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)


def _dividend(dtype):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(64, 16, generator=generator, dtype=torch.float64) * 100).to(dtype)


def _divisors(dtype):
    generator = torch.Generator().manual_seed(1)
    row = (torch.rand(16, generator=generator, dtype=torch.float64) * 10 - 5).to(dtype)
    full = (torch.rand(64, 16, generator=generator, dtype=torch.float64) * 10 - 5).to(dtype)
    return {"number": 3.0, "tenth": 0.1, "zero_dim": torch.tensor(7.0, dtype=dtype), "row": row, "full": full}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_division_is_bitwise_cpu(dtype, mode):
    x = _dividend(dtype)
    for name, divisor in _divisors(dtype).items():
        moved = divisor.to("tpu") if isinstance(divisor, torch.Tensor) else divisor
        expected = torch.div(x, divisor, rounding_mode=mode)
        _assert_bitwise(torch.div(x.to("tpu"), moved, rounding_mode=mode), expected)
        if mode is None:
            _assert_bitwise(x.to("tpu") / moved, x / divisor)
            _assert_bitwise(x.to("tpu").div_(moved), x.clone().div_(divisor))
        if name == "full":
            reverse = torch.div(divisor, x, rounding_mode=mode)
            _assert_bitwise(torch.div(moved, x.to("tpu"), rounding_mode=mode), reverse)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quotient_ops_are_bitwise_cpu(dtype):
    x, row = _dividend(dtype), _divisors(dtype)["row"]
    t, r = x.to("tpu"), row.to("tpu")
    _assert_bitwise(torch.floor_divide(t, 3.0), torch.floor_divide(x, 3.0))
    _assert_bitwise(torch.floor_divide(t, r), torch.floor_divide(x, row))
    _assert_bitwise(torch.true_divide(t, r), torch.true_divide(x, row))
    _assert_bitwise(torch.addcdiv(t, t, r, value=0.3), torch.addcdiv(x, x, row, value=0.3))
    _assert_bitwise(torch.round(t, decimals=2), torch.round(x, decimals=2))


def test_compiled_division_is_bitwise_cpu():
    x = _dividend(torch.float64)
    fn = torch.compile(lambda a: a / 3.0 + torch.div(a, 0.1, rounding_mode="floor"), backend="tpu", dynamic=False)
    _assert_bitwise(fn(x.to("tpu")), x / 3.0 + torch.div(x, 0.1, rounding_mode="floor"))
