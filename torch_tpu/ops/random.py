"""Lowerings: random sampling. Each receives a fresh threefry key (`key`) from the device RNG stream.

Values follow PyTorch's distributions and ranges, not its CPU bit streams; `torch.manual_seed` makes them
reproducible. Scalar arguments are checked as on CPU, at the call; tensor arguments (normal's std, bernoulli's p)
by device-side checks (runtime/checks.py), raised with CPU's error at the next synchronisation. Floating samples
of 16-bit dtypes are drawn in float32 and rounded, as PyTorch's CPU kernels do.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu import random as tpu_random
from torch_tpu.ops.creation import write_out
from torch_tpu.ops.registry import aten, kernel, lower
from torch_tpu.runtime import checks, dtypes

# The C++ names ATen's range checks print for a dtype ("from is out of bounds for signed char").
_CPP_NAMES = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long",
    np.dtype(np.float16): "c10::Half",
    np.dtype(jnp.bfloat16): "c10::BFloat16",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}


def _number(value):
    """A Scalar as c10 prints it in messages (1.0 as 1)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _limits(dtype):
    if dtype == np.bool_:
        return 0, 1
    if jnp.issubdtype(dtype, jnp.floating):
        return float(jnp.finfo(dtype).min), float(jnp.finfo(dtype).max)
    return int(jnp.iinfo(dtype).min), int(jnp.iinfo(dtype).max)


def _check_in_range(value, name, dtype):
    low, high = _limits(dtype)
    if not low <= value <= high:
        raise RuntimeError(f"{name} is out of bounds for {_CPP_NAMES.get(np.dtype(dtype), dtype)}")


def _check_floating(dtype, kernel):
    """ATen's dispatch error for a floating-only sampler asked for another dtype."""
    if not jnp.issubdtype(dtype, jnp.floating):
        name = repr(dtypes.to_torch(dtype)).removeprefix("torch.")
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{_ATEN_NAMES.get(name, name)}'")


_ATEN_NAMES = {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def threefry_key(data):
    """The typed JAX key of raw threefry key data: a random lowering's `key`, a compiled graph's key input."""
    return jax.random.wrap_key_data(data, impl="threefry2x32")


def _sample_dtype(dtype):
    """The dtype to draw floating samples in for an output of `dtype`."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    return jax.random.uniform(threefry_key(key), shape, _sample_dtype(dtype), low, high)


def _normal(key, shape, dtype):
    return jax.random.normal(threefry_key(key), shape, _sample_dtype(dtype))


@lower(aten.uniform.default, rng=True)
def uniform(self, from_=0.0, to=1.0, *, generator=None, key):
    _check_floating(self.dtype, "check_uniform_bounds")
    _check_in_range(from_, "from", self.dtype)
    _check_in_range(to, "to", self.dtype)
    if from_ > to:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={_number(from_)} > to={_number(to)}"
        )
    return _uniform(key, self.shape, self.dtype, from_, to).astype(self.dtype)


@lower(aten.normal_.default, rng=True)
def normal_(self, mean=0.0, std=1.0, *, generator=None, key):
    return (_normal(key, self.shape, self.dtype) * std + mean).astype(self.dtype)


@lower(aten.normal.Tensor_float, rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return _normal(key, mean.shape, mean.dtype) * std + mean


# A check of a tensor argument's values (normal's std, bernoulli's p) is a device-side check (runtime/checks.py):
# computed in the op's own program and raised at the next synchronisation, so it costs no wait.
def _check_std(std):
    checks.require(std >= 0, RuntimeError, "normal expects all elements of std >= 0.0")


@lower(aten.normal.float_Tensor, rng=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    _check_std(std)
    return _normal(key, std.shape, std.dtype) * std + mean


@lower(aten.normal.Tensor_Tensor, rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    _check_std(std)
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return _normal(key, shape, jnp.result_type(mean, std)) * std + mean


def _bernoulli(key, shape, dtype, p):
    return (_uniform(key, shape, dtype) < p).astype(dtype)


def _check_probabilities(p):
    checks.require((p >= 0) & (p <= 1), RuntimeError, "Expected p_in >= 0 && p_in <= 1 to be true, but got false.")


@lower(aten.bernoulli.default, rng=True)
def bernoulli(self, *, generator=None, key):
    _check_probabilities(self)
    return _bernoulli(key, self.shape, self.dtype, self)


@lower(aten.bernoulli.p, aten.bernoulli_.float, rng=True)
def bernoulli_p(self, p=0.5, *, generator=None, key):
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={_number(p)}")
    return _bernoulli(key, self.shape, self.dtype, p)


@lower(aten.bernoulli.Tensor, rng=True)
def bernoulli_tensor(self, p, *, generator=None, key):
    _check_probabilities(p)
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
    bits = jax.random.bits(threefry_key(key), shape, np.uint64)
    span = high - low
    if span < 2**64:
        bits = bits % np.uint64(span)
    return (jax.lax.bitcast_convert_type(bits, np.int64) + np.int64(low)).astype(dtype)


@lower(aten.random.default, rng=True)
def random(self, *, generator=None, key):
    return _random_range(key, self.shape, self.dtype, 0, _upper_bound(self.dtype) + 1)


def _check_random_range(dtype, low, high):
    """ATen's checks of `random_(from, to)`: from < to, and from and to - 1 representable in `dtype`."""
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    _check_in_range(low, "from", dtype)
    _check_in_range(high - 1, "to - 1", dtype)


@lower(aten.random.to, rng=True)
def random_to(self, to, *, generator=None, key):
    _check_random_range(self.dtype, 0, to)
    return _random_range(key, self.shape, self.dtype, 0, to)


@lower(getattr(aten.random, "from"), rng=True)
def random_from(self, from_, to, *, generator=None, key):
    if to is None:
        _check_in_range(from_, "from", self.dtype)
        high = _upper_bound(self.dtype) + 1
    else:
        _check_random_range(self.dtype, from_, to)
        high = to
    return _random_range(key, self.shape, self.dtype, from_, high)


@lower(aten.exponential.default, rng=True)
def exponential(self, lambd=1.0, *, generator=None, key):
    return (jax.random.exponential(threefry_key(key), self.shape, _sample_dtype(self.dtype)) / lambd).astype(self.dtype)


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
    """NOTE: negative, infinite or NaN probabilities and all-zero rows are not detected (a sync per call)."""
    if not jnp.issubdtype(self.dtype, jnp.floating):
        name = repr(dtypes.to_torch(self.dtype)).removeprefix("torch.")
        raise RuntimeError(
            f"multinomial only supports floating-point dtypes for input, got: {_ATEN_NAMES.get(name, name)}"
        )
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    logits = jnp.log(self.astype(_sample_dtype(self.dtype)))
    if replacement:
        samples = jax.random.categorical(threefry_key(key), logits, shape=(num_samples, *self.shape[:-1]))
        return jnp.moveaxis(samples, 0, -1).astype(np.int64)
    perturbed = logits + jax.random.gumbel(threefry_key(key), self.shape, logits.dtype)
    return jax.lax.top_k(perturbed, num_samples)[1].astype(np.int64)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _permutation(key, n, dtype):
    return jax.random.permutation(threefry_key(key), n).astype(dtype)


@kernel(aten.randperm.generator_out)
def randperm_out(n, *, generator=None, out):
    """`torch.randperm` allocates `out` and calls this overload (see `creation.factory_out`)."""
    return write_out(out, _permutation(tpu_random.next_key(generator), n, dtypes.to_jax(out.dtype)))
