"""Batch, instance, layer and group normalization on `tpu` against CPU PyTorch, running statistics included."""

import collections
import copy
import functools

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from tests.helpers import random_tensor
from torch_tpu.testing.compare import assert_close, check_op, to_tpu

FLOAT, BF16 = torch.float32, torch.bfloat16
aten = torch.ops.aten


# Normal floats requiring grad (tests/helpers.py)
make = functools.partial(random_tensor, grad=True)


def stats(channels):
    return torch.randn(channels), torch.rand(channels) + 0.5


NORMS = [
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (5, 6), w, b), (2, 3, 5, 6), (5, 6)),
    ("layer_norm_no_affine", lambda x: F.layer_norm(x, (6,)), (2, 3, 5, 6), None),
    ("group_norm", lambda x, w, b: F.group_norm(x, 3, w, b), (2, 6, 5), (6,)),
    ("group_norm_4d", lambda x, w, b: F.group_norm(x, 2, w, b, eps=1e-3), (2, 4, 3, 5), (4,)),
    ("group_norm_no_affine", lambda x: F.group_norm(x, 1), (2, 4, 3, 5), None),
    ("instance_norm", lambda x: F.instance_norm(x), (2, 3, 4, 5), None),
    ("batch_norm_no_stats", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (4, 3, 5), (3,)),
]


@pytest.mark.parametrize("name, fn, shape, affine", NORMS, ids=[n[0] for n in NORMS])
def test_norm(name, fn, shape, affine):
    params = [make(*affine), make(*affine)] if affine else []
    check_op(fn, make(*shape), *params, grad=True)


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 2)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(shape, training):
    mean, var = stats(3)

    def fn(x, w, b):
        out = F.batch_norm(x, mean.clone().to(x.device), var.clone().to(x.device), w, b, training, 0.2, 1e-4)
        return out

    check_op(fn, make(*shape), make(3), make(3), grad=True)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_module_running_stats(training, momentum):
    module = torch.nn.BatchNorm2d(3, momentum=momentum)
    module.running_mean.copy_(torch.randn(3))
    module.running_var.copy_(torch.rand(3) + 0.5)
    module.train(training)
    on_tpu = copy.deepcopy(module).to("tpu")
    for _ in range(3):
        x = torch.randn(4, 3, 5, 5)
        torch.testing.assert_close(on_tpu(x.to("tpu")).cpu(), module(x), rtol=1.3e-5, atol=1e-5)
    for (name, ours), theirs in zip(on_tpu.state_dict().items(), module.state_dict().values(), strict=True):
        assert ours.device.type == "tpu", name
        torch.testing.assert_close(ours.cpu(), theirs, rtol=1.3e-5, atol=1e-5, msg=name)


def test_native_batch_norm_variants():
    x, w, b = make(4, 3, 5, grad=False), make(3, grad=False), make(3, grad=False)
    mean, var = stats(3)
    tpu = [t.to("tpu") for t in (x, w, b, mean, var)]
    check_op(lambda *a: aten._native_batch_norm_legit_functional(*a, True, 0.1, 1e-5), x, w, b, mean, var)
    check_op(lambda *a: aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5), x, w, b, mean, var)
    check_op(lambda *a: aten._native_batch_norm_legit(*a, True, 0.1, 1e-5), x, w, b)
    for op in (aten._native_batch_norm_legit.default, aten.native_batch_norm.default):
        cpu_mean, cpu_var, tpu_mean, tpu_var = mean.clone(), var.clone(), tpu[3].clone(), tpu[4].clone()
        expected = op(x, w, b, cpu_mean, cpu_var, True, 0.3, 1e-5)
        actual = op(*tpu[:3], tpu_mean, tpu_var, True, 0.3, 1e-5)
        for a, e in zip((*actual, tpu_mean, tpu_var), (*expected, cpu_mean, cpu_var), strict=True):
            torch.testing.assert_close(a.cpu(), e, rtol=1.3e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w, b: F.layer_norm(x, (6,), w, b),
        lambda x, w, b: F.group_norm(x.transpose(1, 3), 2, w, b),
        lambda x, w, b: F.batch_norm(x.transpose(1, 3), None, None, w, b, training=True),
    ],
    ids=["layer_norm", "group_norm", "batch_norm"],
)
def test_norm_bf16(fn):
    """bf16 on tpu against the float32 CPU result rounded to bf16: CPU PyTorch accumulates the weight and bias
    gradients of bf16 norms in bf16, which is further from the exact result than bf16 tolerance."""
    args = [make(2, 3, 4, 6, dtype=BF16), make(6, dtype=BF16), make(6, dtype=BF16)]
    reference = [a.detach().float().requires_grad_() for a in args]
    expected = fn(*reference)
    seed = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, reference, seed)
    on_tpu = to_tpu(args)
    actual = fn(*on_tpu)
    grads = torch.autograd.grad(actual, on_tpu, seed.to("tpu", BF16))
    assert_close(actual, expected.to(BF16))
    assert_close(list(grads), [g.to(BF16) for g in expected_grads])


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("params", [BF16, FLOAT], ids=["bf16_params", "float32_params"])
def test_saved_statistics_dtypes_follow_cpu(params, training):
    """Mean and rstd come back in the input's dtype, or float32 for a bf16 input with float32 parameters (CPU's
    rule; PyTorch's meta kernels, which follow CUDA, say float32 throughout)."""
    x = make(4, 3, 5, dtype=BF16, grad=False)
    w, b = make(3, dtype=params, grad=False), make(3, dtype=params, grad=False)
    mean, var = (s.to(params) for s in stats(3))
    check_op(lambda x: aten.native_layer_norm(x, (5,), None, None, 1e-5), x)
    check_op(
        lambda *a: aten.native_layer_norm(a[0], (5,), *a[1:], 1e-5),
        x,
        make(5, dtype=params, grad=False),
        make(5, dtype=params, grad=False),
    )
    check_op(lambda *a: aten._native_batch_norm_legit(*a, True, 0.1, 1e-5), x, w, b)
    check_op(lambda *a: aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5), x, w, b, mean, var)
    check_op(lambda *a: aten.native_batch_norm(*a, training, 0.1, 1e-5), x, w, b, mean.clone(), var.clone())
    check_op(lambda *a: aten._native_batch_norm_legit(*a, training, 0.1, 1e-5), x, w, b, mean.clone(), var.clone())


def test_saved_statistics_are_cast_inside_the_ops_program():
    """A bfloat16 layer norm's statistics take CPU's dtype inside its own program: in Fused eager it records one
    op, where a cast of each statistic after it made three (a large GPT's step: 50 ops of its ~630)."""
    x, w, b = (make(*shape, dtype=BF16, grad=False).to("tpu") for shape in ((4, 3, 5), (5,), (5,)))
    torch.tpu.synchronize()
    before = collections.Counter(torch_tpu.metrics.fused_clusters)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        out, mean, rstd = aten.native_layer_norm(x, (5,), w, b, 1e-5)
        torch.tpu.synchronize()
    assert torch_tpu.metrics.fused_clusters - before == collections.Counter({1: 1})
    assert out.dtype == mean.dtype == rstd.dtype == BF16


@pytest.mark.parametrize("dtype", [FLOAT, BF16])
def test_batch_norm_with_update(dtype):
    """`_batch_norm_with_update` (what export/pre-dispatch graphs call) updates the running statistics in place;
    its backward is `batch_norm_backward`."""
    mean, var = (s.to(dtype) for s in stats(3))
    x, w, b = make(4, 3, 5, dtype=dtype), make(3, dtype=dtype), make(3, dtype=dtype)
    cpu_mean, cpu_var, tpu_mean, tpu_var = mean.clone(), var.clone(), mean.to("tpu"), var.to("tpu")
    expected = aten._batch_norm_with_update(x, w, b, cpu_mean, cpu_var, 0.3, 1e-5)
    actual = aten._batch_norm_with_update(*to_tpu([x, w, b]), tpu_mean, tpu_var, 0.3, 1e-5)
    assert_close(list(actual[:3]) + [tpu_mean, tpu_var], list(expected[:3]) + [cpu_mean, cpu_var])
    assert actual[3].dtype == torch.uint8 and actual[3].numel() == 0
    check_op(lambda *a: aten._batch_norm_with_update(*a, 0.3, 1e-5)[0], x, w, b, mean.clone(), var.clone(), grad=True)


def test_group_norm_zero_batch_gradients():
    check_op(lambda x, w, b: F.group_norm(x, 2, w, b), make(0, 4, 3), make(4), make(4), grad=True)
