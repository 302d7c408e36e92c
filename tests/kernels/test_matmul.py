"""Batched `torch.matmul` in Strict eager (`kernels.prebuilt.matmul`): one program where PyTorch's composite copies
a transposed operand first, with CPU PyTorch's values and gradients; every other call is PyTorch's composite."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import cache_requests
from torch_tpu.kernels.prebuilt import matmul
from torch_tpu.testing.compare import assert_close, float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def _attention_scores(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An attention's pattern: heads transposed out of (batch, seq, heads, dim), scores, then the values."""
    q, k = x.transpose(1, 2), w.transpose(1, 2)
    return (q @ k.transpose(-2, -1)).softmax(-1) @ k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_heads_multiply_in_one_program_with_cpus_values_and_gradients(dtype):
    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 3, 8, dtype=dtype), torch.randn(2, 6, 3, 8, dtype=dtype)
    q, k = x.to("tpu").transpose(1, 2), w.to("tpu").transpose(1, 2)
    assert matmul.serves(q, k.transpose(-2, -1))
    q @ k.transpose(-2, -1)  # compiled, then one cached program a call
    before = cache_requests()
    scores = q @ k.transpose(-2, -1)
    assert cache_requests() - before == 1  # PyTorch's composite: two copies and a bmm
    assert_close(scores, x.transpose(1, 2) @ w.transpose(1, 2).transpose(-2, -1))
    inputs = [t.clone().requires_grad_() for t in (x, w, x.to("tpu"), w.to("tpu"))]
    expected, got = _attention_scores(*inputs[:2]), _attention_scores(*inputs[2:])
    assert_close(got, expected)
    (expected * expected).sum().backward()
    (got * got).sum().backward()
    rtol, atol = float32_tolerance(1e-5, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)
    for device_input, cpu_input in zip(inputs[2:], inputs[:2], strict=True):
        torch.testing.assert_close(device_input.grad.cpu(), cpu_input.grad, rtol=rtol, atol=atol)


def test_second_derivatives_are_cpus():
    torch.manual_seed(1)
    a, b = torch.randn(3, 4, 5, dtype=torch.float64), torch.randn(3, 5, 2, dtype=torch.float64)
    results = []
    for device in ("cpu", "tpu"):
        x = a.to(torch.float32).to(device).requires_grad_()
        y = b.to(torch.float32).to(device).requires_grad_()
        (grad_x,) = torch.autograd.grad(((x @ y) ** 2).sum(), x, create_graph=True)
        results.append((grad_x, *torch.autograd.grad(grad_x.sum(), (x, y))))
    for got, want in zip(results[1], results[0], strict=True):
        assert_close(got, want)


@pytest.mark.parametrize(
    "shapes",
    [((2, 1, 3, 4), (1, 5, 4, 2)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)), ((3, 4), (4, 2))],
    ids=["broadcast batch", "3-d by 2-d", "vector", "2-d"],
)
def test_other_calls_run_pytorchs_composite(shapes):
    torch.manual_seed(2)
    a, b = (torch.randn(shape) for shape in shapes)
    assert not matmul.serves(a.to("tpu"), b.to("tpu"))
    assert_close(a.to("tpu") @ b.to("tpu"), a @ b)


@pytest.mark.parametrize("mode", [torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE])
def test_eager_calls_not_served_take_the_cpp_composite_with_cpus_values_and_gradients(mode, monkeypatch):
    """The composite's C++ kernel, not the Python decomposition PyTorch registers over it for tracing (which ran the
    same shape logic ~60 µs a call slower): every Fused eager product, and Strict's broadcasts, vectors, 2-d."""
    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    python = lambda *args: pytest.fail("the Python decomposition ran in eager")
    monkeypatch.setitem(torch.ops.aten.matmul.default.py_kernels, composite, python)
    torch.manual_seed(6)
    shapes = [((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (1, 5, 4, 2)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3))]
    with torch.tpu.set_eager_mode(mode):
        for shape_a, shape_b in shapes:
            cpu = [torch.randn(shape_a).requires_grad_(), torch.randn(shape_b).requires_grad_()]
            tpu = [t.detach().to("tpu").requires_grad_() for t in cpu]
            outputs = [a @ b for a, b in (cpu, tpu)]
            for output in outputs:  # products only: a TPU's tanh (~1e3 ulp) would dominate the comparison
                output.square().sum().backward()
            assert_close(outputs[1], outputs[0])
            for device_input, cpu_input in zip(tpu, cpu, strict=True):
                assert_close(device_input.grad, cpu_input.grad)


def test_integers_and_mixed_dtypes_are_not_served():
    a, b = (torch.arange(n, dtype=torch.int32).reshape(shape) for n, shape in ((24, (2, 3, 4)), (40, (2, 4, 5))))
    assert not matmul.serves(a.to("tpu"), b.to("tpu"))  # (int64 ones: tests/ops/test_linalg.py)
    assert_close(a.to("tpu") @ b.to("tpu"), a @ b)
    x, y = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    assert not matmul.serves(x.to("tpu"), y.to("tpu", torch.bfloat16))
    with pytest.raises(RuntimeError, match="same dtype|expected"):
        x.to("tpu") @ y.to("tpu", torch.bfloat16)


@pytest.mark.parametrize("fused_products", [True, False])
def test_fused_eager_records_the_product_as_one_op_unless_told_not_to(monkeypatch, fused_products):
    """Fused eager records `torch_tpu::matmul` (`matmul.FUSED`, TORCH_TPU_FUSED_PRODUCTS): one op where the
    composite records the transposed operand's copy too; values and gradients are CPU's either way."""
    from torch_tpu.eager import fused

    monkeypatch.setattr(matmul, "FUSED", fused_products)
    torch.manual_seed(4)
    x, y = torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 4)
    results = []
    for device in ("cpu", "tpu"):
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            a, b = (t.clone().to(device).requires_grad_() for t in (x, y))
            torch.tpu.synchronize()
            before = len(fused.recorder.plan)
            q, k = a.transpose(1, 2), b.transpose(1, 2)  # an attention's heads
            product = q @ k.transpose(-2, -1)
            if device == "tpu":
                recorded = len(fused.recorder.plan) - before
                assert matmul.serves(q, k.transpose(-2, -1)) is fused_products
                assert recorded == 1 if fused_products else recorded > 1, recorded
            product.square().sum().backward()
            results.append((product.detach().cpu(), a.grad.cpu(), b.grad.cpu()))
    for got, want in zip(results[1], results[0], strict=True):
        assert_close(got, want)


def test_inference_mode_and_compiled_graphs_take_it_or_leave_it_with_cpus_values():
    torch.manual_seed(3)
    x, y = torch.randn(2, 5, 3, 4), torch.randn(2, 4, 3, 6)  # transposed: (2, 3, 5, 4) @ (2, 3, 4, 6)
    with torch.inference_mode():
        assert_close(x.to("tpu").transpose(1, 2) @ y.to("tpu").transpose(1, 2), x.transpose(1, 2) @ y.transpose(1, 2))
    compiled = torch.compile(lambda a, b: (a.transpose(1, 2) @ b.transpose(1, 2)).relu(), backend="tpu")
    assert_close(compiled(x.to("tpu"), y.to("tpu")), (x.transpose(1, 2) @ y.transpose(1, 2)).relu())


class _Clones(TorchDispatchMode):
    """Counts the copies PyTorch makes (`aten::clone`), the autograd engine's thread's too."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten.clone.default
        return func(*args, **(kwargs or {}))


def _heads_loss(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """A GPT block's attention from its (batch, seq, 3 * d) projection: the heads split, transposed, multiplied."""
    b, t, d = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in qkv.split(d, dim=2))
    y = (q @ k.transpose(-2, -1)).softmax(-1) @ v
    return y.transpose(1, 2).reshape(b, t, d).square().sum()


def test_an_attentions_backward_copies_nothing_and_gives_cpus_gradients():
    """Each gradient is laid out as its input (the heads transposed out of the projection), so the transposes and
    reshapes back to it stay views: PyTorch's composite copied three gradients and three operands a layer."""
    torch.manual_seed(4)
    qkv = torch.randn(2, 6, 24)
    device_qkv, cpu_qkv = qkv.to("tpu").requires_grad_(), qkv.clone().requires_grad_()
    with _Clones() as clones:
        loss = _heads_loss(device_qkv, heads=2)
        forward = clones.count
        loss.backward()
    assert (forward, clones.count - forward) == (1, 0)  # the output's own reshape; none in the backward
    _heads_loss(cpu_qkv, heads=2).backward()
    rtol, atol = float32_tolerance(1e-5, 1e-5)
    torch.testing.assert_close(device_qkv.grad.cpu(), cpu_qkv.grad, rtol=rtol, atol=atol)


def test_torch_func_transforms_take_pytorchs_composite_with_cpus_values():
    """torch.func's wrapped tensors are plain tensors to Python: the op of ours, with autograd, leaves them."""
    torch.manual_seed(5)
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    loss = lambda x, y: (x @ y).square().sum()
    assert_close(torch.func.grad(loss)(a.to("tpu"), b.to("tpu")), torch.func.grad(loss)(a, b))
    assert_close(torch.vmap(torch.matmul)(a.to("tpu"), b.to("tpu")), torch.vmap(torch.matmul)(a, b))


@pytest.mark.parametrize("order", [None, [0, 2, 1, 3]], ids=["matmul", "matmul_ordered"])
def test_the_ops_called_by_name_differentiate_on_cpu_and_tpu_alike(order):
    """The route calls the ops' tpu kernels without the dispatcher; called by name, on either device, they take
    the dispatcher and their registered autograd."""
    torch.manual_seed(2)
    a, b, grad = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 5, 6), torch.randn(2, 3, 4, 6)
    op = torch.ops.torch_tpu.matmul if order is None else torch.ops.torch_tpu.matmul_ordered
    results = []
    for device in ("cpu", "tpu"):
        x, y = (t.detach().to(device).requires_grad_() for t in (a, b))
        out = op(x, y) if order is None else op(x, y, order)
        out.backward(grad.to(device) if order is None else grad.permute(order).to(device))
        results.append((out, x.grad, y.grad))
    for got, want in zip(results[1], results[0], strict=True):
        assert_close(got, want)
