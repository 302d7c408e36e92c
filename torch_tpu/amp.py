"""Autocast for `tpu`: `torch.autocast("tpu")` (bfloat16 by default) with PyTorch's accelerator cast policy.

PyTorch registers no `AutocastPrivateUse1` kernels, so without these every op under `torch.autocast("tpu")`
fails to dispatch. The policy is the one PyTorch gives every accelerator (CUDA, XPU, MTIA and MAIA share one op
list): matrix products, convolutions, RNN cells and attention run in the autocast dtype; numerically sensitive
ops (exp/log/pow, softmax, norms, sums, losses, resampling) in float32; mixed-dtype ops at the widest input
dtype. Only floating `tpu` tensors other than float64 are cast, and casts are not cached across uses (each
use of a weight casts it again; the values are the same). The cast ops themselves are recorded by autograd.

`install()` registers the kernels and makes bfloat16 the autocast dtype of the calling thread (PyTorch keeps
that default per thread; other threads start at PyTorch's PrivateUse1 default, float16).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten
DEVICE = "tpu"
_KEY = "AutocastPrivateUse1"

LOWER_PRECISION = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul",
    "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)  # fmt: skip
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d",
    "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)  # fmt: skip
# float32 through the op's own `dtype` argument (unless the caller gave one), so the result is float32.
FP32_SET_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "prod.dim_Dimname",
    "softmax.Dimname", "log_softmax.Dimname", "cumprod.dimname", "cumsum.dimname", "sum.dim_DimnameList",
)  # fmt: skip
# float32 through the overload that takes a dtype.
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot",
    "scatter_add",
)  # fmt: skip
BANNED = ("binary_cross_entropy",)

_libraries: list[torch.library.Library] = []


def _overload(name: str) -> OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == DEVICE
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


def _cast(tree: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda v: v.to(dtype) if _eligible(v) and v.dtype != dtype else v, tree)


def _redispatch(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _KEY))):
        return op(*args, **kwargs)


def _lower_precision(op: OpOverload) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype(DEVICE)
        return _redispatch(op, _cast(args, dtype), _cast(kwargs, dtype))

    return kernel


def _fp32(op: OpOverload) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _redispatch(op, _cast(args, torch.float32), _cast(kwargs, torch.float32))

    return kernel


def _fp32_set_dtype(op: OpOverload) -> Callable:
    position = [a.name for a in op._schema.arguments].index("dtype")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if _eligible(args[0]):
            if len(args) > position:
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return _redispatch(op, args, kwargs)

    return kernel


def _fp32_append_dtype(op: OpOverload, with_dtype: OpOverload) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        if not _eligible(args[0]):
            return _redispatch(op, args, kwargs)
        return _redispatch(with_dtype, args, {**kwargs, "dtype": torch.float32})

    return kernel


def _promote(op: OpOverload) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtypes = {v.dtype for v in tree_leaves((args, kwargs)) if _eligible(v)}
        dtype = torch.float32 if torch.float32 in dtypes else torch.get_autocast_dtype(DEVICE)
        return _redispatch(op, _cast(args, dtype), _cast(kwargs, dtype))

    return kernel


def _banned(op: OpOverload) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{op} is unsafe to autocast (as on every PyTorch accelerator): many models apply a sigmoid right "
            "before it. Combine the two with torch.nn.functional.binary_cross_entropy_with_logits or "
            "torch.nn.BCEWithLogitsLoss, which are safe to autocast."
        )

    return kernel


def policies() -> dict[OpOverload, Callable]:
    """Each op with an autocast rule on `tpu` -> its kernel: those of the lists above (every supported release's:
    2.11 and 2.12 also cast Dimname overloads that 2.13 no longer has, 2.11 not rms_norm) that the installed torch
    gives its accelerators a rule for."""
    existing = set(torch._C._dispatch_get_all_op_names())

    def _in_accelerator_policy(name: str) -> bool:
        qualified = f"aten::{name}"
        return qualified in existing and torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "AutocastXPU")

    table: dict[OpOverload, Callable] = {}
    for names, make in ((LOWER_PRECISION, _lower_precision), (FP32, _fp32), (FP32_SET_DTYPE, _fp32_set_dtype),
                        (PROMOTE, _promote), (BANNED, _banned)):  # fmt: skip
        for name in names:
            if _in_accelerator_policy(name):
                table[_overload(name)] = make(_overload(name))
    for name, with_dtype in FP32_APPEND_DTYPE.items():
        if _in_accelerator_policy(name):
            table[_overload(name)] = _fp32_append_dtype(_overload(name), _overload(with_dtype))
    return table


def install() -> None:
    """Register the `tpu` autocast kernels (ops without a rule fall through) and default to bfloat16."""
    torch.set_autocast_dtype(DEVICE, torch.bfloat16)
    if _libraries:
        return
    lib = torch.library.Library("aten", "IMPL")
    for op, kernel in policies().items():
        lib.impl(op, kernel, _KEY)
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    _libraries.extend([lib, fallthrough])
