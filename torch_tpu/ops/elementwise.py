"""Lowerings: pointwise ops (arithmetic, comparison, bitwise, math functions); activations are in `activation`.

Operands are cast to PyTorch's common dtype (`dtypes.result_type`, where the promotion rules live) and computed in
float32 for bfloat16/float16, as PyTorch's CPU kernels do; the dispatcher then casts to the output dtype PyTorch's
meta kernel reports.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.scipy import special

from torch_tpu.ops import emulated
from torch_tpu.ops.registry import LOWERINGS, aten, lower
from torch_tpu.runtime import checks, deprecation, dtypes, late_imports


def _is_integral(x) -> bool:
    return dtypes.is_integral(jnp.result_type(x))


# ---------------------------------------------------------------- arithmetic


def _check_alpha(dtype, alpha) -> None:
    """ATen's alpha_check of `alpha` against the operands' common dtype, with CPU's errors: PyTorch's meta kernels
    skip it for bool results and bool alphas (`bool_tensor.add(b, alpha=1.5)`, `int_tensor.add(i, alpha=True)`)."""
    result, given = dtypes.category(dtype), dtypes.category(jnp.result_type(alpha))
    if given == dtypes.Category.BOOL and result != dtypes.Category.BOOL:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if result <= dtypes.Category.INTEGER and given >= dtypes.Category.FLOATING:
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if result != dtypes.Category.COMPLEX and given == dtypes.Category.COMPLEX:
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex number.")


def _check_sub(self, other) -> None:
    """ATen's sub_check, which the meta kernels skip where the other operand is a float tensor: no bool operand."""
    bools = sum(jnp.result_type(x) == np.bool_ for x in (self, other))
    if bools == 2:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` "
            "operator instead."
        )
    if bools:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, "
            "use the `~` or `logical_not()` operator instead."
        )


@lower(aten.add.Tensor, aten.add.Scalar)
def add(self, other, alpha=1):
    dtype = dtypes.result_type(self, other)
    _check_alpha(dtype, alpha)
    a, b = dtypes.cast(dtype, self, other)
    return a + b * alpha


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    _check_sub(self, other)
    dtype = dtypes.result_type(self, other)
    _check_alpha(dtype, alpha)
    a, b = dtypes.cast(dtype, self, other)
    return a - b * alpha


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    return sub(other, self, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    a, b = dtypes.common(self, other, exact_numbers=True)
    return a * b


def true_divide(a, b):
    """`a / b`, correctly rounded as on CPU. XLA's algebraic simplifier rewrites a division by a broadcast (a
    scalar, a row, a constant) into a multiplication by the divisor's reciprocal, off by an ulp for a third of
    the quotients; an optimization barrier hides the broadcast from it (and goes away before code generation,
    so the broadcast still fuses into the division)."""
    a, b = jnp.broadcast_arrays(a, b)
    if dtypes.category(b.dtype) >= dtypes.Category.FLOATING:
        b = lax.optimization_barrier(b)
    return a / b


def _check_divisor(b) -> None:
    """CPU's integer division and remainder raise for a zero divisor: a device-side check (float divisors give
    IEEE inf/nan, unchecked)."""
    if dtypes.category(jnp.result_type(b)) == dtypes.Category.INTEGER:
        checks.require(b != 0, RuntimeError, "ZeroDivisionError")


def _floor_divide(a, b, narrow=lambda v: v):
    """Python floor division, PyTorch's way (floats: fmod-based, IEEE result for a zero divisor); `narrow` rounds
    each step's result as CPU's 16-bit kernels do (`_quotient_rounding`)."""
    if _is_integral(a):
        _check_divisor(b)
        a, b = jnp.broadcast_arrays(a, b)
        quotient = lax.div(a, b)  # one division: a TPU emulates 64-bit ones, each seconds of compile time
        return jnp.where((a - quotient * b != 0) & ((a < 0) != (b < 0)), quotient - 1, quotient)
    mod = narrow(_fmod(a, b))
    div = narrow(true_divide(narrow(a - mod), b))
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), narrow(div - 1), div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    quotient = true_divide(a, b)
    floor = jnp.where(div == 0, copysign(jnp.zeros_like(div), quotient), floor)
    return jnp.where(b == 0, quotient, floor)


def _quotient_rounding(self, other):
    """The rounding of each step of a floor or trunc division: CPU's 16-bit float kernels compute in float32 for
    a single-element divisor, but round every intermediate (the quotient too) to the 16-bit type for a tensor."""
    dtype = dtypes.result_type(self, other)
    if dtypes.compute_dtype(dtype) == dtype or dtypes.is_number(other) or jnp.size(other) == 1:
        return lambda v: v
    return lambda v: v.astype(dtype).astype(jnp.float32)


@lower(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return true_divide(*dtypes.floating(self, other, exact_numbers=True))
    narrow = _quotient_rounding(self, other)
    a, b = dtypes.common(self, other, exact_numbers=True)  # a 16-bit float divides by the number's float32 value
    if rounding_mode == "floor":
        return _floor_divide(a, b, narrow)
    _check_divisor(b)
    return lax.div(*jnp.broadcast_arrays(a, b)) if _is_integral(a) else jnp.trunc(narrow(true_divide(a, b)))


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self, other):
    return _floor_divide(*dtypes.common(self, other, exact_numbers=True), _quotient_rounding(self, other))


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(self, other):
    a, b = dtypes.common(self, other)
    _check_divisor(b)
    mod = _fmod(a, b)
    return jnp.where((mod != 0) & ((mod < 0) != (b < 0)), mod + b, mod)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(self, other):
    a, b = dtypes.common(self, other)
    _check_divisor(b)
    return _fmod(a, b)


def _fmod(a, b):
    """C's fmod, where a finite dividend over an infinite divisor is the dividend: XLA's remainder on a TPU makes it
    NaN (the sixth device run: `floor_divide(5.0, inf)`, 0 on CPU, was NaN on a v5e)."""
    mod = jnp.fmod(a, b)
    if dtypes.category(mod.dtype) < dtypes.Category.FLOATING:
        return mod
    return jnp.where(jnp.isinf(b) & jnp.isfinite(a), a, mod)


def _integer_pow(base, exponent):
    """Exponentiation by squaring, wrapping like C++; negative exponents as PyTorch's powi (0 unless |base| is 1)."""
    base, exponent = jnp.broadcast_arrays(base, exponent)

    def step(_, carry):
        result, square, rest = carry
        return jnp.where(rest & 1 == 1, result * square, result), square * square, rest >> 1

    bits = jnp.iinfo(base.dtype).bits
    result, _, _ = lax.fori_loop(0, bits, step, (jnp.ones_like(base), base, jnp.maximum(exponent, 0)))
    if not jnp.issubdtype(base.dtype, jnp.signedinteger):
        return result
    odd = exponent & 1 == 1
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0)).astype(base.dtype)
    return jnp.where(exponent < 0, negative, result)


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow(self, exponent):
    scalar_exponent = dtypes.is_number(exponent)
    if scalar_exponent and _is_integral(self) and _is_integral(exponent):  # a tensor exponent follows powi instead
        checks.require(exponent >= 0, RuntimeError, "Integers to negative integer powers are not allowed.")
    base, cast = dtypes.common(self, exponent)
    if _is_integral(base) and base.dtype != np.bool_:
        return _integer_pow(base, cast)
    if emulated.applies(base.dtype):  # XLA's float64 pow is float32-accurate there
        power = emulated.pow(base, exponent if isinstance(exponent, (bool, int, float)) else cast)
    else:
        power = jnp.power(base, cast)
    if scalar_exponent and dtypes.is_floating(base.dtype):  # PyTorch's sqrt/rsqrt fast paths (-0.0, -inf)
        return jnp.where(cast == 0.5, jnp.sqrt(base), jnp.where(cast == -0.5, lax.rsqrt(base), power))
    return power


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    start, end = dtypes.common(self, end)
    weight = jnp.asarray(weight).astype(start.dtype)
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@lower(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    a, b, c = dtypes.common(self, tensor1, tensor2)
    return a + jnp.asarray(value, a.dtype) * b * c


@lower(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    a, b, c = dtypes.common(self, tensor1, tensor2)
    return a + true_divide(jnp.asarray(value, a.dtype) * b, c)


def fused_multiply_add(a, b, c):
    """Inductor's `prims.fma(a, b, c)`, a * b + c, which Dynamo writes for `addcmul_`/`addcdiv_` with a value and
    `add_` with a tensor alpha (a compiled for-loop Adam step holds it); XLA contracts it where the chip has an FMA."""
    a, b, c = dtypes.common(a, b, c)
    return a * b + c


def _lower_inductor_prims(module: types.ModuleType) -> None:
    fma = torch.ops.prims.fma.default
    if fma not in LOWERINGS:
        lower(fma)(fused_multiply_add)


def lower_inductor_prims() -> None:
    """The lowerings of the prims Inductor defines, once it is imported (importing it costs a second)."""
    late_imports.after_import("torch._inductor.inductor_prims", _lower_inductor_prims)


# ---------------------------------------------------------------- binary tables


def _binary(fn, floating=False):
    promote = dtypes.floating if floating else dtypes.common
    return lambda self, other: fn(*promote(self, other))


def _xlogy(log):
    def xlogy(self, other):
        x, y = dtypes.floating(self, other)
        return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0, x * log(y)))

    return xlogy


def _heaviside(self, values):
    x, v = dtypes.common(self, values)
    return jnp.where(x == 0, v, (x > 0).astype(x.dtype))


_SAME_WIDTH_INT = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}


def signbit(x: jax.Array) -> jax.Array:
    """Whether `x`'s sign bit is set (-0.0 and -nan too), read as the sign of the same-width integer. jnp.signbit
    shifts the bits right by a weakly typed count, which XLA's TPU compiler rejects after layout ("shift-right-
    arithmetic with different element types: s32 and u32", a v5e, float32)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x < 0
    return lax.bitcast_convert_type(x, _SAME_WIDTH_INT[x.dtype.itemsize]) < 0


def copysign(x: jax.Array, y: jax.Array) -> jax.Array:
    """|x| with the sign bit of `y` (jnp.copysign goes through jnp.signbit: see `signbit`)."""
    magnitude = jnp.abs(x)
    return jnp.where(signbit(y), -magnitude, magnitude)


def _atan2(self, other):
    y, x = dtypes.floating(self, other)
    return emulated.atan2(y, x) if emulated.applies(y.dtype) else jnp.arctan2(y, x)


def _copysign(self, other):
    x, y = dtypes.floating(self, other)
    return copysign(x, y)


_BINARY = {
    (aten.maximum.default,): jnp.maximum,
    (aten.minimum.default,): jnp.minimum,
    (aten.fmax.default,): jnp.fmax,
    (aten.fmin.default,): jnp.fmin,
    (aten.gcd.default,): jnp.gcd,
    (aten.lcm.default,): jnp.lcm,
    (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor): jnp.bitwise_and,
    (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor): jnp.bitwise_or,
    (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor): jnp.bitwise_xor,
    (aten.eq.Tensor, aten.eq.Scalar): jnp.equal,
    (aten.ne.Tensor, aten.ne.Scalar): jnp.not_equal,
    (aten.lt.Tensor, aten.lt.Scalar): jnp.less,
    (aten.le.Tensor, aten.le.Scalar): jnp.less_equal,
    (aten.gt.Tensor, aten.gt.Scalar): jnp.greater,
    (aten.ge.Tensor, aten.ge.Scalar): jnp.greater_equal,
}
_FLOAT_BINARY = {
    (aten.hypot.default,): jnp.hypot,
    (aten.logaddexp.default,): jnp.logaddexp,
    (aten.logaddexp2.default,): jnp.logaddexp2,
}
_LOGICAL = {
    aten.logical_and.default: jnp.logical_and,
    aten.logical_or.default: jnp.logical_or,
    aten.logical_xor.default: jnp.logical_xor,
}

for _ops, _fn in _BINARY.items():
    lower(*_ops)(_binary(_fn))
for _ops, _fn in _FLOAT_BINARY.items():
    lower(*_ops)(_binary(_fn, floating=True))
for _op, _fn in _LOGICAL.items():
    lower(_op)(_binary(lambda a, b, fn=_fn: fn(a.astype(bool), b.astype(bool))))
lower(aten.atan2.default)(_atan2)
lower(aten.copysign.Tensor, aten.copysign.Scalar)(_copysign)
lower(aten.heaviside.default)(_heaviside)
lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)(_xlogy(jnp.log))
lower(aten.special_xlog1py.default, aten.special_xlog1py.other_scalar, aten.special_xlog1py.self_scalar)(
    _xlogy(jnp.log1p)
)


@lower(aten.nextafter.default)
def nextafter(self, other):
    dtype = dtypes.result_type(self, other)
    return jnp.nextafter(jnp.asarray(self, dtype), jnp.asarray(other, dtype))


def _shift(left):
    def shift(self, other):
        a, b = jnp.broadcast_arrays(*dtypes.common(self, other))
        bits = jnp.iinfo(a.dtype).bits
        in_range = (b >= 0) & (b < bits)
        amount = jnp.where(in_range, b, 0)
        if left:
            return jnp.where(in_range, lax.shift_left(a, amount), 0)
        overflow = a >> (bits - 1) if jnp.issubdtype(a.dtype, jnp.signedinteger) else jnp.zeros_like(a)
        return jnp.where(in_range, a >> amount, overflow)

    return shift


lower(
    aten.bitwise_left_shift.Tensor,
    aten.bitwise_left_shift.Tensor_Scalar,
    aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor,
    aten.__lshift__.Scalar,
)(_shift(left=True))
lower(
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor,
    aten.__rshift__.Scalar,
)(_shift(left=False))


@lower(aten.where.self)
def where(condition, self, other):
    if condition.dtype == np.uint8:  # read as a bool condition, as on CPU
        deprecation.warn(
            "where received a uint8 condition tensor. This behavior is deprecated and will be removed in a future "
            "version of PyTorch. Use a boolean condition instead."
        )
    a, b = dtypes.common(self, other)
    return jnp.where(condition, a, b)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(self, min=None, max=None):
    x, low, high = dtypes.common(self, min, max)
    if low is not None:
        x = jnp.maximum(x, low)
    return x if high is None else jnp.minimum(x, high)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):
    return jnp.maximum(*dtypes.common(self, min))


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):
    return jnp.minimum(*dtypes.common(self, max))


# ---------------------------------------------------------------- unary


def _unary_float(fn):
    return lambda self: fn(dtypes.floating(self)[0])


def _lgamma(x):
    """lgamma through float64: XLA's float32 lgamma is off by up to ~1e-3 relative near its roots at 1 and 2 (1381
    ulp on XLA:CPU, 1.6e-3 on a TPU v5e), its float64 one matches CPU on both (measured, docs/numerics.md)."""
    return lax.lgamma(x.astype(np.float64)).astype(x.dtype)


def _angle(x):
    if dtypes.is_complex(x.dtype):
        return jnp.angle(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0).astype(x.dtype))


_FLOAT_UNARY = {
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.reciprocal.default: jnp.reciprocal,
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: special.erf,
    aten.erfc.default: special.erfc,
    aten.erfinv.default: special.erfinv,
    aten.lgamma.default: _lgamma,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.sinc.default: jnp.sinc,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
    aten.i0.default: special.i0,
    aten.special_i0e.default: special.i0e,
    aten.special_i1.default: special.i1,
    aten.special_i1e.default: special.i1e,
    aten.special_erfcx.default: special.erfcx,
    aten.angle.default: _angle,
}
_EXACT_UNARY = {
    aten.neg.default: jnp.negative,
    aten.abs.default: jnp.abs,
    aten.bitwise_not.default: jnp.invert,
    aten.logical_not.default: lambda x: ~jnp.asarray(x).astype(bool),
    aten.signbit.default: signbit,
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isposinf.default: jnp.isposinf,
    aten.isneginf.default: jnp.isneginf,
}
_ROUNDING = {
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.trunc.default: jnp.trunc,
    aten.frac.default: lambda x: x - jnp.trunc(x),
}

for _op, _fn in _FLOAT_UNARY.items():
    lower(_op)(_unary_float(_fn))
for _op, _fn in _EXACT_UNARY.items():
    lower(_op)(_fn)
for _op, _fn in _ROUNDING.items():
    lower(_op)(lambda self, fn=_fn: self if _is_integral(self) else fn(self))


@lower(aten.round.default, aten.round.decimals)
def round(self, *, decimals=0):
    if _is_integral(self):
        return self
    (x,) = dtypes.common(self)
    if decimals >= 0:
        scale = jnp.asarray(10.0**decimals, x.dtype)  # as CPU, in the input's dtype
        return true_divide(jnp.round(x * scale), scale)
    scale = jnp.asarray(10.0**-decimals, x.dtype)
    return jnp.round(true_divide(x, scale)) * scale


@lower(aten.sign.default)
def sign(self):
    if self.dtype == np.bool_:
        return self
    return (self > 0).astype(self.dtype) - (self < 0).astype(self.dtype)


@lower(aten.sgn.default)
def sgn(self):
    if not dtypes.is_complex(self.dtype):
        return sign(self)
    magnitude = jnp.abs(self)
    return jnp.where(magnitude == 0, 0, self / jnp.where(magnitude == 0, 1, magnitude))


@lower(aten.frexp.Tensor)
def frexp(self):
    return jnp.frexp(dtypes.floating(self)[0])


@lower(aten._conj_physical.default, aten.conj_physical_.default)
def _conj_physical(self):
    return jnp.conj(self)


@lower(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if _is_integral(self):
        return self
    info = jnp.finfo(self.dtype)
    x = jnp.where(jnp.isnan(self), 0.0 if nan is None else nan, self)
    x = jnp.where(x == jnp.inf, info.max if posinf is None else posinf, x)
    return jnp.where(x == -jnp.inf, info.min if neginf is None else neginf, x)
