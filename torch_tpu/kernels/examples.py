"""Example Pallas kernels, shipped as ops: a tiled add and a row softmax (`torch.ops.torch_tpu.tiled_add`,
`torch.ops.torch_tpu.row_softmax`, made when this module is first imported).

They are written once for TPU (Mosaic: a block's last two dimensions are multiples of (8, 128) or the whole array's),
run interpreted on the CPU platform, and lower for GPUs with Triton (`lax.platform_dependent` selects its compiler
parameters; Mosaic GPU has no reductions over an axis of a 2-D block yet, and `pallas_call` is deprecated for it).
A `pallas_call` has no derivative rule of its own, so each has a `custom_vjp`.
`tests/kernels/test_pallas.py` exports every kernel in `KERNELS` for TPU and CUDA from the CPU host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from torch_tpu.kernels.jax_op import jax_op


def _block(size: int, tile: int) -> int:
    """A block dimension Mosaic accepts: the tile when it divides the size, else the whole dimension."""
    return tile if size % tile == 0 else size


def _add_kernel(x_ref: jax.Array, y_ref: jax.Array, o_ref: jax.Array) -> None:
    o_ref[...] = x_ref[...] + y_ref[...]


def _add_call(x: jax.Array, y: jax.Array, params: pl.CompilerParams | None = None) -> jax.Array:
    rows, cols = _block(x.shape[0], 8), _block(x.shape[1], 128)
    spec = pl.BlockSpec((rows, cols), lambda i, j: (i, j))
    return pl.pallas_call(
        _add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // rows, x.shape[1] // cols),
        in_specs=[spec, spec],
        out_specs=spec,
        compiler_params=params,
    )(x, y)


def _on_gpu_with_triton(call: Callable) -> Callable:
    """`call` with Triton's compiler parameters on CUDA (a plain `pallas_call` there is Mosaic GPU's, deprecated
    for that use), as it is elsewhere (Mosaic TPU; interpreted on the CPU platform)."""
    triton = functools.partial(call, params=pltriton.CompilerParams(num_warps=4))
    return lambda *args: jax.lax.platform_dependent(*args, cuda=triton, default=call)


@jax.custom_vjp
def add(x: jax.Array, y: jax.Array) -> jax.Array:
    """`x + y` for 2-D arrays of one shape and dtype, in (8, 128) tiles."""
    return _on_gpu_with_triton(_add_call)(x, y)


add.defvjp(lambda x, y: (add(x, y), None), lambda _, g: (g, g))


def _softmax_kernel(x_ref: jax.Array, o_ref: jax.Array) -> None:
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def _softmax_call(x: jax.Array, params: pl.CompilerParams | None = None) -> jax.Array:
    rows = _block(x.shape[0], 8)
    spec = pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        _softmax_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // rows,),
        in_specs=[spec],
        out_specs=spec,
        compiler_params=params,
    )(x)


@jax.custom_vjp
def softmax(x: jax.Array) -> jax.Array:
    """The softmax of each row of a 2-D array, computed in float32, 8 rows a block."""
    return _on_gpu_with_triton(_softmax_call)(x)


def _softmax_forward(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    y = softmax(x)
    return y, y


def _softmax_backward(y: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (y * (g - jnp.sum(g * y, axis=-1, keepdims=True)),)


softmax.defvjp(_softmax_forward, _softmax_backward)


def tiled_add(x: jax.Array, y: jax.Array) -> jax.Array:
    return add(x, y)


def row_softmax(x: jax.Array) -> jax.Array:
    return softmax(x)


# Each shipped kernel and the arguments its lowerings are exported at (tests/kernels/test_pallas.py).
KERNELS: dict[str, tuple[Callable, tuple[jax.ShapeDtypeStruct, ...]]] = {
    "tiled_add": (tiled_add, (jax.ShapeDtypeStruct((16, 256), jnp.float32),) * 2),
    "row_softmax": (row_softmax, (jax.ShapeDtypeStruct((16, 256), jnp.float32),)),
}
tiled_add_op = jax_op("torch_tpu::tiled_add", tiled_add)
row_softmax_op = jax_op("torch_tpu::row_softmax", row_softmax)
