"""Lowerings: reductions and scans.

As on PyTorch's CPU backend, bf16/fp16 inputs accumulate in float32 and integer/bool sums and products
accumulate in int64; the dispatcher casts each result to the dtype PyTorch's meta kernel reports.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops import emulated
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


_wide = dtypes.upcast  # bf16/fp16 reduce in float32


def _as(x, dtype):
    """`x` converted to the explicit `dtype=` argument, if any, then widened."""
    return _wide(x if dtype is None else x.astype(dtypes.to_jax(dtype)))


def _summable(x, dtype):
    """`x` ready to sum or multiply: integers and bool promote to int64 as in PyTorch."""
    x = _as(x, dtype)
    return x.astype(dtypes.accumulation_dtype(x.dtype))


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
    x = _summable(self, dtype)
    if emulated.applies(x.dtype):  # XLA's float64 multiply reduction is float32-accurate there
        return emulated.prod(x, _axes(self, dim), keepdim)
    return jnp.prod(x, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


_SPECIFY_DIM = " Specify the reduction dim with the 'dim' argument."


def check_reducible(x, dim, name, *, specify=""):
    """PyTorch CPU's errors for a reduction without an identity over nothing: RuntimeError when an empty tensor is
    reduced over all dims, IndexError naming the first empty dim reduced over. (amax, amin, aminmax, argmax and
    kthvalue's own meta kernels raise before a lowering runs.)"""
    if x.size != 0:
        return
    axes = _axes(x, dim)
    if axes is None:
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.{specify}")
    for axis in axes:
        if x.shape[axis] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")


@lower(aten.max.default)
def max(self):
    check_reducible(self, None, "max", specify=_SPECIFY_DIM)
    return jnp.max(self)


@lower(aten.min.default)
def min(self):
    check_reducible(self, None, "min", specify=_SPECIFY_DIM)
    return jnp.min(self)


def _reduced_shape(x, dim, keepdim):
    if x.ndim == 0:
        return ()
    axis = dim % x.ndim
    return x.shape[:axis] + ((1,) if keepdim else ()) + x.shape[axis + 1 :]


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
    check_reducible(self, dim, "max")
    return _with_index(self, dim, keepdim, largest=True)


@lower(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    check_reducible(self, dim, "min")
    return _with_index(self, dim, keepdim, largest=False)


@lower(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    if dim is None:
        shape = (1,) * self.ndim if keepdim else ()
        return jnp.min(self).reshape(shape), jnp.max(self).reshape(shape)
    return amin(self, dim, keepdim), amax(self, dim, keepdim)


def _moments(x, dim, correction, keepdim):
    """(variance, mean) over `dim` with Bessel-style `correction` (default 1); variance is real."""
    x = dtypes.floating_for_reduction(x)
    axes = _axes(x, dim)
    count = math.prod(x.shape[a] for a in (range(x.ndim) if axes is None else axes))
    centre = jnp.mean(x, axis=axes, keepdims=True)
    deviation = jnp.abs(x - centre) if dtypes.is_complex(x.dtype) else x - centre
    divisor = jnp.maximum(count - (1 if correction is None else correction), 0)
    variance = jnp.sum(deviation * deviation, axis=axes, keepdims=keepdim) / divisor
    return variance, centre if keepdim else jnp.squeeze(centre, axes)


def _require_inexact(x):
    """CPU's std and var refuse integer and bool tensors (their meta kernel does not; std_mean's does)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError("std and var only support floating point and complex dtypes")


@lower(aten.var.correction)
def var(self, dim=None, *, correction=None, keepdim=False):
    _require_inexact(self)
    return _moments(self, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(self, dim=None, *, correction=None, keepdim=False):
    _require_inexact(self)
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
    x = dtypes.floating_for_reduction(self)
    if not emulated.applies(x.dtype):
        return jax.nn.logsumexp(x, axis=_axes(self, dim), keepdims=keepdim)
    return _logsumexp_float64(x, _axes(self, dim), keepdim)


def _logsumexp_float64(x, axes, keepdim):
    """jax.nn.logsumexp's formulation (the largest value taken out, or 0 where it is infinite), with the log of a
    one-element sum lifted (ops/emulated.py: the TPU's float64 log of one element is not float64-accurate)."""
    peak = jax.lax.stop_gradient(jnp.max(x, axis=axes, keepdims=True))
    peak = jnp.where(jnp.isfinite(peak), peak, 0)
    result = emulated.single_log(jnp.sum(jnp.exp(x - peak), axis=axes, keepdims=True)) + peak
    return result if keepdim else jnp.squeeze(result, axes)


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
    # the float64-accurate power and root on a TPU (ops/emulated.py)
    return emulated.single_power(jnp.sum(emulated.power(x, ord), axis=axes, keepdims=keepdim), 1.0 / ord)


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
    x, axis = _scan_axis(dtypes.floating_for_reduction(self), dim)
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


@lower(aten.hash_tensor.default)
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    """The XOR of the elements' 64-bit patterns (floats as float64, integers and bool as int64), over `dim`."""
    wide = self.astype(jnp.float64) if dtypes.is_floating(self.dtype) else self.astype(jnp.int64)
    bits = jax.lax.bitcast_convert_type(wide, jnp.uint64)
    axes = _axes(self, dim)
    axes = tuple(range(self.ndim)) if axes is None else axes
    hashed = jax.lax.reduce(bits, np.uint64(0), jax.lax.bitwise_xor, axes)
    return jnp.expand_dims(hashed, axes) if keepdim else hashed


def _segment_ids(size, lengths, offsets):
    """(segment of each of `size` positions, or the segment count S for positions outside every segment; S;
    segment lengths) for 1-D `lengths` or `offsets` (S + 1 boundaries)."""
    if offsets is None:
        ends = jnp.cumsum(lengths)
        first = jnp.zeros((), ends.dtype)
    else:
        lengths, ends, first = jnp.diff(offsets), offsets[1:], offsets[0]
    count = lengths.shape[0]
    position = jnp.arange(size)
    ids = jnp.searchsorted(ends, position, side="right")
    inside = (position >= first) & (position < (ends[-1] if count else first))
    return jnp.where(inside, ids, count), count, lengths


def _segment_reduce_1d(data, reduce, lengths, offsets, initial):
    """segment_reduce along axis 0 of `data` for 1-D lengths or offsets."""
    ids, count, lengths = _segment_ids(data.shape[0], lengths, offsets)
    segments = count + 1  # the last collects positions outside every segment; dropped
    shape = (count,) + (1,) * (data.ndim - 1)
    length = lengths.reshape(shape).astype(data.dtype)
    if reduce in ("sum", "mean"):
        total = jax.ops.segment_sum(data, ids, segments)[:count]
        total = total if initial is None else total + initial
        if reduce == "sum":
            return total
        mean = total / length
        return mean if initial is None else jnp.where(length == 0, jnp.asarray(initial, data.dtype), mean)
    combine = {"max": jax.ops.segment_max, "min": jax.ops.segment_min, "prod": jax.ops.segment_prod}[reduce]
    result = combine(data, ids, segments)[:count]
    if initial is None:
        return result
    initial = jnp.asarray(initial, data.dtype)
    return {"max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply}[reduce](result, initial)


def _over_segments(fn, lengths, offsets, axis, *arrays):
    """`fn(*arrays, lengths, offsets)` along `axis` (moved first), batched over the leading dims of 2-D and
    higher lengths/offsets (which equal `arrays`' dims before `axis`)."""
    boundaries = lengths if offsets is None else offsets
    batch = boundaries.ndim - 1
    arrays = [jnp.moveaxis(a, axis, batch) for a in arrays]

    def one(*values):
        *values, bounds = values
        return fn(*values, bounds if offsets is None else None, None if offsets is None else bounds)

    for _ in range(batch):
        one = jax.vmap(one)
    return jnp.moveaxis(one(*arrays, boundaries), batch, axis)


@lower(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    wide = _wide(data)
    fn = lambda values, lens, offs: _segment_reduce_1d(values, reduce, lens, offs, initial)
    return _over_segments(fn, lengths, offsets, axis % data.ndim, wide)


def _segment_backward_1d(grad, output, data, reduce, lengths, offsets, initial):
    ids, count, lengths = _segment_ids(data.shape[0], lengths, offsets)
    pad = [(0, 1)] + [(0, 0)] * (data.ndim - 1)  # a zero row for positions outside every segment
    spread = lambda x: jnp.pad(x, pad)[ids]
    inside = (ids < count).reshape((-1,) + (1,) * (data.ndim - 1))
    if reduce == "sum":
        return jnp.where(inside, spread(grad), 0)
    if reduce == "mean":
        length = lengths.reshape((count,) + (1,) * (data.ndim - 1)).astype(data.dtype)
        return jnp.where(inside, spread(grad / length), 0)
    if reduce in ("max", "min"):  # ties share a positive gradient, as PyTorch's CPU kernel does
        hit = inside & ((spread(output) == data) | jnp.isnan(data))
        ties = jax.ops.segment_sum(hit.astype(data.dtype), ids, count + 1)
        share = spread(grad)
        share = jnp.where((spread(ties[:count]) > 1) & (share > 0), share / spread(ties[:count]), share)
        return jnp.where(hit, share, 0)
    zero = data == 0
    others = jax.ops.segment_prod(jnp.where(zero, 1, data), ids, count + 1)[:count]
    others = others if initial is None else others * initial
    zeros = jax.ops.segment_sum(zero.astype(data.dtype), ids, count + 1)[:count]
    at_zero = jnp.where(spread(zeros) == 1, spread(others), 0)
    value = jnp.where(zero, at_zero, spread(output) / jnp.where(zero, 1, data))
    return jnp.where(inside, spread(grad) * value, 0)


@lower(aten._segment_reduce_backward.default)
def _segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    fn = lambda g, out, values, lens, offs: _segment_backward_1d(g, out, values, reduce, lens, offs, initial)
    return _over_segments(fn, lengths, offsets, axis % data.ndim, _wide(grad), _wide(output), _wide(data))
