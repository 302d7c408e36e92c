"""Optimizers' `_foreach_*` ops as loops over the per-tensor lowerings.

In eager a whole list is one executable (and its in-place form one executable and a write per tensor), where
PyTorch's default would dispatch every tensor separately; graphs get the same lowering once functionalized.
"""

import torch

from torch_tpu.ops import core, elementwise, graph  # noqa: F401  (the per-tensor lowerings the loops reuse)
from torch_tpu.ops.registry import aten, graph_lowering, lower


def _foreach(op, element, fn):
    """A `_foreach_*` lowering: `fn` (the lowering of per-tensor `element`) applied per index. List arguments and
    a `scalars` tensor (one value per list element) are indexed, others shared; positional arguments beyond
    `element`'s positional ones go to its keyword-only ones in order (`scalars` -> addcdiv's `value`)."""
    n_positional = sum(not a.kwarg_only for a in element._schema.arguments)
    keywords = [a.name for a in element._schema.arguments if a.kwarg_only]
    per_element = [isinstance(a.type, torch.ListType) or a.name == "scalars" for a in op._schema.arguments]

    def lowering(*args, **kwargs):
        count = next(len(a) for a in args if isinstance(a, (list, tuple)))
        args = [
            list(a) if indexed and not isinstance(a, (list, tuple)) else a
            for a, indexed in zip(args, per_element, strict=False)
        ]
        kwargs = dict(kwargs, **dict(zip(keywords, args[n_positional:], strict=False)))
        args = args[:n_positional]
        pick = lambda a, i: a[i] if isinstance(a, list | tuple) else a
        return [fn(*(pick(a, i) for a in args), **{k: pick(v, i) for k, v in kwargs.items()}) for i in range(count)]

    return lowering


def _register_foreach() -> None:
    """Register the functional overloads; `eager.register` derives the in-place ones."""
    for name, element in {
        "add": aten.add.Tensor,
        "sub": aten.sub.Tensor,
        "mul": aten.mul.Tensor,
        "div": aten.div.Tensor,
        "addcmul": aten.addcmul.default,
        "addcdiv": aten.addcdiv.default,
        "lerp": aten.lerp.Tensor,
        "maximum": aten.maximum.default,
        "minimum": aten.minimum.default,
        "pow": aten.pow.Tensor_Tensor,
        "sqrt": aten.sqrt.default,
        "neg": aten.neg.default,
        "abs": aten.abs.default,
        "exp": aten.exp.default,
        "reciprocal": aten.reciprocal.default,
        "sign": aten.sign.default,
        "clamp_min": aten.clamp_min.default,
        "clamp_max": aten.clamp_max.default,
        "zero": aten.zero.default,
        "copy": aten.copy.default,
    }.items():
        packet = getattr(aten, f"_foreach_{name}")
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                lower(op)(_foreach(op, element, graph_lowering(element).fn))


_register_foreach()
