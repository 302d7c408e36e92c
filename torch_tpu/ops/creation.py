"""Lowerings: creation."""

import jax.numpy as jnp

from torch_tpu.ops.registry import aten, lower


@lower(aten.arange.start_step, static=("start", "end", "step"))
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(start, end, step)
