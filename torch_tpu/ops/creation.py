"""Lowerings: creation (ranges, identity, triangles, complex from parts).

PyTorch's factory functions (`arange`, `linspace`, `logspace`, `eye`; `randperm` in ops.random) are
CompositeExplicit kernels that allocate `out` and call the factory's `out=` overload, so that overload is what
reaches the device: it is registered as a direct kernel (`factory_out`) that computes the values at `out`'s dtype.
Every argument of these factories is static, so a device program would compile for each distinct call: up to
`HOST_FACTORY_LIMIT` elements the values are PyTorch's CPU kernel's (bit-identical by construction), transferred;
larger ones compile their program.
"""

import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.ops import emulated
from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import dtypes, storage

_INT64 = np.dtype(np.int64)


HOST_FACTORY_LIMIT = 1 << 16


def factory_out(fn, op, numel, ranged=False):
    """The kernel of `op`, a factory's `out=` overload: `op` on CPU, transferred, when `numel(*args)` (the output's
    size, or None if unknown) is at most HOST_FACTORY_LIMIT, else `fn(*args, dtype=...)` jitted per argument set;
    written as `write_out` does, for a range (`ranged`) keeping an `out` of the range's size in its own shape."""
    compiled = jax.jit(fn, static_argnames=tuple(inspect.signature(fn).parameters))

    def out_kernel(*args, out, **kwargs):
        size = numel(*args, **kwargs)
        if size is not None and size <= HOST_FACTORY_LIMIT:
            host = op(*args, **kwargs, out=torch.empty(0, dtype=out.dtype))
            return write_out(out, storage.to_device(host), ranged)
        return write_out(out, compiled(*args, **kwargs, dtype=dtypes.to_jax(out.dtype)), ranged)

    return out_kernel


def _arange_numel(start, end, step=1):
    try:
        return max(math.ceil((float(end) - float(start)) / float(step)), 0)
    except (ZeroDivisionError, OverflowError, ValueError):
        return 0  # CPU's kernel raises its error


def _eye_numel(n, m=None):
    return n * (n if m is None else m)


def write_out(out, value, ranged=False):
    """Store `value` in `out` as CPU's factory kernels do: resize `out` to `value`'s shape (`resize_`: contiguous, at
    its storage offset), except that a range (`ranged`) leaves an `out` of as many elements in its own shape and
    layout and fills it in order. An `out` without storage (a factory's `empty(0)`) takes `value` as its buffer,
    since growing it and writing through it would compile per size."""
    shape = tuple(out.shape)
    if ranged and out.numel() == value.size:
        storage.write(out, value.reshape(shape) if shape != value.shape else value)
        return out
    if shape != value.shape and out.untyped_storage().nbytes() == 0:
        fresh = storage.wrap(value, out.dtype)
        return out.set_(fresh.untyped_storage(), 0, fresh.shape, fresh.stride())
    if shape != value.shape:
        out.resize_(value.shape)
    storage.write(out, value)
    return out


def _accumulation_dtype(dtype):
    """The dtype PyTorch's CPU range kernels compute in (`acc_type`): int64, float32 for 16-bit, else float64."""
    if not jnp.issubdtype(dtype, jnp.floating):
        return _INT64
    return np.dtype(np.float32 if dtype.itemsize < 4 else np.float64)


def _arange(start, end, step=1, *, dtype):
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    acc = _accumulation_dtype(dtype)
    if acc == _INT64:
        start, step = int(start), int(step)
    if dtype == _INT64:
        size = (int(end) - start + step - (1 if step > 0 else -1)) // step
    else:
        size = math.ceil((float(end) - float(start)) / float(step))
    return (start + step * jax.lax.iota(acc, size)).astype(dtype)


def linspace(start, end, steps, *, dtype):
    """`torch.linspace`'s values, computed as ATen does (from both ends, each half from its own end)."""
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    if steps == 1:
        return jnp.full((1,), start).astype(dtype)
    integral = jnp.issubdtype(dtype, jnp.integer)
    compute = np.dtype(np.float64) if integral else dtype
    start_v = jnp.asarray(int(start) if integral else start, compute)
    end_v = jnp.asarray(int(end) if integral else end, compute)
    step = (end_v - start_v) / jnp.asarray(max(steps - 1, 1), compute)
    index = jax.lax.iota(compute, steps)
    low = start_v + step * index
    high = end_v - step * (steps - 1 - index)
    return jnp.where(jnp.arange(steps) < steps // 2, low, high).astype(dtype)


def _logspace(start, end, steps, base=10.0, *, dtype):
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    if steps == 1:  # PyTorch raises `base` to the unrounded start
        return jnp.full((1,), np.power(np.float64(base), np.float64(start))).astype(dtype)
    start_v = jnp.asarray(start).astype(dtype).astype(np.float64)
    end_v = jnp.asarray(end).astype(dtype).astype(np.float64)
    step = (end_v - start_v) / max(steps - 1, 1)
    index = jax.lax.iota(np.float64, steps)
    exponent = jnp.where(index < steps // 2, start_v + step * index, end_v - step * (steps - 1 - index))
    return emulated.power(jnp.full_like(exponent, base), exponent).astype(dtype)  # float64-accurate on a TPU


def _eye(n, m=None, *, dtype):
    return jnp.eye(n, n if m is None else m, dtype=dtype)


def _steps(start, end, steps, base=None):
    return steps


kernel(aten.arange.start_out)(factory_out(_arange, aten.arange.start_out, _arange_numel, ranged=True))
kernel(aten.linspace.out)(factory_out(linspace, aten.linspace.out, _steps, ranged=True))
kernel(aten.logspace.out)(factory_out(_logspace, aten.logspace.out, _steps, ranged=True))
kernel(aten.eye.out)(factory_out(_eye, aten.eye.out, _eye_numel))
kernel(aten.eye.m_out)(factory_out(_eye, aten.eye.m_out, _eye_numel))


@functools.cache
def _triangle_indices(row, col, offset, lower_triangle):
    rows, cols = np.tril_indices(row, offset, col) if lower_triangle else np.triu_indices(row, offset, col)
    return np.stack([rows, cols]).astype(np.int64)


def _indices_kernel(lower_triangle):
    def indices(row, col, offset=0, *, dtype=torch.long, layout=None, device=None, pin_memory=None):
        value = jnp.asarray(_triangle_indices(row, col, offset, lower_triangle))
        return storage.wrap(value, dtype or torch.long)

    return indices


@kernel(aten._efficientzerotensor.default)
def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Dense zeros: CPU's is a lazy ZeroTensor, which autograd treats the same."""
    dtype = dtype or torch.get_default_dtype()
    return storage.wrap(jnp.zeros(tuple(size), dtypes.to_jax(dtype)), dtype)


kernel(aten.tril_indices.default)(_indices_kernel(True))
kernel(aten.triu_indices.default)(_indices_kernel(False))


@lower(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lower(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lower(aten.complex.default)
def complex(real, imag):
    return jax.lax.complex(*jnp.broadcast_arrays(real, imag))


@lower(aten.polar.default)
def polar(abs, angle):
    return complex(abs * jnp.cos(angle), abs * jnp.sin(angle))
