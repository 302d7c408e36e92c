"""Lowerings: special functions (Bessel and Airy functions, orthogonal polynomials, incomplete gamma, zeta, ...).

Each is evaluated in float64, from power series below a split point and asymptotic expansions above it (or from
closed forms), then cast to PyTorch's result dtype: float64's guard digits make a float32 result accurate to
about an ulp, as PyTorch's CPU kernels are. Special values (0, infinities, NaN, the domain's edges) and the
truncation of a polynomial's degree `n` to an integer follow PyTorch's CPU kernels.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy import special

from torch_tpu.ops import emulated
from torch_tpu.ops.elementwise import copysign
from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import dtypes

_F64 = np.dtype(np.float64)
_EULER = 0.5772156649015329
_SERIES_TERMS = 60
_HARMONIC = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, _SERIES_TERMS + 2))])


def _wide(*operands):
    """Operands in their common floating dtype (PyTorch's result dtype), as float64 for evaluation."""
    return tuple(x.astype(_F64) for x in dtypes.floating(*operands))


def _polynomial(coefficients, variable):
    """sum_m coefficients[m] * variable**m, by Horner's rule."""
    total = jnp.zeros_like(variable)
    for c in reversed(coefficients):
        total = total * variable + c
    return total


def _hankel_coefficients(order, count):
    """a_m = prod_{j<=m} (4 order^2 - (2j - 1)^2) / (m! 8^m), m < count: the terms of Hankel's expansions."""
    coefficients = [1.0]
    for m in range(1, count):
        coefficients.append(coefficients[-1] * (4 * order * order - (2 * m - 1) ** 2) / (8 * m))
    return coefficients


# ---------------------------------------------------------------- Bessel functions (orders 0 and 1)


def _series(x, order, sign):
    """J_order(x) (sign -1) or I_order(x) (sign +1) from the power series, and sum_k t_k c_k over its terms t_k
    with c_k = H_k (order 0) or H_k + H_{k+1} (order 1), H the harmonic numbers: the part Y and K add."""
    quarter = sign * x * x / 4
    term = jnp.ones_like(x) if order == 0 else x / 2
    value, weighted = term, term * (_HARMONIC[0] + (_HARMONIC[1] if order else 0.0))
    for k in range(1, _SERIES_TERMS):
        term = term * quarter / (k * (k + order))
        value = value + term
        weighted = weighted + term * (_HARMONIC[k] + (_HARMONIC[k + 1] if order else 0.0))
    return value, weighted


_BESSEL_SPLIT = 17.0  # J, Y: series below (cancellation costs < 1e-9), Hankel's expansion above (error < 1e-14)
_HANKEL = {order: _hankel_coefficients(order, 34) for order in (0, 1)}


def _bessel(x, order):
    """(J_order(x), Y_order(x)) for x > 0."""
    small = jnp.minimum(x, _BESSEL_SPLIT)
    j_small, weighted = _series(small, order, -1)
    log_term = jnp.log(small / 2) + _EULER
    if order == 0:
        y_small = 2 / math.pi * (log_term * j_small - weighted)
    else:
        y_small = 2 / math.pi * (log_term * j_small - 1 / small) - weighted / math.pi
    large = jnp.maximum(x, _BESSEL_SPLIT)
    a, inverse = _HANKEL[order], 1 / (large * large)
    p = _polynomial([(-1) ** k * a[2 * k] for k in range(len(a) // 2)], inverse)
    q = _polynomial([(-1) ** k * a[2 * k + 1] for k in range(len(a) // 2)], inverse) / large
    phase = large - (2 * order + 1) * math.pi / 4
    scale = jnp.sqrt(2 / (math.pi * large))
    j_large = scale * (p * jnp.cos(phase) - q * jnp.sin(phase))
    y_large = scale * (p * jnp.sin(phase) + q * jnp.cos(phase))
    series = x < _BESSEL_SPLIT
    return jnp.where(series, j_small, j_large), jnp.where(series, y_small, y_large)


def _bessel_j(self, order):
    (x,) = _wide(self)
    value = _bessel(jnp.abs(x), order)[0]
    value = jnp.where(x == 0, float(order == 0), value * (jnp.sign(x) if order else 1))
    return jnp.where(jnp.isinf(x), jnp.nan, value)


def _bessel_y(self, order):
    (x,) = _wide(self)
    value = _bessel(jnp.where(x > 0, x, 1.0), order)[1]
    value = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, value))
    return jnp.where((x == jnp.inf) | jnp.isnan(x), jnp.nan, value)


_K_SPLIT = 9.0  # K: series below (cancellation against I costs < 1e-8), asymptotic expansion above (< 1e-7)
_K_ASYMPTOTIC = {order: _hankel_coefficients(order, 19) for order in (0, 1)}


def _scaled_k(x, order):
    """exp(x) K_order(x) for x > 0."""
    small = jnp.minimum(x, _K_SPLIT)
    i_small, weighted = _series(small, order, 1)
    log_term = jnp.log(small / 2) + _EULER
    k_small = -log_term * i_small + weighted if order == 0 else 1 / small + log_term * i_small - weighted / 2
    large = jnp.maximum(x, _K_SPLIT)
    k_large = jnp.sqrt(math.pi / (2 * large)) * _polynomial(_K_ASYMPTOTIC[order], 1 / large)
    return jnp.where(x < _K_SPLIT, k_small * jnp.exp(small), k_large)


def _bessel_k(self, order, scaled):
    (x,) = _wide(self)
    positive = jnp.where(x > 0, x, 1.0)
    value = _scaled_k(positive, order) * (1 if scaled else jnp.exp(-positive))
    value = jnp.where(x == jnp.inf, 0.0, value)
    value = jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, value))
    return jnp.where(jnp.isnan(x), jnp.nan, value)


def _bessel_i(self, fn):
    (x,) = _wide(self)
    return jnp.where(jnp.isinf(x), jnp.nan, fn(x))


# special_bessel_j0 stays unlowered: tests/eager/test_fallback.py and tests/compile/test_compile.py use it as the
# example of an op without a lowering (`_bessel_j(self, 0)` would be its lowering).
_BESSEL = {
    aten.special_bessel_j1.default: lambda self: _bessel_j(self, 1),
    aten.special_bessel_y0.default: lambda self: _bessel_y(self, 0),
    aten.special_bessel_y1.default: lambda self: _bessel_y(self, 1),
    aten.special_modified_bessel_i0.default: lambda self: _bessel_i(self, special.i0),
    aten.special_modified_bessel_i1.default: lambda self: _bessel_i(self, special.i1),
    aten.special_modified_bessel_k0.default: lambda self: _bessel_k(self, 0, scaled=False),
    aten.special_modified_bessel_k1.default: lambda self: _bessel_k(self, 1, scaled=False),
    aten.special_scaled_modified_bessel_k0.default: lambda self: _bessel_k(self, 0, scaled=True),
    aten.special_scaled_modified_bessel_k1.default: lambda self: _bessel_k(self, 1, scaled=True),
}
for _op, _fn in _BESSEL.items():
    lower(_op)(_fn)


@lower(aten.special_spherical_bessel_j0.default)
def special_spherical_bessel_j0(x):
    (x,) = _wide(x)
    value = jnp.sin(x) / jnp.where(x == 0, 1.0, x)
    return jnp.where(x == 0, 1.0, jnp.where(jnp.isinf(x), 0.0, value))


# ---------------------------------------------------------------- Airy function


_AIRY_SPLIT = 6.0  # series below |x| = 6 (cancellation costs < 1e-7), asymptotic expansions above (< 1e-8)
_AI_0, _AI_PRIME_0 = 0.3550280538878172, -0.2588194037928068


def _airy_coefficients(count):
    """u_k of the Airy asymptotic expansions: u_k = u_{k-1} (6k-5)(6k-3)(6k-1) / (216 k (2k-1))."""
    u = [1.0]
    for k in range(1, count):
        u.append(u[-1] * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / (216 * k * (2 * k - 1)))
    return u


_AIRY_U = _airy_coefficients(20)


@lower(aten.special_airy_ai.default)
def special_airy_ai(x):
    (x,) = _wide(x)
    small = jnp.clip(x, -_AIRY_SPLIT, _AIRY_SPLIT)
    cube = small * small * small
    f, g = jnp.ones_like(small), small
    f_term, g_term = f, g
    for k in range(1, _SERIES_TERMS // 2):
        f_term = f_term * cube / ((3 * k - 1) * (3 * k))
        g_term = g_term * cube / ((3 * k) * (3 * k + 1))
        f, g = f + f_term, g + g_term
    series = _AI_0 * f + _AI_PRIME_0 * g
    z = jnp.maximum(jnp.abs(x), _AIRY_SPLIT)
    zeta = 2 / 3 * z * jnp.sqrt(z)
    fourth_root = jnp.sqrt(jnp.sqrt(z))  # not z ** 0.25: XLA's float64 power on a TPU (ops/emulated.py)
    inverse = 1 / zeta
    decaying = (
        jnp.exp(-zeta)
        / (2 * math.sqrt(math.pi) * fourth_root)
        * _polynomial([(-1) ** k * u for k, u in enumerate(_AIRY_U)], inverse)
    )
    even = _polynomial([(-1) ** k * u for k, u in enumerate(_AIRY_U[::2])], inverse * inverse)
    odd = _polynomial([(-1) ** k * u for k, u in enumerate(_AIRY_U[1::2])], inverse * inverse) * inverse
    phase = zeta + math.pi / 4
    oscillating = (jnp.sin(phase) * even - jnp.cos(phase) * odd) / (math.sqrt(math.pi) * fourth_root)
    value = jnp.where(x > _AIRY_SPLIT, decaying, jnp.where(x < -_AIRY_SPLIT, oscillating, series))
    return jnp.where(jnp.isinf(x), jnp.nan, value)


# ---------------------------------------------------------------- orthogonal polynomials


def _degree(n):
    """The integer degree PyTorch's kernels use: `n` truncated toward zero (NaN counts as negative)."""
    n = jnp.asarray(n)
    if not jnp.issubdtype(n.dtype, jnp.floating):
        return n.astype(np.int64)
    return jnp.where(jnp.isnan(n), -1, jnp.trunc(jnp.clip(n, -1, 2.0**62))).astype(np.int64)


def _chebyshev(kind, x, n):
    """T, U, V or W of degree n >= 0 at x, from their trigonometric (|x| <= 1) or hyperbolic closed forms."""
    a = jnp.abs(x)
    inside = a <= 1
    theta = jnp.arccos(jnp.clip(x, -1, 1))
    t = jnp.arccosh(jnp.maximum(a, 1))
    m = n.astype(_F64)
    odd = (n % 2 == 1) & (x < 0)
    parity = jnp.where(odd, -1.0, 1.0)
    if kind == "t":
        return jnp.where(inside, jnp.cos(m * theta), parity * jnp.cosh(m * t))
    if kind == "u":
        ratio = jnp.sin((m + 1) * theta) / jnp.where(jnp.sin(theta) == 0, 1, jnp.sin(theta))
        edge = (m + 1) * jnp.where(odd, -1.0, 1.0)
        hyperbolic = parity * jnp.sinh((m + 1) * t) / jnp.where(t == 0, 1, jnp.sinh(t))
        return jnp.where(a == 1, edge, jnp.where(inside, ratio, hyperbolic))
    # V and W swap under x -> -x: V_n(-x) = (-1)^n W_n(x)
    cos_half, sin_half = jnp.cos(theta / 2), jnp.sin(theta / 2)
    v_inside = jnp.cos((m + 0.5) * theta) / jnp.where(cos_half == 0, 1, cos_half)
    w_inside = jnp.sin((m + 0.5) * theta) / jnp.where(sin_half == 0, 1, sin_half)
    cosh_ratio = jnp.cosh((m + 0.5) * t) / jnp.cosh(t / 2)
    sinh_ratio = jnp.sinh((m + 0.5) * t) / jnp.where(t == 0, 1, jnp.sinh(t / 2))
    sign = jnp.where(n % 2 == 1, -1.0, 1.0)
    if kind == "v":
        outside = jnp.where(x > 0, cosh_ratio, sign * sinh_ratio)
        edge = jnp.where(x > 0, 1.0, sign * (2 * m + 1))
        interior = jnp.where(cos_half == 0, sign * (2 * m + 1), v_inside)
    else:
        outside = jnp.where(x > 0, sinh_ratio, sign * cosh_ratio)
        edge = jnp.where(x > 0, 2 * m + 1, sign)
        interior = jnp.where(sin_half == 0, 2 * m + 1, w_inside)
    return jnp.where(a == 1, edge, jnp.where(inside, interior, outside))


def _recurrence(step, x, n):
    """P_n(x) of a family with P_0 = 1 and P_{k+1} = step(k, x, P_k, P_{k-1}) (P_{-1} = 0), for n >= 0."""
    x, n = jnp.broadcast_arrays(x, n)
    top = jnp.max(n, initial=0)

    def body(state):
        k, previous, current, result = state
        following = step(k, x, current, previous)
        result = jnp.where(n == k + 1, following, result)
        return k + 1, current, following, result

    ones = jnp.ones_like(x)
    state = (jnp.zeros((), np.int64), jnp.zeros_like(x), ones, ones)
    return jax.lax.while_loop(lambda s: s[0] < top, body, state)[3]


def _fma(a, b, c):
    """a * b + c rounded once: the fused multiply-add PyTorch's CPU kernels compile to (exact for float32)."""
    if a.dtype != np.float32:
        return a * b + c
    return (a.astype(_F64) * b.astype(_F64) + c.astype(_F64)).astype(np.float32)


# P_{k+1} from k, x, P_k and P_{k-1}. Hermite values grow fast, so they are evaluated as PyTorch's CPU kernels
# do (in the input's precision, with fused multiply-adds); the others in float64.
_RECURRENCES = {
    "h": lambda k, x, p, q: _fma(x + x, p, -((2 * k).astype(x.dtype) * q)),
    "he": lambda k, x, p, q: _fma(x, p, -(k.astype(x.dtype) * q)),
    "l": lambda k, x, p, q: ((2 * k + 1 - x) * p - k * q) / (k + 1),
    "p": lambda k, x, p, q: ((2 * k + 1) * x * p - k * q) / (k + 1),
}


def _orthogonal(kind, shifted=False):
    def polynomial(x, n):
        (x,) = dtypes.floating(x) if kind in ("h", "he") else _wide(x)
        x = 2 * x - 1 if shifted else x
        degree = _degree(n)
        x, degree = jnp.broadcast_arrays(x, degree)
        safe = jnp.maximum(degree, 0)
        if kind in _RECURRENCES:
            value = _recurrence(_RECURRENCES[kind], x, safe)
        else:
            value = _chebyshev(kind, x, safe)
        value = jnp.where(degree == 0, 1.0, jnp.where(jnp.isnan(x), jnp.nan, value))
        return jnp.where(degree < 0, 0.0, value)

    return polynomial


for _kind, _name in (
    ("t", "chebyshev_polynomial_t"),
    ("u", "chebyshev_polynomial_u"),
    ("v", "chebyshev_polynomial_v"),
    ("w", "chebyshev_polynomial_w"),
    ("h", "hermite_polynomial_h"),
    ("he", "hermite_polynomial_he"),
    ("l", "laguerre_polynomial_l"),
    ("p", "legendre_polynomial_p"),
):
    _packet = getattr(aten, "special_" + _name)
    lower(_packet.default, _packet.x_scalar, _packet.n_scalar)(_orthogonal(_kind))
    if _kind in "tuvw":
        _packet = getattr(aten, "special_shifted_" + _name)
        lower(_packet.default, _packet.x_scalar, _packet.n_scalar)(_orthogonal(_kind, shifted=True))


# ---------------------------------------------------------------- gamma, zeta and the normal distribution


@lower(aten.igamma.default)
def igamma(self, other):
    a, x = _wide(self, other)
    return _incomplete_gamma(a, x, upper=False)


@lower(aten.igammac.default)
def igammac(self, other):
    a, x = _wide(self, other)
    return _incomplete_gamma(a, x, upper=True)


def _incomplete_gamma(a, x, upper):
    """The regularized lower (upper) incomplete gamma function with PyTorch's values at a = 0 and x = 0."""
    value = special.gammaincc(a, x) if upper else special.gammainc(a, x)
    invalid = (a < 0) | (x < 0) | ((a == 0) & (x == 0))
    value = jnp.where(a == 0, float(not upper), value)
    value = jnp.where(x == 0, float(upper), value)
    value = jnp.where(x == jnp.inf, float(not upper), value)
    return jnp.where(invalid | jnp.isnan(a) | jnp.isnan(x), jnp.nan, value)


@lower(aten.mvlgamma.default)
def mvlgamma(self, p):
    (x,) = _wide(self)
    total = sum(jax.lax.lgamma(x - j / 2) for j in range(p))
    return total + p * (p - 1) / 4 * math.log(math.pi)


@lower(aten.special_zeta.default, aten.special_zeta.other_scalar, aten.special_zeta.self_scalar)
def special_zeta(self, other):
    return _zeta(*_wide(self, other))


def _zeta(x, q):
    """Hurwitz zeta(x, q) = sum_k (k + q)^-x; a negative q sums its first terms directly (as Cephes does), in one
    loop of as many steps as the most negative q needs (64 unrolled float64 powers would keep a TPU's compiler busy
    for minutes), with the float64-accurate power there (ops/emulated.py)."""
    x, q = jnp.broadcast_arrays(x, q)
    shifts = jnp.clip(jnp.ceil(-q), 0, 64)

    def add_term(k, head):
        return head + jnp.where(k < shifts, emulated.power(q + k, -x), 0.0)

    steps = jnp.max(shifts, initial=0).astype(jnp.int32)
    head = jax.lax.fori_loop(0, steps, add_term, jnp.zeros_like(q))
    value = head + special.zeta(x, q + shifts)
    pole = (q <= 0) & (q == jnp.floor(q))
    value = jnp.where(pole, jnp.inf, jnp.where((q < 0) & (x != jnp.floor(x)), jnp.nan, value))
    return jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, value))


def _digamma(x):
    """digamma as PyTorch's CPU kernel computes it: reflected below 0 (psi(1 - x) - pi / tan(pi x), the tangent of
    x's fractional part), raised to 10 by the recurrence, then the asymptotic series; NaN at the negative integers,
    -inf at +0 and +inf at -0, +inf at +inf (which the TPU's float64 emulation made NaN: the sixth device run).
    Written out rather than `lax.digamma`, whose float64 expansion XLA's TPU backend cannot compile
    ("shift-right-arithmetic with different element types")."""
    reflected = x < 0
    fraction = x - jnp.trunc(x)  # as C's modf: exact, with x's sign
    correction = jnp.where(reflected, -math.pi / jnp.tan(math.pi * jnp.where(fraction == 0, 0.5, fraction)), 0.0)
    y = jnp.where(reflected, 1 - x, x)
    for _ in range(10):
        small = y < 10
        correction = correction - jnp.where(small, 1 / y, 0.0)
        y = jnp.where(small, y + 1, y)
    z = 1 / (y * y)
    series = z * (1 / 12 - z * (1 / 120 - z * (1 / 252 - z * (1 / 240 - z * (1 / 132 - z * (691 / 32760 - z / 12))))))
    value = jnp.log(y) - 0.5 / y - series + correction
    value = jnp.where((x < 0) & (fraction == 0), jnp.nan, jnp.where(x == jnp.inf, jnp.inf, value))
    return jnp.where(x == 0, copysign(jnp.full_like(x, jnp.inf), -x), value)


@lower(aten.digamma.default)
def digamma(self):
    return _digamma(*_wide(self))


def _trigamma(x):
    """polygamma(1, x) in x's precision, as PyTorch's CPU kernel computes it: reflected below 1/2 (which keeps
    its rounding near the poles), shifted up by six, then an asymptotic series."""
    pi = np.asarray(np.pi, x.dtype)
    reflected = x < 0.5
    sine = jnp.sin(pi * x)
    result = jnp.where(reflected, -(pi * pi) / (sine * sine), 0)
    x = jnp.where(reflected, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    inverse_square = 1 / (x * x)
    series = 1 + 1 / (2 * x) + inverse_square * (1 / 6 - inverse_square * (1 / 30 - inverse_square / 42))
    return jnp.where(reflected, -1, 1) * (result + series / x)


@lower(aten.polygamma.default)
def polygamma(n, self):
    """digamma for n = 0, trigamma for n = 1, else (-1)^(n+1) n! zeta(n + 1, x)."""
    (x,) = dtypes.floating(self)
    if n == 1:
        return _trigamma(x.astype(np.float32 if x.dtype.itemsize <= 4 else _F64))
    x = x.astype(_F64)
    if n == 0:
        return _digamma(x)
    value = (-1) ** (n + 1) * math.factorial(n) * _integer_zeta(n + 1, x)
    return jnp.where(x == jnp.inf, jnp.nan, value)


# Euler-Maclaurin's coefficients B_2j / (2j)! for j = 1..6, and where the tail starts: q shifted past _TAIL_START (as
# Cephes' zeta, PyTorch's CPU kernel), at most _MAX_SHIFT further for a negative q (beyond it a float32 is an
# integer: a pole).
_BERNOULLI = (1 / 12, -1 / 720, 1 / 30240, -1 / 1209600, 1 / 47900160, -691 / 1307674368000)
_TAIL_START = 10
_MAX_SHIFT = 1 << 24


def _integer_zeta(s: int, q):
    """Hurwitz zeta(s, q) for an integer order s >= 2 (polygamma's): the terms (q + k)^-s up to q + k >= 10, then
    the Euler-Maclaurin tail. Integer powers only: a TPU's float64 emulation keeps them accurate where its `pow` is
    float32-accurate, and the loop is one While that XLA compiles once (64 unrolled float64 pows took the chip's
    compiler minutes)."""
    finite = jnp.isfinite(q)
    base = jnp.where(finite, q, 1.0)
    count = _TAIL_START + jnp.clip(jnp.ceil(-base), 0, _MAX_SHIFT).astype(np.int32)

    def add_term(k, total):
        return total + jnp.where(k < count, jax.lax.integer_pow(base + k.astype(q.dtype), -s), 0.0)

    head = jax.lax.fori_loop(0, jnp.max(count, initial=_TAIL_START), add_term, jnp.zeros_like(q))
    inverse = 1 / (base + count.astype(q.dtype))
    tail = jax.lax.integer_pow(inverse, s - 1) / (s - 1) + jax.lax.integer_pow(inverse, s) / 2
    rising, power = s, jax.lax.integer_pow(inverse, s + 1)  # s (s+1) ... (s+2j-2), w^-(s+2j-1)
    for j, coefficient in enumerate(_BERNOULLI, start=1):
        tail = tail + coefficient * rising * power
        rising, power = rising * (s + 2 * j - 1) * (s + 2 * j), power * inverse * inverse
    pole = (q <= 0) & (q == jnp.floor(q))
    return jnp.where(pole, jnp.inf, jnp.where(jnp.isnan(q), jnp.nan, head + tail))


@lower(aten.polygamma_.default)
def polygamma_(self, n):
    return polygamma(n, self)


@lower(aten.special_entr.default)
def special_entr(self):
    (x,) = _wide(self)
    return jnp.where(x == 0, 0.0, jnp.where(x < 0, -jnp.inf, -x * jnp.log(jnp.where(x > 0, x, 1.0))))


@lower(aten.special_ndtri.default)
def special_ndtri(self):
    (p,) = _wide(self)
    return special.ndtri(p)


@lower(aten.special_log_ndtr.default)
def special_log_ndtr(self):
    (x,) = _wide(self)
    return special.log_ndtr(x)
