"""`torch.tpu.ops` ragged_dot, optimization_barrier and max_pool1d/2d/3d against CPU PyTorch (a float64 reference
for ragged_dot, `F.max_pool{n}d` for pooling): forward and gradients, eager and under
`torch.compile(backend="tpu", fullgraph=True)` (no graph break), and argument errors naming the argument."""

import pytest
import torch
import torch.nn.functional as F

from torch_tpu.testing.compare import assert_close

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def _compiled(fn):
    return torch.compile(fn, backend="tpu", fullgraph=True)


def _eager_and_compiled(fn, *cpu_inputs, reference, rtol=None, atol=None):
    """`fn` on tpu copies of `cpu_inputs`, eager and compiled: output and every input's gradient (of a fixed
    random weighting of the output) equal `reference` run on the CPU inputs."""
    torch.manual_seed(1)
    torch._dynamo.reset()  # a fresh cache per case: a recompile of the same lambda would pass its ints as SymInts
    inputs = [x.detach().requires_grad_(x.is_floating_point()) for x in cpu_inputs]
    expected = reference(*inputs)
    seed = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, [x for x in inputs if x.requires_grad], seed)
    for run in (fn, _compiled(fn)):
        tpu = [x.detach().to("tpu").requires_grad_(x.requires_grad) for x in inputs]
        out = run(*tpu)
        assert out.device.type == "tpu"
        grads = torch.autograd.grad(out, [x for x in tpu if x.requires_grad], seed.to("tpu"))
        assert_close(out, expected.detach(), rtol, atol)
        assert_close(grads, expected_grads, rtol, atol)


def test_the_ops_are_torch_ops_under_torch_tpu_ops():
    import torch.tpu.ops as tpu_ops

    assert tpu_ops is torch.tpu.ops and torch.tpu.ops.ragged_dot is torch.ops.torch_tpu.ragged_dot
    # the name list itself is tests/test_public_api.py's TORCHTPU_OPS
    assert all(hasattr(torch.tpu.ops, name) for name in torch.tpu.ops.__all__)


def _ragged_reference(lhs, rhs, group_sizes):
    """Group g's rows of `lhs` times `rhs[g]`, in float64; rows past the groups' total are zero."""
    out, start = [], 0
    for group, size in enumerate(group_sizes.tolist()):
        out.append(lhs[start : start + size].double() @ rhs[group].double())
        start += size
    out.append(lhs.new_zeros(lhs.shape[0] - start, rhs.shape[2], dtype=torch.float64))
    return torch.cat(out).to(lhs.dtype)


@pytest.mark.parametrize(
    "group_sizes", [[3, 0, 5], pytest.param([4, 4, 2], marks=pytest.mark.slow)], ids=["empty group, trailing", "all"]
)
def test_ragged_dot_matches_a_float64_grouped_matmul_eager_and_compiled(group_sizes):
    lhs, rhs = torch.randn(10, 4), torch.randn(3, 4, 5)
    sizes = torch.tensor(group_sizes, dtype=torch.int32)
    _eager_and_compiled(torch.tpu.ops.ragged_dot, lhs, rhs, sizes, reference=_ragged_reference)
    assert_close(torch.tpu.ops.ragged_dot(lhs, rhs, sizes), _ragged_reference(lhs, rhs, sizes))  # the CPU kernel


def test_ragged_dot_rejects_bad_arguments_naming_them():
    lhs, rhs, sizes = torch.randn(6, 4, device="tpu"), torch.randn(2, 4, 3, device="tpu"), torch.tensor([3, 3])
    sizes = sizes.to("tpu")
    with pytest.raises(ValueError, match="rhs shape"):
        torch.tpu.ops.ragged_dot(lhs, torch.randn(2, 5, 3, device="tpu"), sizes)
    with pytest.raises(ValueError, match="group_sizes has 3 groups"):
        torch.tpu.ops.ragged_dot(lhs, rhs, torch.tensor([1, 2, 3], device="tpu"))
    with pytest.raises(TypeError, match="group_sizes has dtype torch.float32"):
        torch.tpu.ops.ragged_dot(lhs, rhs, sizes.float())
    with pytest.raises(ValueError, match="lhs must be 2-D"):
        torch.tpu.ops.ragged_dot(lhs[None], rhs, sizes)


def test_optimization_barrier_keeps_values_passes_gradients_and_reaches_the_program():
    a, b = torch.randn(3, 4), torch.randn(5)
    ta, tb = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    x, y = torch.tpu.ops.optimization_barrier([ta * 2, tb + 1])
    assert_close((x, y), (a * 2, b + 1))
    (x.sum() + (y * y).sum()).backward()
    assert_close((ta.grad, tb.grad), (torch.full_like(a, 2.0), 2 * (b + 1)))
    texts = []

    def barrier_then_add(p, q):
        p, q = torch.tpu.ops.optimization_barrier([p.sin(), q.cos()])
        return p + q

    options = {"debug_callback": lambda fx, stablehlo: texts.append(stablehlo)}
    compiled = torch.compile(barrier_then_add, backend="tpu", fullgraph=True, options=options)
    assert_close(compiled(ta.detach(), ta.detach()), a.sin() + a.cos())
    assert any("optimization_barrier" in text for text in texts)


_POOLS = [
    pytest.param(1, (2, 3, 11), dict(kernel_size=3, stride=2, padding=1), marks=pytest.mark.slow),
    (1, (3, 10), dict(kernel_size=2, dilation=3, ceil_mode=True)),
    (2, (2, 3, 9, 8), dict(kernel_size=3, stride=2, padding=1)),
    (2, (1, 2, 10, 7), dict(kernel_size=(3, 2), stride=(2, 3), dilation=(1, 2), ceil_mode=True)),
    (3, (1, 2, 6, 5, 7), dict(kernel_size=2, stride=(2, 1, 2), padding=(1, 0, 1))),
]


@pytest.mark.parametrize(
    "n, shape, options", _POOLS, ids=["1d padded", "1d dilated ceil", "2d", "2d dilated ceil", "3d"]
)
def test_max_pool_matches_F_max_pool_forward_and_backward_eager_and_compiled(n, shape, options):
    x = torch.randn(shape)
    pool = getattr(torch.tpu.ops, f"max_pool{n}d")
    torch_pool = getattr(F, f"max_pool{n}d")
    _eager_and_compiled(lambda t: pool(t, **options), x, reference=lambda t: torch_pool(t, **options))


def test_max_pool_bfloat16_and_the_cpu_kernel():
    x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)
    assert_close(torch.tpu.ops.max_pool2d(x.to("tpu"), 2), F.max_pool2d(x, 2))
    assert_close(torch.tpu.ops.max_pool2d(x, 3, 1, 1), F.max_pool2d(x, 3, 1, 1))


def test_max_pool_rejects_bad_arguments_naming_them():
    x = torch.randn(2, 3, 8, 8, device="tpu")
    with pytest.raises(ValueError, match="max_pool2d: input must be 3 or 4-D"):
        torch.tpu.ops.max_pool2d(x[None], 2)
    with pytest.raises(ValueError, match="padding .* at most half of kernel_size"):
        torch.tpu.ops.max_pool2d(x, 2, 1, 2)
    with pytest.raises(TypeError, match="input has dtype torch.int64"):
        torch.tpu.ops.max_pool1d(torch.ones(2, 5, dtype=torch.int64, device="tpu"), 2)
    with pytest.raises(ValueError, match="kernel_size, stride and dilation must be positive"):
        torch.tpu.ops.max_pool3d(torch.randn(1, 4, 4, 4, device="tpu"), 0)


@pytest.mark.parametrize("mode", ["DEFER_NEVER_AND_LAUNCH_BLOCKING", "DEFER_AND_FUSE"], ids=["debug", "fused"])
def test_the_ops_run_in_debug_and_fused_eager_with_gradients(mode):
    lhs, rhs, sizes = torch.randn(6, 4), torch.randn(2, 4, 3), torch.tensor([2, 4])
    x = torch.randn(1, 2, 6, 6)
    leaves = [t.to("tpu").requires_grad_() for t in (lhs, rhs, x)]
    with torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode)):
        product = torch.tpu.ops.ragged_dot(leaves[0], leaves[1], sizes.to("tpu"))
        pooled = torch.tpu.ops.max_pool2d(leaves[2] * 2, 2)
        (product.sum() + pooled.sum()).backward()
        got = [product, pooled, *(leaf.grad for leaf in leaves)]
        got = [t.cpu() for t in got]
    cpu = [t.clone().requires_grad_() for t in (lhs, rhs, x)]
    expected_product, expected_pooled = _ragged_reference(cpu[0], cpu[1], sizes), F.max_pool2d(cpu[2] * 2, 2)
    (expected_product.sum() + expected_pooled.sum()).backward()
    assert_close(got, [expected_product.detach(), expected_pooled.detach(), *(t.grad for t in cpu)])
