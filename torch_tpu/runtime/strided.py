"""Strided views as array operations: a view (shape, stride, offset) of a buffer's flat elements, read and written
inside a traced program.

Most views (transposes, permutes, slices with steps, selects, diagonals, expands) are a block of the buffer: the
buffer shaped as the view's nested strides, a corner of it taken, transposed and broadcast (`Blocked`); only
overlapping views (`unfold` with step < size, `as_strided` tricks) gather by index (`flat_indices`). A view that
lies inside its buffer without wrapping (`aligned`) is read and written through the whole buffer reshaped, which
XLA folds into its neighbours, where slicing the view's span out of the flat buffer (padded past its end) made a
TPU copy and relayout the whole buffer (4.4 ms of the large GPT step's 74.7 in Fused eager, twice a layer for the
k and v heads of the qkv projection).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.runtime import dtypes


def bitcast_flat(flat: jax.Array, dtype: np.dtype) -> jax.Array:
    """Reinterpret a 1-D array's bytes as another dtype (the storage is untyped)."""
    if flat.dtype == dtype:
        return flat
    if dtypes.is_complex(flat.dtype):
        parts = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
        return bitcast_flat(parts, dtype)
    if dtypes.is_complex(dtype):
        part = np.dtype(np.float32 if dtype == np.complex64 else np.float64)
        pairs = bitcast_flat(flat, part).reshape(-1, 2)
        return jax.lax.complex(pairs[:, 0], pairs[:, 1])
    if flat.dtype == np.bool_:
        return bitcast_flat(flat.astype(np.uint8), dtype)
    if dtype == np.bool_:
        return bitcast_flat(flat, np.dtype(np.uint8)).astype(np.bool_)
    src, dst = flat.dtype.itemsize, dtype.itemsize
    if src == dst:
        return jax.lax.bitcast_convert_type(flat, dtype)
    if src > dst:
        return jax.lax.bitcast_convert_type(flat, dtype).reshape(-1)
    usable = flat.shape[0] // (dst // src) * (dst // src)
    return jax.lax.bitcast_convert_type(flat[:usable].reshape(-1, dst // src), dtype)


def flat_indices(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> np.ndarray:
    """The flat buffer position of each element of the strided view (`shape`, `stride`, `offset`)."""
    index = np.full(shape, offset, dtype=np.int64)
    for dim, (size, step) in enumerate(zip(shape, stride, strict=True)):
        axis = [1] * len(shape)
        axis[dim] = size
        index = index + (np.arange(size, dtype=np.int64) * step).reshape(axis)
    return index


def _coordinates(offset: Any, extents: tuple[int, ...]) -> tuple[list[Any], Any]:
    """`offset`'s coordinates in a row-major array of `extents` (Python ints, or traced values in the program), and
    what is left over past its first extent (0 where the offset lies inside)."""
    start, rest = [], offset
    for extent in reversed(extents):
        start.append(rest % extent)
        rest //= extent
    start.reverse()
    return start, rest


class Blocked:
    """A strided view as a block of the flat buffer: `flat[offset:offset + length]` reshaped to `block`, the
    leading `shape`-sized corner of each block dimension (and element 0 of the trailing step dimension) taken,
    then transposed by `order` and broadcast over stride-0 dimensions. Raises ValueError for a view without that
    form (overlapping or negative strides)."""

    def __init__(self, shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> None:
        dims = sorted((d for d in range(len(shape)) if shape[d] > 1 and stride[d] != 0), key=lambda d: -stride[d])
        self.dims = dims
        self.sizes = [shape[d] for d in dims]
        strides = [stride[d] for d in dims]
        self.block: list[int] = [self.sizes[0]] if dims else []
        for i in range(1, len(dims)):
            if strides[i] <= 0 or strides[i - 1] % strides[i] or strides[i - 1] // strides[i] < self.sizes[i]:
                raise ValueError("overlapping or non-nested strides")
            self.block.append(strides[i - 1] // strides[i])
        self.step = strides[-1] if dims else 1
        if dims and strides[-1] <= 0:
            raise ValueError("negative stride")
        self.length = (self.sizes[0] * strides[0]) if dims else 1
        self.offset = offset
        self.shape = shape
        inverse = {d: i for i, d in enumerate(dims)}
        self.order = [inverse[d] for d in range(len(shape)) if d in inverse]
        self.squeezed = tuple(shape[d] for d in range(len(shape)) if d in inverse)

    def region(self, flat: jax.Array) -> jax.Array:
        end = self.offset + self.length
        if end > flat.shape[0]:
            flat = jnp.pad(flat, (0, end - flat.shape[0]))
        return jax.lax.slice_in_dim(flat, self.offset, end).reshape(*self.block, self.step)

    def corner(self) -> tuple:
        return (*(slice(0, n) for n in self.sizes), 0)

    def rows(self, total: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """A buffer of `total` elements shaped as rows of the view's blocks, and the view's extent in that shape;
        None where the buffer is not a whole number of rows."""
        row = self.length // self.sizes[0] if self.dims else 0
        if not row or not total or total % row:
            return None
        extents = (total // row, *self.block[1:]) + ((self.step,) if self.step > 1 else ())
        return extents, (*self.sizes, 1)[: len(extents)]

    def whole(self, total: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
        """`rows`, and the view's first element in them, where the view lies inside without wrapping."""
        rows = self.rows(total)
        if rows is None:
            return None
        extents, counts = rows
        start, rest = _coordinates(self.offset, extents)
        if rest or any(begin + count > extent for begin, count, extent in zip(start, counts, extents, strict=True)):
            return None
        return extents, counts, tuple(start)

    def arrange(self, value: jax.Array) -> jax.Array:
        """The view from its block's corner (`sizes`): transposed to the view's order and broadcast."""
        value = jnp.transpose(value, self.order) if self.order else value.reshape(())
        kept = [self.shape[d] if d in self.dims else 1 for d in range(len(self.shape))]
        return jnp.broadcast_to(value.reshape(kept), self.shape)

    def read(self, flat: jax.Array) -> jax.Array:
        whole = self.whole(flat.shape[0])
        if whole is None:
            return self.arrange(self.region(flat)[self.corner()])
        extents, counts, start = whole
        limit = [begin + count for begin, count in zip(start, counts, strict=True)]
        return self.arrange(jax.lax.slice(flat.reshape(extents), start, limit).reshape(self.sizes))

    def read_at(self, flat: jax.Array, offset: Any) -> jax.Array:
        """The view at a traced `offset` where `aligned` holds for it: its first element's coordinates in `rows`
        computed in the program (in 32 bits where they fit), so that one program reads the layout at every such
        offset."""
        extents, counts = self.rows(flat.shape[0])
        if flat.shape[0] < 2**31:  # 64-bit integer division is emulated on a TPU: 5 s more to compile a program
            offset = jnp.asarray(offset).astype(jnp.int32)
        start, _ = _coordinates(offset, extents)  # the view lies inside: nothing is left over
        return self.arrange(jax.lax.dynamic_slice(flat.reshape(extents), start, counts).reshape(self.sizes))

    def write(self, flat: jax.Array, value: jax.Array) -> jax.Array:
        inverse = np.argsort(self.order).tolist() if self.order else []
        block = jnp.transpose(value.reshape(self.squeezed), inverse) if inverse else value.reshape(())
        whole = self.whole(flat.shape[0])
        if whole is not None:
            extents, counts, start = whole
            return jax.lax.dynamic_update_slice(flat.reshape(extents), block.reshape(counts), start).reshape(-1)
        end = self.offset + self.length
        padded = jnp.pad(flat, (0, max(0, end - flat.shape[0])))
        region = self.region(padded).at[self.corner()].set(block).reshape(-1)
        return jax.lax.dynamic_update_slice_in_dim(padded, region, self.offset, 0)[: flat.shape[0]]


def blocked(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Blocked | None:
    try:
        return Blocked(shape, stride, offset)
    except ValueError:
        return None


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def gather(array: jax.Array, dtype: np.dtype, shape, stride, offset: int) -> jax.Array:
    flat = bitcast_flat(array.reshape(-1), dtype)
    if math.prod(shape) == 0:
        return jnp.zeros(shape, dtype)
    found = blocked(shape, stride, offset)
    if found is not None:
        return found.read(flat)
    return flat[flat_indices(shape, stride, offset)]


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def scatter(array: jax.Array, value: jax.Array, dtype: np.dtype, shape, stride, offset: int) -> jax.Array:
    flat = bitcast_flat(array.reshape(-1), dtype)
    value = jnp.broadcast_to(jnp.asarray(value).astype(dtype), shape)
    if 0 in stride:  # an expanded tensor: of the elements at one location, the last is stored, as CPU's loops leave it
        value = value[tuple(slice(-1, None) if step == 0 else slice(None) for step in stride)]
        shape = value.shape
    found = blocked(shape, stride, offset)
    if found is not None:
        updated = found.write(flat, value)
    else:
        updated = flat.at[flat_indices(shape, stride, offset).reshape(-1)].set(value.reshape(-1))
    return bitcast_flat(updated, array.dtype).reshape(array.shape)


@functools.lru_cache(maxsize=4096)
def aligned(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, total: int) -> bool:
    """Whether the view at `offset` lies inside a buffer of `total` elements without wrapping (`Blocked.whole`):
    `read_view` then reads it through the buffer reshaped at any offset where this holds. Part of an op's cache
    key where the offset is a run-time input."""
    found = blocked(tuple(shape), tuple(stride), offset)
    return found is not None and found.whole(total) is not None


def read_view(
    array: jax.Array, shape: tuple[int, ...], stride: tuple[int, ...], offset: Any, is_aligned: bool = False
) -> jax.Array:
    """The value of a `VIEW` (or `RESHAPE`) of `array`, (shape, stride) at `offset` (inside a traced function,
    this inlines). An offset other than a Python 0 may be a traced scalar, so that one program serves a layout at
    every offset (a loop over `data[i:i + batch]` compiles once): an `aligned` view is read through the buffer
    reshaped, at coordinates computed from the offset; another one's span is sliced out at it, then read at 0."""
    if isinstance(offset, int) and offset == 0:
        return gather(array, array.dtype, shape, stride, 0)
    if math.prod(shape) == 0:
        return jnp.zeros(shape, array.dtype)
    if is_aligned:
        return Blocked(shape, stride, 0).read_at(array.reshape(-1), offset)
    span = 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    region = jax.lax.dynamic_slice_in_dim(array.reshape(-1), offset, span)
    return gather(region, array.dtype, shape, stride, 0)
