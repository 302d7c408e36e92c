"""Lowerings: embedding lookup, its dense backward, max-norm renormalization of the looked-up rows, embedding
bags (sum, mean or max of each bag's rows) with their backward ops, and one-hot encoding.

`one_hot` is CompositeImplicitAutograd; on a device its decomposition (a scatter) leaves CPU's checks of the class
values to the scatter, whose error is its own. It is lowered whole instead (it has no gradient): a given
`num_classes` checks the values on the device with CPU's messages; without it, the largest value gives the size,
read on the host (as CPU and the decomposition do), and a negative value raises there.

Embedding bags return (output, offset2bag, bag_size, max_indices) shaped as PyTorch's meta kernel says
(offset2bag per index, bag_size per offset, max_indices per bag and feature in `max` mode, else empty); their values
are this module's own convention, read back only by its backward ops. The bag of index i is the last offset <= i
(with `include_last_offset`, whose last offset should be the number of indices, an index past it joins the last
bag, as in CPU PyTorch's max mode), `padding_idx` entries count for nothing (not even in a mean's divisor), empty
bags give zeros, and `scale_grad_by_freq` divides each row's gradient by its index's frequency.
"""

import jax
import jax.numpy as jnp

from torch_tpu.ops.indexing import require_in_range
from torch_tpu.ops.nn.common import upcast
from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import checks

SUM_BAG, MEAN_BAG, MAX_BAG = 0, 1, 2


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """NOTE: with checks off, an out-of-range index reads a clamped row."""
    require_in_range(indices, weight.shape[0], IndexError, "index out of range in self")
    return weight[indices]


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    index = indices.reshape(-1)
    return _accumulate_rows(
        upcast(grad_output).reshape(index.size, -1), index, num_weights, padding_idx, scale_grad_by_freq
    )


def _accumulate_rows(grad, index, num_weights, padding_idx, scale_grad_by_freq):
    """The weight gradient from each looked-up row's gradient: summed per index (averaged over its count with
    `scale_grad_by_freq`), nothing for `padding_idx`."""
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[index].add(1)
        grad = grad / counts[index][:, None]
    grad = jnp.where((index != padding_idx)[:, None], grad, 0)
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[index].add(grad)


@lower(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    looked_up = jnp.zeros(self.shape[0], bool).at[indices.reshape(-1)].set(True)
    norms = jnp.linalg.norm(upcast(self), ord=norm_type, axis=1)
    scale = jnp.where(looked_up & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return self * scale[:, None].astype(self.dtype)


def _bags(indices, offsets, include_last_offset, padding_idx):
    """The number of bags, each index's bag, whether each index counts (is not `padding_idx`), and each bag's
    count of indices that do."""
    count = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    bag = jnp.searchsorted(offsets[:count], jnp.arange(indices.shape[0], dtype=offsets.dtype), side="right") - 1
    real = indices != padding_idx
    sizes = jax.ops.segment_sum(real.astype(jnp.int32), bag, num_segments=count)
    return count, bag, real, sizes


def _bag_max(rows, indices, bag, real, count):
    """Per bag and feature, the max over the bag's real rows (0 for an empty bag) and the weight row holding it
    (the first on ties)."""
    rows = jnp.where(real[:, None], rows, -jnp.inf)
    best = jax.ops.segment_max(rows, bag, num_segments=count)
    position = jnp.arange(indices.shape[0])[:, None]
    first = jax.ops.segment_min(
        jnp.where(real[:, None] & (rows == best[bag]), position, indices.shape[0]), bag, num_segments=count
    )
    found = first < indices.shape[0]
    return jnp.where(found, best, 0), jnp.where(found, indices[jnp.minimum(first, indices.shape[0] - 1)], -1)


@lower(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=SUM_BAG,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    if checks.index_checks() and indices.size:
        bad = (indices < 0) | (indices >= weight.shape[0])
        first = jnp.argmax(bad)
        message = f"Index {{}} of input takes value {{}} which is not in the valid range [0, {weight.shape[0]})"
        checks.require(~jnp.any(bad), RuntimeError, message, first, indices[first])
    count, bag, real, sizes = _bags(indices, offsets, include_last_offset, padding_idx)
    rows = upcast(weight)[indices]
    bag_size = jnp.zeros(offsets.shape, sizes.dtype).at[:count].set(sizes)
    if mode == MAX_BAG:
        output, max_indices = _bag_max(rows, indices, bag, real, count)
        return output, bag, bag_size, max_indices
    if per_sample_weights is not None:
        rows = rows * upcast(per_sample_weights)[:, None]
    output = jax.ops.segment_sum(jnp.where(real[:, None], rows, 0), bag, num_segments=count)
    if mode == MEAN_BAG:
        output = jnp.where(sizes[:, None] > 0, output / jnp.maximum(sizes, 1)[:, None], 0)
    return output, bag, bag_size, jnp.zeros((0,), indices.dtype)


@lower(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    grad = upcast(grad)
    if mode == MAX_BAG:
        features = jnp.arange(grad.shape[1])
        nonempty = bag_size[: grad.shape[0], None] > 0
        rows = jnp.where(nonempty, maximum_indices, num_weights)  # empty bags scatter out of bounds: dropped
        return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[rows, features].add(grad, mode="drop")
    per_index = grad[offset2bag]
    if mode == MEAN_BAG:
        per_index = per_index / jnp.maximum(bag_size[offset2bag], 1)[:, None]
    if per_sample_weights is not None:
        per_index = per_index * upcast(per_sample_weights)[:, None]
    return _accumulate_rows(per_index, indices, num_weights, padding_idx, scale_grad_by_freq)


@lower(aten._embedding_bag_backward.default)
def _embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    if sparse:
        raise NotImplementedError("torch_tpu: embedding_bag(sparse=True) needs sparse tensors, which tpu lacks")
    return _embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """Each index's weight scales its row in its bag's sum: its gradient is that row dotted with the bag's."""
    products = jnp.sum(upcast(grad)[offset2bag] * upcast(weight)[indices], axis=1)
    return jnp.where(indices != padding_idx, products, 0)


def _one_hot_checked(self, num_classes):
    checks.require(self >= 0, RuntimeError, "Class values must be non-negative.")
    checks.require(self < num_classes, RuntimeError, "Class values must be smaller than num_classes.")
    return (self[..., None] == jnp.arange(num_classes, dtype=self.dtype)).astype(self.dtype)


_one_hot = checks.jit(_one_hot_checked, static_argnums=1)


@lower(aten.one_hot.default, jit=False, checks_empty=True, composite=True)
def one_hot(self, num_classes=-1):
    """(`jit=False`: without `num_classes` the output's size depends on the values.)"""
    if self.size == 0 and num_classes <= 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")
    if num_classes == -1:
        low, high = (int(v) for v in jax.device_get((jnp.min(self), jnp.max(self))))
        if low < 0:
            raise RuntimeError("Class values must be non-negative.")
        num_classes = high + 1
    return _one_hot(self, num_classes)
