"""Special functions on `tpu` against CPU PyTorch: over wide ranges and at their special values."""

import math

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.helpers import jaxpr_equations
from torch_tpu.ops import special
from torch_tpu.testing.compare import check_op

S = torch.special
EDGES = [0.0, -0.0, 1.0, -1.0, 1e-30, 6.0, -6.0, 9.0, 17.0, 40.0, -40.0, math.inf, -math.inf, math.nan]


def points(scale=10.0, count=200, edges=True):
    """Spread-out samples (both signs, several magnitudes) and, with `edges`, the special values."""
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(count, generator=generator) * scale, torch.rand(count, generator=generator) * 4 - 2])
    return torch.cat([x, torch.tensor(EDGES)]) if edges else x


UNARY = {
    "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0,
    "bessel_y1": S.bessel_y1,
    "modified_bessel_i0": S.modified_bessel_i0,
    "modified_bessel_i1": S.modified_bessel_i1,
    "modified_bessel_k0": S.modified_bessel_k0,
    "modified_bessel_k1": S.modified_bessel_k1,
    "scaled_modified_bessel_k0": S.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": S.scaled_modified_bessel_k1,
    "spherical_bessel_j0": S.spherical_bessel_j0,
    "airy_ai": S.airy_ai,
    "entr": S.entr,
    "ndtri": lambda x: S.ndtri(torch.sigmoid(x)),
    "log_ndtr": S.log_ndtr,
    "digamma": torch.digamma,
    "mvlgamma": lambda x: torch.mvlgamma(x.abs() + 1.01, 3),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    check_op(UNARY[name], points())


@pytest.mark.parametrize("name", ["bessel_j1", "modified_bessel_k0", "airy_ai", "digamma"])
def test_unary_integers(name):
    check_op(UNARY[name], torch.arange(-5, 30))


def test_digamma_bfloat16():
    check_op(torch.digamma, points(edges=False).to(torch.bfloat16))


POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial(name):
    """Degrees are truncated to integers (negative and NaN give 0); |x| <= 1, |x| = 1 and |x| > 1. (CPU's value
    at x = NaN is garbage for degrees above 1.)"""
    generator = torch.Generator().manual_seed(1)
    x = torch.cat([torch.rand(300, generator=generator) * 4 - 2, torch.tensor([1.0, -1.0, 0.0, 0.5, 2.0, 0.3])])
    n = torch.rand(x.shape, generator=generator) * 14 - 2
    n[-1] = math.nan
    fn = getattr(S, name)
    check_op(fn, x, n)
    check_op(fn, x, n.round().long())
    check_op(lambda t: fn(t, 5), x)
    check_op(lambda m: fn(0.25, m), n.round().long())
    check_op(fn, torch.tensor([math.nan, math.nan]), torch.tensor([0, 1]))


def test_polygamma():
    x = torch.cat([points(edges=False), torch.tensor([-2.5, -7.95, 0.0, -0.0, 1e-8, math.inf, -math.inf])])
    for n in range(5):
        check_op(lambda t, n=n: torch.polygamma(n, t), x)
    check_op(lambda t: torch.polygamma(1, t), points(edges=False).requires_grad_(), grad=True)


def test_polygamma_in_float64_and_without_a_transcendental_power():
    """float64 polygamma equal to CPU's to float64 precision; its zeta sums integer powers in one loop: on a TPU
    XLA's float64 `pow` is float32-accurate, and 64 unrolled ones kept the chip's compiler busy for minutes."""
    x = torch.cat([points(edges=False).double(), torch.tensor([-2.5, -7.95, -60.25, 0.0, 1e-8, math.inf, -math.inf])])
    for n in range(1, 5):
        check_op(lambda t, n=n: torch.polygamma(n, t), x)
    program = jax.make_jaxpr(lambda t: special.polygamma(2, t))(jnp.ones(8, jnp.float32))
    primitives = {str(equation.primitive) for equation in jaxpr_equations(program.jaxpr)}
    assert "pow" not in primitives and "while" in primitives, primitives


def test_zeta_in_float64_sums_its_head_in_one_loop():
    """Hurwitz zeta with negative q sums (q + k)^-x for its first terms: float64 equal to CPU's, in one loop with
    one power in it (64 unrolled float64 powers: minutes of a TPU's compiler, as polygamma's did)."""
    generator = torch.Generator().manual_seed(3)
    power = torch.rand(200, generator=generator, dtype=torch.float64) * 6 + 1.5
    shift = torch.rand(200, generator=generator, dtype=torch.float64) * 40 - 30
    check_op(S.zeta, power, shift)
    program = jax.make_jaxpr(special._zeta)(jnp.ones(8, jnp.float64), jnp.ones(8, jnp.float64))
    primitives = [str(equation.primitive) for equation in jaxpr_equations(program.jaxpr)]
    assert primitives.count("pow") <= 1 and "while" in primitives, primitives


def test_incomplete_gamma_and_zeta():
    generator = torch.Generator().manual_seed(2)
    a = torch.cat([torch.rand(300, generator=generator) * 10, torch.tensor([0.0, 1.0, 0.0, -1.0, 2.0])])
    x = torch.cat([torch.rand(300, generator=generator) * 10, torch.tensor([1.0, 0.0, 0.0, 1.0, math.inf])])
    check_op(lambda s, o: (torch.igamma(s, o), torch.igammac(s, o)), a, x)
    power = torch.cat([torch.rand(300, generator=generator) * 10 + 0.5, torch.tensor([1.0, 0.5, 2.0, 2.0, 3.0])])
    shift = torch.cat([torch.rand(300, generator=generator) * 20 - 5, torch.tensor([1.0, 1.0, 0.0, -1.5, -20.5])])
    check_op(S.zeta, power, shift)
    check_op(lambda q: S.zeta(2.0, q), shift)
