"""A storage's `DeviceBuffer` keeps the dtype registry's own objects: `mapping.classify`'s first test, the one every
read of a whole tensor takes, compares a buffer's dtype with the registry's by identity."""

import copy

import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.runtime import arguments, dtypes, storage


class _EqualDtype:
    """An array as a program's output may carry it: its dtype equal to the registry's but another object."""

    def __init__(self, array):
        self.array = array
        self.shape = array.shape
        self.dtype = copy.deepcopy(array.dtype)


def test_a_written_array_leaves_the_registrys_dtype_object_and_the_tensor_reads_whole():
    tensor = torch.empty(3, device="tpu")
    buffer = storage.buffer_of(tensor)
    value = _EqualDtype(jnp.arange(3.0, dtype=np.float32))
    assert value.dtype == np.float32 and value.dtype is not dtypes.JAX_DTYPES[torch.float32]
    buffer.array = value
    assert buffer.dtype is dtypes.JAX_DTYPES[torch.float32]
    buffer.array = value.array  # a real array again, for the read below
    values, buffers, _ = arguments.read([tensor], [0])
    assert buffers == [buffer] and values[0] is value.array
    np.testing.assert_array_equal(tensor.cpu().numpy(), [0.0, 1.0, 2.0])
