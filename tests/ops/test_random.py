"""Random ops on tpu: shapes, dtypes, ranges, moments, and reproducibility under torch.manual_seed.

Values cannot equal CPU's bit streams; the statistical bounds are ~6 standard errors for N samples.
"""

import math

import pytest
import torch

from torch_tpu.ops.registry import LOWERINGS

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

N = 20000
FLOATS = [torch.float32, torch.bfloat16, torch.float64]


def _host(x):
    assert x.device.type == "tpu"
    return x.cpu()


def _check_moments(x, mean, std):
    x = x.double()
    assert abs(x.mean().item() - mean) < 6 * std / math.sqrt(x.numel()) + 1e-2 * abs(mean)
    assert abs(x.std().item() - std) < 0.05 * std


@pytest.mark.parametrize("dtype", FLOATS)
def test_rand_uniform(dtype):
    x = _host(torch.rand(N, dtype=dtype, device="tpu"))
    assert x.dtype == dtype and x.shape == (N,)
    assert x.min() >= 0 and x.max() <= 1
    _check_moments(x, 0.5, math.sqrt(1 / 12))
    y = _host(torch.empty(4, N // 4, dtype=dtype, device="tpu").uniform_(-2, 3))
    assert y.shape == (4, N // 4) and y.min() >= -2 and y.max() <= 3
    _check_moments(y, 0.5, 5 / math.sqrt(12))


@pytest.mark.parametrize("dtype", FLOATS)
def test_randn_normal(dtype):
    x = _host(torch.randn(N, dtype=dtype, device="tpu"))
    assert x.dtype == dtype
    _check_moments(x, 0.0, 1.0)
    y = _host(torch.empty(N, dtype=dtype, device="tpu").normal_(2.0, 0.5))
    _check_moments(y, 2.0, 0.5)


def test_normal_overloads():
    mean, std = torch.full((N,), 3.0, device="tpu"), torch.full((N,), 2.0, device="tpu")
    _check_moments(_host(torch.normal(mean, 2.0)), 3.0, 2.0)
    _check_moments(_host(torch.normal(-1.0, std)), -1.0, 2.0)
    _check_moments(_host(torch.normal(mean, std)), 3.0, 2.0)
    broadcast = _host(torch.normal(torch.zeros(4, 1, device="tpu"), torch.ones(1, N // 4, device="tpu")))
    assert broadcast.shape == (4, N // 4)
    x = _host(torch.normal(1.0, 3.0, (N,), device="tpu"))
    _check_moments(x, 1.0, 3.0)


def test_like_factories():
    base = torch.empty(3, 5, dtype=torch.bfloat16, device="tpu")
    for fn in (torch.rand_like, torch.randn_like):
        x = fn(base)
        assert x.device.type == "tpu" and x.dtype == torch.bfloat16 and x.shape == (3, 5)
    ints = _host(torch.randint_like(base, 3, 7))
    assert ints.dtype == torch.bfloat16 and ints.min() >= 3 and ints.max() < 7


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.float32])
def test_randint(dtype):
    low = -4 if dtype != torch.uint8 else 0
    x = _host(torch.randint(low, 6, (N,), dtype=dtype, device="tpu"))
    assert x.dtype == dtype and x.min() == low and x.max() == 5
    counts = torch.bincount(x.long() - low)
    expected = N / (6 - low)
    assert (counts - expected).abs().max() < 6 * math.sqrt(expected)


@pytest.mark.parametrize(
    "dtype,high",
    [
        (torch.float32, 2**24),
        (torch.bfloat16, 2**8),
        (torch.float64, 2**53),
        (torch.int64, 2**63 - 1),
        (torch.int32, 2**31 - 1),
        (torch.int8, 127),
        (torch.uint8, 255),
        (torch.bool, 1),
    ],
)
def test_random_default_range(dtype, high):
    x = _host(torch.empty(N, dtype=dtype, device="tpu").random_())
    assert x.dtype == dtype
    assert x.min().item() >= 0 and x.max().item() <= high
    assert x.double().mean().item() > high / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int16])
def test_random_to_and_from(dtype):
    x = _host(torch.empty(N, dtype=dtype, device="tpu").random_(7))
    assert x.min() == 0 and x.max() == 6
    y = _host(torch.empty(N, dtype=dtype, device="tpu").random_(-3, 4))
    assert y.min() == -3 and y.max() == 3
    z = _host(torch.empty(N, dtype=dtype, device="tpu").random_(100, None))
    assert z.min() >= 100 and z.double().mean() > 1000


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bernoulli(dtype):
    p = torch.tensor([0.0, 0.2, 0.9, 1.0], dtype=dtype).repeat(N // 4).to("tpu")
    x = _host(torch.bernoulli(p)).reshape(-1, 4).double()
    assert x.dtype == torch.float64 and set(x.unique().tolist()) <= {0.0, 1.0}
    assert x[:, 0].sum() == 0 and x[:, 3].sum() == N // 4
    assert abs(x[:, 1].mean() - 0.2) < 0.03 and abs(x[:, 2].mean() - 0.9) < 0.03
    y = _host(torch.empty(N, dtype=dtype, device="tpu").bernoulli_(0.3)).double()
    assert abs(y.mean() - 0.3) < 0.03
    z = _host(torch.empty(N, dtype=dtype, device="tpu").bernoulli_(p)).reshape(-1, 4).double()
    assert z[:, 0].sum() == 0 and z[:, 3].sum() == N // 4
    w = _host(torch.bernoulli(torch.zeros(N, dtype=dtype, device="tpu"), 0.7)).double()
    assert abs(w.mean() - 0.7) < 0.03


def test_bernoulli_out_of_place_tensor_p():
    x = torch.zeros(N, device="tpu")
    p = torch.full((N,), 0.25, device="tpu")
    y = _host(torch.ops.aten.bernoulli.Tensor(x, p))
    assert abs(y.mean() - 0.25) < 0.03


def test_continuous_distributions():
    x = _host(torch.empty(N, device="tpu").exponential_(2.0))
    assert x.min() >= 0
    _check_moments(x, 0.5, 0.5)
    g = _host(torch.empty(N, device="tpu").geometric_(0.25))
    assert g.min() >= 1 and torch.equal(g, g.round())
    _check_moments(g, 4.0, math.sqrt(0.75) / 0.25)
    ln = _host(torch.empty(N, dtype=torch.float64, device="tpu").log_normal_(0.5, 0.25))
    _check_moments(ln.log(), 0.5, 0.25)
    c = _host(torch.empty(N, device="tpu").cauchy_(1.0, 2.0))
    assert abs(c.median() - 1.0) < 0.1
    assert abs((c - 1.0).abs().median() - 2.0) < 0.15


def test_randperm():
    for n, dtype in ((1, torch.int64), (10, torch.int64), (300, torch.int32), (20, torch.float32)):
        x = _host(torch.randperm(n, dtype=dtype, device="tpu"))
        assert x.dtype == dtype and sorted(x.tolist()) == list(range(n))
    assert not torch.equal(torch.randperm(50, device="tpu").cpu(), torch.arange(50))


def test_multinomial():
    probs = torch.tensor([[1.0, 0.0, 3.0, 6.0], [1.0, 1.0, 1.0, 1.0]], device="tpu")
    draws = _host(torch.multinomial(probs, N // 2, replacement=True))
    assert draws.dtype == torch.int64 and draws.shape == (2, N // 2)
    assert (draws[0] != 1).all()
    frequency = torch.bincount(draws[0], minlength=4).double() / (N // 2)
    assert torch.allclose(frequency, torch.tensor([0.1, 0.0, 0.3, 0.6], dtype=torch.float64), atol=0.03)
    unique = _host(torch.multinomial(probs, 3))
    for row in unique:
        assert len(set(row.tolist())) == 3
    assert 1 not in unique[0].tolist()
    single = _host(torch.multinomial(torch.tensor([0.2, 0.8], device="tpu"), 1))
    assert single.shape == (1,)


def _draws():
    return [
        torch.rand(4, device="tpu").cpu(),
        torch.randn(4, device="tpu").cpu(),
        torch.randint(0, 100, (4,), device="tpu").cpu(),
        torch.randperm(8, device="tpu").cpu(),
    ]


def test_manual_seed_reproducible():
    torch.manual_seed(123)
    first = _draws()
    torch.manual_seed(123)
    second = _draws()
    torch.manual_seed(124)
    third = _draws()
    for a, b, c in zip(first, second, third, strict=True):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_successive_draws_differ():
    assert not torch.equal(torch.rand(8, device="tpu").cpu(), torch.rand(8, device="tpu").cpu())


def test_rng_state_round_trip():
    torch.manual_seed(7)
    torch.rand(3, device="tpu")
    state = torch.tpu.get_rng_state()
    expected = _draws()
    torch.rand(5, device="tpu")
    torch.tpu.set_rng_state(state)
    for a, b in zip(_draws(), expected, strict=True):
        assert torch.equal(a, b)


def test_cpu_generator_reproducible():
    a = torch.rand(6, device="tpu", generator=torch.Generator().manual_seed(3)).cpu()
    b = torch.rand(6, device="tpu", generator=torch.Generator().manual_seed(3)).cpu()
    assert torch.equal(a, b)


@pytest.mark.skipif(torch.ops.aten.native_dropout.default not in LOWERINGS, reason="native_dropout not lowered")
def test_dropout():
    x = torch.ones(N, device="tpu")
    y = _host(torch.nn.functional.dropout(x, 0.25))
    kept = y != 0
    assert torch.allclose(y[kept], torch.tensor(1 / 0.75))
    assert abs((~kept).double().mean() - 0.25) < 0.03
    assert torch.equal(_host(torch.nn.functional.dropout(x, 0.25, training=False)), torch.ones(N))


# Bad arguments raise as on CPU: the same exception class and message.
BAD_ARGUMENTS = {
    "random_from_below_int8": lambda d: torch.empty(4, dtype=torch.int8, device=d).random_(-200, 0),
    "random_to_above_uint8": lambda d: torch.empty(4, dtype=torch.uint8, device=d).random_(0, 300),
    "random_to_above_half": lambda d: torch.empty(4, dtype=torch.float16, device=d).random_(0, 100000),
    "random_empty_range": lambda d: torch.empty(4, device=d).random_(5, 5),
    "random_to_zero": lambda d: torch.empty(4, device=d).random_(0),
    "randint_empty_range": lambda d: torch.randint(5, 5, (3,), device=d),
    "randint_above_uint8": lambda d: torch.randint(0, 300, (3,), dtype=torch.uint8, device=d),
    "rand_int64": lambda d: torch.rand(4, dtype=torch.int64, device=d),
    "uniform_int32": lambda d: torch.empty(4, dtype=torch.int32, device=d).uniform_(),
    "uniform_reversed": lambda d: torch.empty(4, device=d).uniform_(1, 0),
    "uniform_infinite": lambda d: torch.empty(4, device=d).uniform_(0, math.inf),
    "bernoulli_p_above_one": lambda d: torch.empty(3, device=d).bernoulli_(1.5),
    "bernoulli_p_negative": lambda d: torch.bernoulli(torch.empty(3, device=d), -0.5),
    "multinomial_integer": lambda d: torch.multinomial(torch.ones(2, dtype=torch.int64, device=d), 1),
    "multinomial_too_many": lambda d: torch.multinomial(torch.tensor([0.5, 0.5], device=d), 3),
}


@pytest.mark.parametrize("name", BAD_ARGUMENTS)
def test_bad_arguments_raise_as_on_cpu(name):
    fn = BAD_ARGUMENTS[name]
    with pytest.raises(Exception) as expected:
        fn("cpu")
    with pytest.raises(type(expected.value)) as actual:
        fn("tpu")
    assert str(actual.value).split("  (Could")[0] == str(expected.value).split("  (Could")[0]


_VALUE_CASES = [
    lambda d: torch.normal(torch.zeros(3, device=d), -torch.ones(3, device=d)),
    lambda d: torch.normal(0.0, -torch.ones(3, device=d)),
    lambda d: torch.bernoulli(torch.full((3,), 1.5, device=d)),
    lambda d: torch.empty(3, device=d).bernoulli_(torch.full((3,), -1.0, device=d)),
]


@pytest.mark.parametrize("case", range(len(_VALUE_CASES)))
def test_tensor_argument_values_checked_on_the_device(case):
    """normal's std and bernoulli's p are checked inside the op's program and raise CPU's error at the next sync."""
    fn = _VALUE_CASES[case]
    with pytest.raises(RuntimeError) as expected:
        fn("cpu")
    with pytest.raises(RuntimeError) as actual:
        fn("tpu")
        torch.tpu.synchronize()
    assert str(actual.value) == str(expected.value).split("  (Could")[0]


def test_valid_tensor_arguments_pass_the_device_checks():
    assert torch.normal(torch.zeros(3, device="tpu"), torch.ones(3, device="tpu")).shape == (3,)
    assert torch.bernoulli(torch.full((3,), 0.5, device="tpu")).shape == (3,)
    torch.tpu.synchronize()
