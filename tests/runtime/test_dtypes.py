"""PyTorch's type promotion as `runtime.dtypes` holds it, checked against CPU PyTorch's `torch.result_type`."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch_tpu.runtime import dtypes, platform, trace_context

_TABLE = list(dtypes.JAX_DTYPES)
_NUMBERS = (True, 3, 2.5, 1j)


@pytest.fixture(autouse=True, scope="module")
def _configured():
    platform.devices()  # configures JAX as the device does (x64: int64 and float64 stay as they are)


def test_categories_partition_the_table():
    sets = (dtypes.BOOL, dtypes.INTEGER, dtypes.FLOATING, dtypes.COMPLEX)
    assert set().union(*sets) == set(dtypes.JAX_DTYPES.values())
    assert sum(map(len, sets)) == len(dtypes.JAX_DTYPES)
    assert [dtypes.category(np.dtype(d)) for d in (np.bool_, np.int8, np.float16, np.complex64)] == list(
        dtypes.Category
    )


def test_category_refuses_a_dtype_outside_the_table():
    with pytest.raises(TypeError, match="no type promotion category"):
        dtypes.category(np.dtype("V4"))


def _operands(dtype, ndim):
    return torch.zeros((2,) * ndim, dtype=dtype), jnp.zeros((2,) * ndim, dtypes.to_jax(dtype))


def _expected(a, b):
    """CPU PyTorch's result dtype, or None where it refuses (float8 with complex) or the device has none
    (complex32: float16 with a complex zero-dim tensor or number)."""
    try:
        expected = torch.result_type(a, b)
    except RuntimeError:
        return None
    return expected if expected in dtypes.JAX_DTYPES else None


@pytest.mark.parametrize("first", _TABLE, ids=str)
def test_result_type_matches_torch(first):
    """Tensor with tensor (dimensioned and zero-dim) and with Python numbers, as CPU PyTorch promotes."""
    for other, (ndim_a, ndim_b) in itertools.product(_TABLE, ((1, 1), (1, 0), (0, 1), (0, 0))):
        (ta, ja), (tb, jb) = _operands(first, ndim_a), _operands(other, ndim_b)
        if (expected := _expected(ta, tb)) is not None:
            assert dtypes.to_torch(dtypes.result_type(ja, jb)) == expected, (other, ndim_a, ndim_b)
    tensor, array = _operands(first, 1)
    for number in _NUMBERS:
        if (expected := _expected(tensor, number)) is not None:
            assert dtypes.to_torch(dtypes.result_type(array, number)) == expected, number


def test_floating_widens_integers_but_the_reduction_rule_does_not():
    """Under a bfloat16 default, `floating` computes an integer in float32; `floating_for_reduction` keeps bfloat16."""
    ints = jnp.arange(3, dtype=jnp.int32)
    saved = trace_context.context.default_dtype
    trace_context.context.default_dtype = torch.bfloat16
    try:
        assert dtypes.floating(ints)[0].dtype == np.float32
        assert dtypes.floating_for_reduction(ints).dtype == dtypes.to_jax(torch.bfloat16)
    finally:
        trace_context.context.default_dtype = saved
    half = jnp.ones(3, jnp.float16)
    assert dtypes.floating(half)[0].dtype == dtypes.floating_for_reduction(half).dtype == np.float32
