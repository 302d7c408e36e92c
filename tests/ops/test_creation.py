"""Creation ops against CPU PyTorch: ranges, identity, triangles, factories with out=, complex from parts."""

import jax
import pytest
import torch

from torch_tpu.testing.compare import assert_close, check_op


def _both(build):
    """Run `build(device)` on CPU and on tpu and compare."""
    actual = build("tpu")
    for value in actual if isinstance(actual, (list, tuple)) else [actual]:
        assert value.device.type == "tpu"
    assert_close(actual, build("cpu"))


FACTORIES = {
    "arange_end": lambda d: torch.arange(5, device=d),
    "arange_float_step": lambda d: torch.arange(1, 5, 0.5, device=d),
    "arange_inexact_step": lambda d: torch.arange(-3, 3, 0.7, device=d),
    "arange_negative_step": lambda d: torch.arange(10, 0, -3, device=d),
    "arange_empty": lambda d: torch.arange(5, 5, device=d),
    "arange_int64_float_args": lambda d: torch.arange(0.5, 5, 1.5, dtype=torch.int64, device=d),
    "arange_int32": lambda d: torch.arange(3, 20, 4, dtype=torch.int32, device=d),
    "arange_float64": lambda d: torch.arange(0, 1, 0.1, dtype=torch.float64, device=d),
    "arange_bfloat16": lambda d: torch.arange(0, 10, 0.5, dtype=torch.bfloat16, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "linspace_odd": lambda d: torch.linspace(-1, 1, 7, device=d),
    "linspace_descending": lambda d: torch.linspace(3, -2.5, 9, device=d),
    "linspace_one": lambda d: torch.linspace(3, -2.5, 1, device=d),
    "linspace_zero": lambda d: torch.linspace(3, -2.5, 0, device=d),
    "linspace_int64": lambda d: torch.linspace(0, 10, 4, dtype=torch.int64, device=d),
    "linspace_bfloat16": lambda d: torch.linspace(-2, 2, 6, dtype=torch.bfloat16, device=d),
    "logspace": lambda d: torch.logspace(-2, 2, 9, device=d),
    "logspace_base2": lambda d: torch.logspace(0.5, 2.1, 4, base=2, device=d),
    "logspace_int64": lambda d: torch.logspace(0, 3, 4, dtype=torch.int64, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "eye_rectangular": lambda d: torch.eye(2, 4, device=d),
    "eye_int64": lambda d: torch.eye(3, dtype=torch.int64, device=d),
    "eye_bool": lambda d: torch.eye(3, 2, dtype=torch.bool, device=d),
    "tril_indices": lambda d: torch.tril_indices(3, 4, device=d),
    "tril_indices_offset": lambda d: torch.tril_indices(3, 4, 1, dtype=torch.int32, device=d),
    "triu_indices": lambda d: torch.triu_indices(4, 3, -1, device=d),
    "full": lambda d: torch.full((2, 3), 1.5, device=d),
    "full_int": lambda d: torch.full((2, 3), 7, device=d),
    "zeros": lambda d: torch.zeros(2, 3, dtype=torch.int64, device=d),
    "ones_bfloat16": lambda d: torch.ones(2, 3, dtype=torch.bfloat16, device=d),
    "full_like": lambda d: torch.full_like(torch.empty(2, 3, device=d), -2.0),
    "scalar_tensor": lambda d: torch.scalar_tensor(3.5, device=d),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factory(name):
    _both(FACTORIES[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_out_variants(dtype):
    def build(device):
        a = torch.empty(0, dtype=dtype, device=device)
        b = torch.empty(0, dtype=dtype, device=device)
        c = torch.empty(3, 3, dtype=dtype, device=device)
        torch.arange(1, 9, 2, out=a)
        torch.linspace(0, 6, 4, out=b)
        torch.eye(3, out=c)
        return [a, b, c]

    _both(build)


def test_randperm_out_on_tpu_is_written():
    out = torch.empty(0, dtype=torch.int64, device="tpu")
    torch.randperm(6, out=out)
    assert sorted(out.cpu().tolist()) == list(range(6))


@pytest.mark.parametrize("op", [torch.tril, torch.triu])
@pytest.mark.parametrize("diagonal", [0, 1, -1])
def test_triangle(op, diagonal):
    x = torch.randn(2, 3, 4, requires_grad=True)
    check_op(lambda a: op(a, diagonal), x, grad=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.bool])
def test_triangle_dtypes(dtype):
    x = (torch.randn(3, 4) * 5).to(dtype)
    check_op(lambda a: torch.tril(a, 1), x)
    check_op(lambda a: a.clone().triu_(), x)


def test_complex_and_polar():
    real, imag = torch.randn(3, 4), torch.randn(3, 4)
    check_op(torch.complex, real, imag)
    check_op(torch.polar, real.abs(), imag)


def test_complex_broadcasts():
    check_op(torch.complex, torch.randn(3, 1), torch.randn(4))
    check_op(torch.polar, torch.rand(2, 3), torch.randn(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_logspace_single_step_uses_unrounded_start(dtype):
    _both(lambda d: torch.logspace(4.3, -3, 1, dtype=dtype, device=d))


def test_efficientzerotensor():
    _both(lambda d: torch.ops.aten._efficientzerotensor([2, 3], dtype=torch.float32, device=d))


@pytest.fixture
def xla_compiles():
    """The number of XLA compilations while the fixture is active (a one-element list)."""
    count = [0]

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield count
    jax.monitoring.unregister_event_duration_listener(listener)


SIZED_FACTORIES = {
    "linspace": lambda n, d: torch.linspace(-1.5, 2.25, n, device=d),
    "linspace_float64": lambda n, d: torch.linspace(0, 1, n, dtype=torch.float64, device=d),
    "linspace_bfloat16": lambda n, d: torch.linspace(-3, 3, n, dtype=torch.bfloat16, device=d),
    "linspace_int64": lambda n, d: torch.linspace(-7, 100, n, dtype=torch.int64, device=d),
    "logspace": lambda n, d: torch.logspace(-2, 2, n, device=d),
    "arange": lambda n, d: torch.arange(0, n * 0.3, 0.3, device=d),
    "arange_int": lambda n, d: torch.arange(3, 3 + 2 * n, 2, device=d),
    "eye": lambda n, d: torch.eye(n, n + 1, device=d),
}


@pytest.mark.parametrize("name", SIZED_FACTORIES)
def test_sized_factories_compile_nothing_per_size(name, xla_compiles):
    """A factory with a size argument is not a program per size (40 linspace sizes took 2 s); values are CPU's."""
    build = SIZED_FACTORIES[name]
    for n in range(20, 40):
        actual = build(n, "tpu")
        assert actual.device.type == "tpu"
        torch.testing.assert_close(actual.cpu(), build(n, "cpu"), rtol=0, atol=0)
    assert xla_compiles[0] == 0


def test_large_factories_match_cpu():
    """Beyond the host limit the device program computes CPU's values."""
    n = 70000
    for build in (SIZED_FACTORIES["linspace"], SIZED_FACTORIES["linspace_float64"], SIZED_FACTORIES["arange_int"]):
        torch.testing.assert_close(build(n, "tpu").cpu(), build(n, "cpu"), rtol=0, atol=0)
