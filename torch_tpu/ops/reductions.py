"""Lowerings: reductions and scans.

As on PyTorch's CPU backend, bf16/fp16 inputs accumulate in float32 and integer/bool sums and products
accumulate in int64; the dispatcher casts each result to the dtype PyTorch's meta kernel reports.
"""

import math

import jax
import jax.numpy as jnp
import torch

from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import dtypes


def _axes(x, dim):
    """Normalized reduction axes; None (all axes) for `dim` None or empty, and for 0-d inputs."""
    if dim is None or x.ndim == 0:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return None
    return tuple(d % x.ndim for d in dims)


def _wide(x):
    """`x` in the dtype its reductions accumulate in: float32 for bf16/fp16."""
    if dtypes.is_floating(x.dtype) and jnp.finfo(x.dtype).bits < 32:
        return x.astype(jnp.float32)
    return x


def _as(x, dtype):
    """`x` converted to the explicit `dtype=` argument, if any, then widened."""
    return _wide(x if dtype is None else x.astype(dtypes.to_jax(dtype)))


def _integral(x):
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _summable(x, dtype):
    """`x` ready to sum or multiply: integers and bool promote to int64 as in PyTorch."""
    x = _as(x, dtype)
    return x.astype(jnp.int64) if _integral(x) else x


def _floating(x):
    """`x` as a floating (or complex) array: integers and bool become the default float dtype."""
    if _integral(x):
        return x.astype(dtypes.to_jax(torch.get_default_dtype()))
    return _wide(x)


def _scan_axis(x, dim):
    """`x` as at least 1-d, and `dim` normalized (a 0-d input scans as one element)."""
    x = x.reshape(1) if x.ndim == 0 else x
    return x, dim % x.ndim


@lower(aten.sum.default, aten.sum.dim_IntList)
def sum(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(_summable(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.nansum(_summable(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.mean.default, aten.mean.dim)
def mean(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.mean(_as(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.prod.default, aten.prod.dim_int)
def prod(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.prod(_summable(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


def _check_nonempty(x, name):
    if x.size == 0:
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim "
            "with the 'dim' argument."
        )


@lower(aten.max.default)
def max(self):
    _check_nonempty(self, "max")
    return jnp.max(self)


@lower(aten.min.default)
def min(self):
    _check_nonempty(self, "min")
    return jnp.min(self)


def _reduced_shape(x, dim, keepdim):
    if x.ndim == 0:
        return ()
    axis = dim % x.ndim
    return x.shape[:axis] + ((1,) if keepdim else ()) + x.shape[axis + 1:]


def _arg_extreme(x, dim, keepdim, largest):
    """Index of the first maximum (minimum) along `dim`, NaN counting as the extreme, as on PyTorch CPU."""
    if dim is None:
        index = _arg_extreme(x.reshape(-1), 0, False, largest)
        return index.reshape((1,) * x.ndim) if keepdim else index
    flat, axis = _scan_axis(x.astype(jnp.int8) if x.dtype == jnp.bool_ else x, dim)
    find = jnp.argmax if largest else jnp.argmin
    return find(flat, axis=axis, keepdims=True).reshape(_reduced_shape(x, dim, keepdim))


@lower(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=True)


@lower(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    return _arg_extreme(self, dim, keepdim, largest=False)


def _with_index(x, dim, keepdim, largest):
    flat, axis = _scan_axis(x, dim)
    index = _arg_extreme(flat, axis, True, largest)
    shape = _reduced_shape(x, dim, keepdim)
    return jnp.take_along_axis(flat, index, axis=axis).reshape(shape), index.reshape(shape)


@lower(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return _with_index(self, dim, keepdim, largest=True)


@lower(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return _with_index(self, dim, keepdim, largest=False)


@lower(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    if dim is None:
        shape = (1,) * self.ndim if keepdim else ()
        return jnp.min(self).reshape(shape), jnp.max(self).reshape(shape)
    return amin(self, dim, keepdim), amax(self, dim, keepdim)


def _moments(x, dim, correction, keepdim):
    """(variance, mean) over `dim` with Bessel-style `correction` (default 1); variance is real."""
    x = _floating(x)
    axes = _axes(x, dim)
    count = math.prod(x.shape[a] for a in (range(x.ndim) if axes is None else axes))
    centre = jnp.mean(x, axis=axes, keepdims=True)
    deviation = jnp.abs(x - centre) if dtypes.is_complex(x.dtype) else x - centre
    divisor = jnp.maximum(count - (1 if correction is None else correction), 0)
    variance = jnp.sum(deviation * deviation, axis=axes, keepdims=keepdim) / divisor
    return variance, centre if keepdim else jnp.squeeze(centre, axes)


@lower(aten.var.correction)
def var(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_moments(self, dim, correction, keepdim)[0])


@lower(aten.var_mean.correction)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)


@lower(aten.std_mean.correction)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    variance, centre = _moments(self, dim, correction, keepdim)
    return jnp.sqrt(variance), centre


@lower(aten.any.default, aten.any.dim, aten.any.dims)
def any(self, dim=None, keepdim=False):
    if isinstance(dim, (list, tuple)) and not dim:
        return self != 0
    return jnp.any(self != 0, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.all.default, aten.all.dim, aten.all.dims)
def all(self, dim=None, keepdim=False):
    if isinstance(dim, (list, tuple)) and not dim:
        return self != 0
    return jnp.all(self != 0, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=_axes(self, dim), dtype=jnp.int64)


@lower(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    return jax.nn.logsumexp(_floating(self), axis=_axes(self, dim), keepdims=keepdim)


def _vector_norm(x, ord, dim, keepdim):
    """The `ord`-norm of real or complex `x` over `dim` (a Python number `ord`, inf allowed)."""
    x = jnp.abs(_wide(x))
    axes = _axes(x, dim)
    if ord == math.inf:
        return jnp.max(x, axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(x, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(x != 0, axis=axes, keepdims=keepdim, dtype=x.dtype)
    if ord == 1:
        return jnp.sum(x, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    return jnp.sum(x**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lower(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(self if dtype is None else self.astype(dtypes.to_jax(dtype)), ord, dim, keepdim)


@lower(aten.norm.Scalar, static=("p",))
def norm(self, p=2):
    return _vector_norm(self, p, None, False)


@lower(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype, aten.norm.ScalarOpt_dtype, static=("p",))
def norm_dim(self, p, dim=None, keepdim=False, *, dtype=None):
    return linalg_vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@lower(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
    x, axis = _scan_axis(_summable(self, dtype), dim)
    return jnp.cumsum(x, axis=axis).reshape(self.shape)


@lower(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
    x, axis = _scan_axis(_summable(self, dtype), dim)
    return jnp.cumprod(x, axis=axis).reshape(self.shape)


@lower(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(self, dim):
    x, axis = _scan_axis(_floating(self), dim)
    return jax.lax.cumlogsumexp(x, axis=axis).reshape(self.shape)


def _running_extreme(x, dim, largest):
    """(values, indices) of the running maximum (minimum) along `dim`; ties and NaNs take the later index."""
    flat, axis = _scan_axis(x, dim)
    positions = jax.lax.broadcasted_iota(jnp.int64, flat.shape, axis)

    def combine(earlier, later):
        (a, i), (b, j) = earlier, later
        beats = (b >= a) if largest else (b <= a)
        take = jnp.isnan(b) | (~jnp.isnan(a) & beats) if dtypes.is_floating(flat.dtype) else beats
        return jnp.where(take, b, a), jnp.where(take, j, i)

    values, indices = jax.lax.associative_scan(combine, (flat, positions), axis=axis)
    return values.reshape(x.shape), indices.reshape(x.shape)


@lower(aten.cummax.default)
def cummax(self, dim):
    return _running_extreme(self, dim, largest=True)


@lower(aten.cummin.default)
def cummin(self, dim):
    return _running_extreme(self, dim, largest=False)
