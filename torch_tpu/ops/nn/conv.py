"""Lowerings: convolution (N-d, grouped, dilated, transposed) and its backward, im2col / col2im."""

import jax
import jax.numpy as jnp
from jax import lax

from torch_tpu import precision
from torch_tpu.ops.nn.common import expand, linear_adjoint, masked, padded_windows
from torch_tpu.ops.registry import aten, lower
from torch_tpu.runtime import dtypes

_SPATIAL = "DHW"


def _dimension_numbers(n):
    spatial = _SPATIAL[-n:]
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


def _transposed_weight(weight, groups):
    """(C_in, C_out/g, *k) weight of a transposed conv -> the (C_out, C_in/g, *k) flipped weight of the
    equivalent direct conv over the stride-dilated input."""
    c_in, c_out_per_group, *kernel = weight.shape
    w = weight.reshape(groups, c_in // groups, c_out_per_group, *kernel)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_per_group, c_in // groups, *kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    n = input.ndim - 2
    stride, padding, dilation = expand(stride, n), expand(padding, n), expand(dilation, n)
    options = dict(
        rhs_dilation=dilation,
        dimension_numbers=_dimension_numbers(n),
        feature_group_count=groups,
        precision=precision.for_dot(),
        preferred_element_type=dtypes.compute_dtype(input.dtype),
    )
    if not transposed:
        pads = [(p, p) for p in padding]
        return lax.conv_general_dilated(input, weight, stride, pads, **options)
    kernel = weight.shape[2:]
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, d, op in zip(kernel, padding, dilation, expand(output_padding, n), strict=True)
    ]
    weight = _transposed_weight(weight, groups)
    return lax.conv_general_dilated(input, weight, (1,) * n, pads, lhs_dilation=stride, **options)


@lower(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((-1,) + (1,) * (out.ndim - 2))
    return out


@lower(aten.convolution_backward.default)
def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def forward(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    out, pullback = jax.vjp(forward, input, weight)
    grad_input, grad_weight = pullback(grad_output.astype(out.dtype))
    grad_bias = jnp.sum(grad_output.astype(out.dtype), axis=(0, *range(2, grad_output.ndim)))
    return masked(output_mask, grad_input, grad_weight, grad_bias)


@lower(aten.im2col.default)
def im2col(self, kernel_size, dilation, padding, stride):
    kernel, dilation, padding, stride = (expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    out = tuple(
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, d, p, s in zip(self.shape[-2:], kernel, dilation, padding, stride, strict=True)
    )
    windows = padded_windows(self, kernel, stride, padding, dilation, out, 0)
    windows = jnp.moveaxis(windows, -1, -3)
    return windows.reshape(self.shape[:-3] + (-1, out[0] * out[1]))


@lower(aten.col2im.default)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    kernel = expand(kernel_size, 2)
    channels = self.shape[-2] // (kernel[0] * kernel[1])
    image_shape = self.shape[:-2] + (channels, *output_size)
    return linear_adjoint(lambda x: im2col(x, kernel_size, dilation, padding, stride), self, image_shape)
