"""`F.linear` in Strict eager (`kernels.prebuilt.linear`): one program forward and one backward, with CPU PyTorch's
values and gradients; every other call is PyTorch's composite."""

import pytest
import torch

from tests.helpers import cache_requests
from torch_tpu.kernels.prebuilt import linear
from torch_tpu.testing.compare import assert_close, float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def _layer(device: str, tensors: list, wanted: tuple[bool, ...], grad: torch.Tensor) -> tuple[list, list[int]]:
    """The layer's output and its inputs' wanted gradients for the output's gradient `grad` on `device`, and the
    programs the forward and the backward each ran there."""
    leaf = lambda t, w: None if t is None else t.clone().to(device).requires_grad_(w)
    inputs = [leaf(t, w) for t, w in zip(tensors, wanted, strict=True)]
    before = cache_requests()
    y = torch.nn.functional.linear(*inputs)
    forward = cache_requests()
    y.backward(grad.to(device))
    grads = [t.grad for t, w in zip(inputs, wanted, strict=True) if t is not None and w]
    return [y, *grads], [forward - before, cache_requests() - forward]


CASES = {
    "3-d": ((2, 3, 8), True, (True, True, True)),
    "2-d without bias": ((4, 8), False, (True, True, False)),
    "input without gradient": ((2, 3, 8), True, (False, True, True)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_a_layer_is_one_program_each_way_with_cpus_values_and_gradients(dtype, case):
    torch.manual_seed(0)
    x_shape, bias, wanted = CASES[case]
    x, weight = torch.randn(x_shape, dtype=dtype), torch.randn(5, 8, dtype=dtype)
    tensors = [x, weight, torch.randn(5, dtype=dtype) if bias else None]
    grad = torch.randn(*x_shape[:-1], 5, dtype=dtype)
    assert linear.serves(*(None if t is None else t.to("tpu") for t in tensors))
    _layer("tpu", tensors, wanted, grad)  # compiled, then one cached program each way
    got, programs = _layer("tpu", tensors, wanted, grad)
    assert programs == [1, 1]  # PyTorch's composite: its backward takes one per gradient
    expected, _ = _layer("cpu", tensors, wanted, grad)
    rtol, atol = float32_tolerance(1e-5, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)
    for device_value, cpu_value in zip(got, expected, strict=True):
        torch.testing.assert_close(device_value.detach().cpu(), cpu_value.detach(), rtol=rtol, atol=atol)


def test_second_derivatives_are_cpus():
    torch.manual_seed(1)
    x, weight, bias = torch.randn(3, 4), torch.randn(2, 4), torch.randn(2)
    results = []
    for device in ("cpu", "tpu"):
        inputs = [t.to(device).requires_grad_() for t in (x, weight, bias)]
        (grad_x,) = torch.autograd.grad((torch.nn.functional.linear(*inputs) ** 2).sum(), inputs[0], create_graph=True)
        results.append((grad_x, *torch.autograd.grad(grad_x.sum(), inputs)))
    for got, want in zip(results[1], results[0], strict=True):
        assert_close(got, want)


def test_other_calls_run_pytorchs_composite_with_its_values_and_errors():
    torch.manual_seed(2)
    vector, weight = torch.randn(8), torch.randn(5, 8)
    assert not linear.serves(vector.to("tpu"), weight.to("tpu"), None)
    expected = torch.nn.functional.linear(vector, weight)
    assert_close(torch.nn.functional.linear(vector.to("tpu"), weight.to("tpu")), expected)
    x = torch.randn(3, 8)
    assert not linear.serves(x.to("tpu"), weight.to("tpu", torch.bfloat16), None)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied|size mismatch"):
        torch.nn.functional.linear(x.to("tpu"), torch.randn(5, 7).to("tpu"))


@pytest.mark.parametrize("fused_products", [True, False])
def test_fused_eager_records_the_layer_as_one_op_each_way_unless_told_not_to(monkeypatch, fused_products):
    """Fused eager records `torch_tpu::linear` and its backward (`matmul.FUSED`, TORCH_TPU_FUSED_PRODUCTS): one op
    each way where the composite records more; values and gradients are CPU's either way."""
    from torch_tpu.eager import fused
    from torch_tpu.kernels.prebuilt import matmul

    monkeypatch.setattr(matmul, "FUSED", fused_products)
    torch.manual_seed(5)
    tensors, grad = [torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(5)], torch.randn(2, 3, 5)
    results, counts = [], []
    for device in ("cpu", "tpu"):
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            inputs = [t.clone().to(device).requires_grad_() for t in tensors]
            torch.tpu.synchronize()
            before = len(fused.recorder.plan)
            y = torch.nn.functional.linear(*inputs)
            forward = len(fused.recorder.plan)
            y.backward(grad.to(device))
            counts = [forward - before, len(fused.recorder.plan) - forward]
            results.append([y.detach().cpu(), *(t.grad.cpu() for t in inputs)])
    assert linear.serves(*(t.to("tpu") for t in tensors)) or not fused_products
    if fused_products:
        assert counts == [1, 1], counts  # the gradient enters as a leaf: the backward's one op
    else:
        assert counts[0] + counts[1] > 2, counts
    for got, want in zip(results[1], results[0], strict=True):
        assert_close(got, want)


def test_inference_mode_torch_func_and_compiled_graphs_give_cpus_values():
    torch.manual_seed(3)
    x, weight, bias = torch.randn(2, 3, 4), torch.randn(6, 4), torch.randn(6)
    on_device = [t.to("tpu") for t in (x, weight, bias)]
    expected = torch.nn.functional.linear(x, weight, bias)
    with torch.inference_mode():
        assert_close(torch.nn.functional.linear(*on_device), expected)
    loss = lambda w, x, b: torch.nn.functional.linear(x, w, b).square().sum()
    expected_grad = torch.func.grad(loss)(weight, x, bias)
    assert_close(torch.func.grad(loss)(on_device[1], on_device[0], on_device[2]), expected_grad)
    compiled = torch.compile(lambda x, w, b: torch.nn.functional.linear(x, w, b).relu(), backend="tpu")
    assert_close(compiled(*on_device), expected.relu())


def test_the_op_called_by_name_differentiates_on_cpu_and_tpu_alike():
    """The route calls `torch_tpu::linear`'s tpu kernel without the dispatcher; called by name, on either device,
    it takes the dispatcher and its registered autograd."""
    torch.manual_seed(3)
    tensors, grad = (torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(5)), torch.randn(2, 3, 5)
    results = []
    for device in ("cpu", "tpu"):
        inputs = [t.detach().to(device).requires_grad_() for t in tensors]
        out = torch.ops.torch_tpu.linear(*inputs)
        out.backward(grad.to(device))
        results.append((out, *(t.grad for t in inputs)))
    for got, want in zip(results[1], results[0], strict=True):
        assert_close(got, want)
