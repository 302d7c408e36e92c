"""How a prebuilt kernel becomes a PyTorch op: a `torch_tpu::name` operator whose tpu kernel is a lowering in the
one registry (`ops.registry.lower`), so Strict, Debug and Fused eager and `torch.compile(backend="tpu")` all run
it (compiled graphs hold it as `torch.ops.torch_tpu.name.default` and inline its lowering into their program),
beside a CPU kernel (the reference a user's CPU run and the tests compare with) and a fake kernel (shapes only,
what PyTorch's meta dispatch and FakeTensor tracing use)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import jax
import torch
from torch._ops import OpOverload

from torch_tpu.eager import dispatch
from torch_tpu.ops.registry import LOWERINGS, lower
from torch_tpu.runtime import platform

NAMESPACE = "torch_tpu"
_library: list[torch.library.Library] = []
_eager_kernels: dict[OpOverload, Callable] = {}


def library() -> torch.library.Library:
    """The `torch_tpu` operator library (made once: PyTorch refuses a second DEF library of one namespace)."""
    if not _library:
        _library.append(torch.library.Library(NAMESPACE, "DEF"))
    return _library[0]


@contextlib.contextmanager
def kernel_trace() -> Iterator[None]:
    """Around a prebuilt Pallas kernel's trace: 32-bit types (the kernels index and accumulate in 32 bits) and, on
    a TPU, JAX's default dot precision rather than the level lowerings are traced under (`precision.tracing`):
    Mosaic refuses a float32-contract product of bfloat16 operands ("Bad lhs type"), and sdpa.py chooses a TPU
    kernel for float32 only at `Precision.DEFAULT`, so there the level is DEFAULT or immaterial. Triton (GPU)
    honours the level in force."""
    level = jax.default_matmul_precision("default") if platform.platform() == "tpu" else contextlib.nullcontext()
    with jax.enable_x64(False), level:
        yield


def define(schema: str, lowering: Callable, reference: Callable, fake: Callable) -> OpOverload:
    """Define `torch_tpu::<schema>` with its tpu lowering, its CPU kernel `reference` and its `fake` kernel."""
    name = schema.split("(", 1)[0]
    lib = library()
    lib.define(schema)
    op = getattr(torch.ops.torch_tpu, name).default
    lib.impl(name, reference, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    lower(op)(lowering)
    _eager_kernels[op] = dispatch.functional_kernel(LOWERINGS[op])
    lib.impl(name, _eager_kernels[op], "PrivateUse1")
    return op


def eager_kernel(op: OpOverload) -> Callable:
    """`op`'s tpu kernel, to call without the dispatcher on operands a route has checked (plain tpu tensors)."""
    return _eager_kernels[op]


def eager_function(name: str, op: OpOverload, setup_context: Callable, backward: Callable) -> Callable:
    """`op`'s tpu kernel under autograd without the dispatcher: the `apply` of an `autograd.Function` whose
    context is set up as `op`'s registered autograd sets it up. For a route (`aten::linear`, `aten::matmul`)
    that has checked its operands are plain tpu tensors: going down the dispatcher into a custom op's Python
    autograd and back costs ~50 µs of host time a call on the CPU machine, more than the op's own dispatch."""
    kernel = _eager_kernels[op]

    def forward(ctx, *inputs):
        output = kernel(*inputs)
        setup_context(ctx, inputs, output)
        return output

    members = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (torch.autograd.Function,), members).apply


def differentiable(op: OpOverload, backward: Callable, setup_context: Callable) -> None:
    """Give `op` PyTorch autograd (`torch.library.register_autograd`): `backward` calls the op's backward op."""
    torch.library.register_autograd(op._schema.name, backward, setup_context=setup_context, lib=library())


def check_tensor(op: str, argument: str, value: object, ndim: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    """A clear error for an argument that is not a tensor of one of `ndim` ranks and `dtypes`."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"torch.tpu.ops.{op}: {argument} must be a Tensor, got {type(value).__name__}")
    if value.ndim not in ndim:
        ranks = " or ".join(str(n) for n in ndim)
        raise ValueError(f"torch.tpu.ops.{op}: {argument} must be {ranks}-D, got shape {tuple(value.shape)}")
    if value.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"torch.tpu.ops.{op}: {argument} has dtype {value.dtype}; supported: {names}")


def attention_layout(query, key, value, dtypes: tuple[torch.dtype, ...], enable_gqa: bool) -> bool:
    """Whether an SDPA call has the layout every attention kernel here takes: (B, H, T, D) query and key/value of
    one dtype among `dtypes`, the same batch and head size, and query heads a multiple of key heads (only with
    `enable_gqa` when they differ)."""
    if query.ndim != 4 or key.ndim != 4 or value.shape != key.shape:
        return False
    if query.dtype not in dtypes or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3] or query.shape[1] % key.shape[1]:
        return False
    return query.shape[1] == key.shape[1] or enable_gqa


def define_attention(name: str, attention: Callable, backward: Callable, reference: Callable) -> None:
    """Define `torch_tpu::<name>(query, key, value, *, is_causal=False, scale=None)`, an SDPA kernel over (B, H, T, D)
    tensors, and `<name>_backward` (`backward(grad, query, key, value, is_causal, scale)` -> the three gradients),
    with autograd between them; the CPU kernels are `reference` (PyTorch's math SDPA) and its autograd."""

    def reference_backward(grad, query, key, value, is_causal, scale):
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in (query, key, value)]
            return torch.autograd.grad(reference(*inputs, is_causal, scale), inputs, grad)

    def fake(query, key, value, is_causal=False, scale=None):
        return query.new_empty(query.shape)

    def fake_backward(grad, query, key, value, is_causal, scale):
        return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)

    def setup(ctx, inputs, keyword_only_inputs, output) -> None:
        ctx.save_for_backward(*inputs)
        ctx.options = (keyword_only_inputs.get("is_causal", False), keyword_only_inputs.get("scale"))

    forward = define(
        f"{name}(Tensor query, Tensor key, Tensor value, *, bool is_causal=False, float? scale=None) -> Tensor",
        attention,
        reference,
        fake,
    )
    grads = define(
        f"{name}_backward(Tensor grad, Tensor query, Tensor key, Tensor value, bool is_causal, float? scale) "
        "-> (Tensor, Tensor, Tensor)",
        backward,
        reference_backward,
        fake_backward,
    )

    def differentiate(ctx, grad):
        return grads(grad.contiguous(), *ctx.saved_tensors, *ctx.options)

    differentiable(forward, differentiate, setup)
