"""Lowerings: random sampling. Each receives a fresh threefry key (`key`) from the device RNG stream.

Values follow PyTorch's distributions and ranges, not its CPU bit streams; `torch.manual_seed` makes them
reproducible. Floating samples of 16-bit dtypes are drawn in float32 and rounded, as PyTorch's CPU kernels do.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu import random as tpu_random
from torch_tpu.ops.creation import write_out
from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import dtypes


def _key(key):
    return jax.random.wrap_key_data(key, impl="threefry2x32")


def _sample_dtype(dtype):
    """The dtype to draw floating samples in for an output of `dtype`."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    return jax.random.uniform(_key(key), shape, _sample_dtype(dtype), low, high)


def _normal(key, shape, dtype):
    return jax.random.normal(_key(key), shape, _sample_dtype(dtype))


@lower(aten.uniform.default, rng=True)
def uniform(self, from_=0.0, to=1.0, *, generator=None, key):
    return _uniform(key, self.shape, self.dtype, from_, to).astype(self.dtype)


@lower(aten.normal_.default, rng=True)
def normal_(self, mean=0.0, std=1.0, *, generator=None, key):
    return (_normal(key, self.shape, self.dtype) * std + mean).astype(self.dtype)


@lower(aten.normal.Tensor_float, rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return _normal(key, mean.shape, mean.dtype) * std + mean


@lower(aten.normal.float_Tensor, rng=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    return _normal(key, std.shape, std.dtype) * std + mean


@lower(aten.normal.Tensor_Tensor, rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return _normal(key, shape, jnp.result_type(mean, std)) * std + mean


def _bernoulli(key, shape, dtype, p):
    return (_uniform(key, shape, dtype) < p).astype(dtype)


@lower(aten.bernoulli.default, rng=True)
def bernoulli(self, *, generator=None, key):
    return _bernoulli(key, self.shape, self.dtype, self)


@lower(aten.bernoulli.p, aten.bernoulli_.float, aten.bernoulli.Tensor, rng=True)
def bernoulli_p(self, p=0.5, *, generator=None, key):
    return _bernoulli(key, self.shape, self.dtype, p)


def _upper_bound(dtype):
    """The largest value `random_` draws for `dtype`: 2**mantissa digits for floats, the maximum for integers."""
    if dtype == np.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)
    return int(jnp.iinfo(dtype).max)


def _random_range(key, shape, dtype, low, high):
    """Integers uniform in [low, high), drawn from 64 random bits reduced modulo the range, in `dtype`."""
    bits = jax.random.bits(_key(key), shape, np.uint64)
    span = high - low
    if span < 2**64:
        bits = bits % np.uint64(span)
    return (jax.lax.bitcast_convert_type(bits, np.int64) + np.int64(low)).astype(dtype)


@lower(aten.random.default, rng=True)
def random(self, *, generator=None, key):
    return _random_range(key, self.shape, self.dtype, 0, _upper_bound(self.dtype) + 1)


@lower(aten.random.to, rng=True)
def random_to(self, to, *, generator=None, key):
    return _random_range(key, self.shape, self.dtype, 0, to)


@lower(getattr(aten.random, "from"), rng=True)
def random_from(self, from_, to, *, generator=None, key):
    high = _upper_bound(self.dtype) + 1 if to is None else to
    return _random_range(key, self.shape, self.dtype, from_, high)


@lower(aten.exponential.default, rng=True)
def exponential(self, lambd=1.0, *, generator=None, key):
    return (jax.random.exponential(_key(key), self.shape, _sample_dtype(self.dtype)) / lambd).astype(self.dtype)


@lower(aten.geometric.default, rng=True)
def geometric(self, p, *, generator=None, key):
    u = 1.0 - _uniform(key, self.shape, self.dtype)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(self.dtype)


@lower(aten.log_normal.default, rng=True)
def log_normal(self, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(_normal(key, self.shape, self.dtype) * std + mean).astype(self.dtype)


@lower(aten.cauchy.default, rng=True)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None, key):
    u = _uniform(key, self.shape, self.dtype)
    return (median + sigma * jnp.tan(np.pi * (u - 0.5))).astype(self.dtype)


@lower(aten.multinomial.default, rng=True)
def multinomial(self, num_samples, replacement=False, *, generator=None, key):
    logits = jnp.log(self.astype(_sample_dtype(self.dtype)))
    if replacement:
        samples = jax.random.categorical(_key(key), logits, shape=(num_samples, *self.shape[:-1]))
        return jnp.moveaxis(samples, 0, -1).astype(np.int64)
    perturbed = logits + jax.random.gumbel(_key(key), self.shape, logits.dtype)
    return jax.lax.top_k(perturbed, num_samples)[1].astype(np.int64)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _permutation(key, n, dtype):
    return jax.random.permutation(_key(key), n).astype(dtype)


@kernel(aten.randperm.generator_out)
def randperm_out(n, *, generator=None, out):
    """`torch.randperm` allocates `out` and calls this overload (see `creation.factory_out`)."""
    return write_out(out, _permutation(tpu_random.next_key(generator), n, dtypes.to_jax(out.dtype)))
