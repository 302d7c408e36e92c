"""float64 on the TPU where XLA's emulation of it is float32-accurate: `pow`, `atan2`, `prod`, and single values.

XLA's TPU backend emulates float64 with pairs of float32s. Measured on a v5e (bench/tpu_numerics.py --sections
float64, docs/numerics.md), its arithmetic, comparisons, `exp`, `log`, `atan`, `floor` and `round` keep float64
accuracy, but its own `pow`, `atan2` and `prod` (a multiply reduction) come back at float32 accuracy: a silent wrong
number. The lowerings call these formulations for float64 on a TPU (`applies`) and keep XLA's ops elsewhere; they
are plain JAX, so tests/runtime/test_float64_policy.py checks them on any platform against CPU PyTorch.

A one-element float64 array is the other case (the sixth device run, bench/tpu_numerics.py --sections
float64_rank): `exp`, `tanh` and `atan` of a 0-d or (1,) value err by ~4e-8, at every size from 2 up by ~1e-15, in
plain JAX too, and also on a vector's element taken inside a program. The registry lifts pointwise lowerings whose
operands are all single float64 values (`lifted`): each is broadcast to `_LIFT` elements behind an optimization
barrier (without it XLA's simplifier moves the broadcast after the op, back to one element), and the first element
of each result is the answer."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_tpu.runtime import platform

# The elements a single float64 value is computed among: on a v5e any count from 2 is accurate; 8 fills a sublane.
_LIFT = 8

# Integer exponents below this magnitude are raised by repeated multiplication (exact for small results, as CPU's
# pow is), the others as exp(y log|x|); 2**_POWER_BITS bounds the squarings each element does.
_POWER_BITS = 6


def applies(dtype: object) -> bool:
    """Whether a lowering of `dtype` uses these formulations: float64 on a TPU."""
    return np.dtype(dtype) == np.float64 and platform.platform() == "tpu"


def _negative(x: jax.Array) -> jax.Array:
    """x's sign bit by comparisons (-0.0 included): no bitcast of the emulated float64 pair."""
    return (x < 0) | ((x == 0) & (1 / x < 0))


def _integer_power(x: jax.Array, n: jax.Array) -> jax.Array:
    """x**n for integer-valued |n| < 2**_POWER_BITS by squaring, with the exponent's bits taken in float64."""
    result, square, rest = jnp.ones_like(x), x, jnp.abs(n)
    for _ in range(_POWER_BITS):
        half = jnp.floor(rest * 0.5)
        result = jnp.where(rest - 2 * half == 1, result * square, result)
        square, rest = square * square, half
    return jnp.where(n < 0, 1 / result, result)


def pow(x: jax.Array, y: jax.Array | float) -> jax.Array:
    """x**y with C's (PyTorch's) special values: small integer exponents by multiplication, others exp(y log|x|)."""
    if isinstance(y, (int, float)) and float(y).is_integer() and abs(y) < 2**_POWER_BITS:
        return lax.integer_pow(x, int(y))
    y = jnp.asarray(y, x.dtype)
    integer = y == jnp.round(y)  # infinities count as even integers, as in C
    odd = integer & (jnp.round(y * 0.5) != y * 0.5)
    magnitude = jnp.exp(y * jnp.log(jnp.abs(x)))
    general = jnp.where(_negative(x) & odd, -magnitude, magnitude)
    general = jnp.where((x < 0) & (x > -jnp.inf) & ~integer, jnp.nan, general)  # a finite negative base
    general = jnp.where((y == 0) | (x == 1) | ((x == -1) & (jnp.abs(y) == jnp.inf)), 1.0, general)
    small = integer & (jnp.abs(y) < 2**_POWER_BITS)
    return jnp.where(small, _integer_power(x, jnp.where(small, y, 0)), general)


def atan2(y: jax.Array, x: jax.Array) -> jax.Array:
    """atan of the smaller magnitude over the larger (in [0, 1]), folded into its quadrant; zeros and infinities
    on both axes take C's exact multiples of pi/4."""
    y, x = jnp.broadcast_arrays(y, x)
    a, b = jnp.abs(y), jnp.abs(x)
    low, high = jnp.minimum(a, b), jnp.maximum(a, b)
    angle = jnp.arctan(jnp.where(high == 0, 0.0, low / high))  # 0 / 0: the +-0 axis
    angle = jnp.where(a > b, math.pi / 2 - angle, angle)
    left = _negative(x)
    angle = jnp.where(left, math.pi - angle, angle)
    corner = jnp.where(left, math.atan2(1, -1), math.atan2(1, 1))  # inf / inf
    angle = jnp.where((a == jnp.inf) & (b == jnp.inf), corner, angle)
    return jnp.where(_negative(y), -angle, angle)


def prod(x: jax.Array, axes: tuple[int, ...] | None, keepdims: bool) -> jax.Array:
    """The product over `axes` (None: all) as a log-depth tree of elementwise multiplies; empty: 1."""
    axes = tuple(range(x.ndim)) if axes is None else axes
    kept = [d for d in range(x.ndim) if d not in axes]
    count = math.prod(x.shape[d] for d in axes)
    flat = jnp.transpose(x, kept + list(axes)).reshape([x.shape[d] for d in kept] + [count])
    while flat.shape[-1] > 1:
        if flat.shape[-1] % 2:
            flat = jnp.concatenate([flat, jnp.ones_like(flat[..., :1])], axis=-1)
        flat = flat[..., 0::2] * flat[..., 1::2]
    result = flat[..., 0] if flat.shape[-1] else jnp.ones(flat.shape[:-1], x.dtype)
    return jnp.expand_dims(result, axes) if keepdims else result


def lifted(fn: Callable) -> Callable:
    """`fn`, a pointwise lowering, computing a single float64 value on the TPU among `_LIFT` copies of itself
    (see the module's docstring); any other call is `fn`'s own."""

    @functools.wraps(fn)
    def lowering(*args: Any, **kwargs: Any) -> Any:
        arrays = [x for x in (*args, *kwargs.values()) if _array(x)]
        if not _single_float64_values(arrays):
            return fn(*args, **kwargs)
        shape = (_LIFT, *arrays[0].shape)

        def lift(x: Any) -> Any:
            return lax.optimization_barrier(jnp.broadcast_to(x, shape)) if _array(x) else x

        result = fn(*map(lift, args), **{name: lift(value) for name, value in kwargs.items()})
        leaves = jax.tree.leaves(result)
        if not leaves or any(getattr(leaf, "shape", None) != shape for leaf in leaves):
            return fn(*args, **kwargs)  # a result not shaped as its operands: not one value per element
        return jax.tree.map(lambda leaf: leaf[0], result)

    return lowering


def _array(x: object) -> bool:
    """A tensor operand (traced or not): a Python number, traced as a weakly typed value, broadcasts as it is."""
    return isinstance(x, jax.Array) and not x.weak_type


def _single_float64_values(arrays: list) -> bool:
    """Operands all of one element and one rank (so that lifting keeps PyTorch's promotion between dimensioned and
    0-d tensors), one of them float64, on a TPU."""
    if not arrays or any(x.size != 1 or x.ndim != arrays[0].ndim for x in arrays):
        return False
    return any(applies(x.dtype) for x in arrays)


def power(x: jax.Array, y: jax.Array | float) -> jax.Array:
    """`x ** y`: the float64-accurate formulation on a TPU (`pow`), XLA's elsewhere."""
    return pow(x, y) if applies(x.dtype) else x**y


# the last step of a reduction to one element, lifted on a TPU in float64: a norm's root, logsumexp's log
single_power = lifted(power)
single_log = lifted(jnp.log)
