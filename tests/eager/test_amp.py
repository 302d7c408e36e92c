"""Automatic mixed precision on `tpu`: torch.autocast("tpu") (bfloat16 by default, PyTorch's accelerator cast
policy) against CPU PyTorch, and torch.amp.GradScaler with the for-loop, foreach and fused optimizers."""

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_tpu.amp
from torch_tpu.testing.compare import TOLERANCES, float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

torch_tpu.amp.install()  # idempotent: a no-op once importing torch_tpu has installed it
BF16, FP32 = torch.bfloat16, torch.float32
BF16_TOL = dict(zip(("rtol", "atol"), TOLERANCES[BF16], strict=True))


def test_defaults():
    assert torch.amp.is_autocast_available("tpu")
    assert torch.get_autocast_dtype("tpu") == BF16
    assert torch.tpu.get_amp_supported_dtype() == [BF16, torch.float16]
    with torch.autocast("tpu") as mode:
        assert mode.fast_dtype == BF16
        assert torch.is_autocast_enabled("tpu")
    assert not torch.is_autocast_enabled("tpu")


def test_unsupported_dtype_disables_autocast():
    with pytest.warns(UserWarning, match="not supported"), torch.autocast("tpu", dtype=torch.float32):
        assert not torch.is_autocast_enabled("tpu")


def test_policy_is_pytorchs_accelerator_policy():
    """The ops with a rule are exactly those PyTorch gives XPU, MTIA and MAIA (CUDA's list less cuDNN's ops)."""
    names = torch._C._dispatch_get_all_op_names()
    accelerator = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastXPU")}
    assert accelerator == {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastMTIA")}
    ours = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastPrivateUse1")}
    assert ours == accelerator


def make(*shape, dtype=FP32):
    return torch.randn(*shape, dtype=dtype)


# Ops on which CPU autocast(bfloat16) and the accelerator policy agree: compare dtypes and values with CPU.
SAME_AS_CPU = {
    "linear": (lambda x, w, b: F.linear(x, w, b), (make(4, 8), make(6, 8), make(6))),
    "mm": (torch.mm, (make(4, 8), make(8, 6))),
    "matmul": (torch.matmul, (make(2, 4, 8), make(8, 6))),
    "bmm": (torch.bmm, (make(2, 4, 8), make(2, 8, 6))),
    "baddbmm": (torch.baddbmm, (make(2, 4, 6), make(2, 4, 8), make(2, 8, 6))),
    "addmm": (torch.addmm, (make(6), make(4, 8), make(8, 6))),
    "conv1d": (lambda x, w: F.conv1d(x, w, padding=1), (make(2, 3, 9), make(4, 3, 3))),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2), (make(2, 3, 9, 9), make(4, 3, 3, 3), make(4))),
    "conv_transpose2d": (F.conv_transpose2d, (make(2, 4, 5, 5), make(4, 3, 3, 3))),
    "prelu": (F.prelu, (make(2, 3, 4), make(3))),
    "sdpa": (F.scaled_dot_product_attention, (make(2, 2, 5, 8), make(2, 2, 5, 8), make(2, 2, 5, 8))),
    "sdpa_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (make(2, 2, 5, 8), make(2, 2, 5, 8), make(2, 2, 5, 8)),
    ),
    "mse_loss": (F.mse_loss, (make(4, 6), make(4, 6, dtype=BF16))),
    "l1_loss": (F.l1_loss, (make(4, 6, dtype=BF16), make(4, 6, dtype=BF16))),
    "smooth_l1_loss": (F.smooth_l1_loss, (make(4, 6, dtype=BF16), make(4, 6))),
    "nll_loss": (lambda x, t: F.nll_loss(x, t.long()), (make(4, 6, dtype=BF16), torch.tensor([0, 5, 2, 1.0]))),
    "bce_with_logits": (F.binary_cross_entropy_with_logits, (make(4, 6, dtype=BF16), torch.rand(4, 6))),
    "kl_div": (lambda x, y: F.kl_div(x, y, reduction="batchmean"), (make(4, 6, dtype=BF16), torch.rand(4, 6))),
    "cosine_embedding_loss": (
        lambda x, y: F.cosine_embedding_loss(x, y, torch.tensor([1, -1, 1, -1], device=x.device)),
        (make(4, 6, dtype=BF16), make(4, 6, dtype=BF16)),
    ),
    "cat": (lambda x, y: torch.cat([x, y]), (make(2, 3, dtype=BF16), make(2, 3))),
    "stack": (lambda x, y: torch.stack([x, y]), (make(2, 3, dtype=BF16), make(2, 3))),
    "add": (torch.add, (make(2, 3, dtype=BF16), make(2, 3))),
    "relu": (F.relu, (make(2, 3, dtype=BF16),)),
    "prod": (torch.prod, (make(2, 3, dtype=BF16),)),
}


def run(fn, args, device):
    with torch.autocast(device, dtype=BF16):
        return fn(*[a.to(device) for a in args])


# CPU's bfloat16 conv_transpose2d does not accumulate in float32: it is up to ~3 bfloat16 ulps off the float32
# result on the same (bfloat16) inputs, where rounding alone is half an ulp. XLA accumulates in float32, so the
# reference is that float32 result, rounded.
FLOAT32_ACCUMULATED = {"conv_transpose2d"}


@pytest.mark.parametrize("name", sorted(SAME_AS_CPU))
def test_autocast_matches_cpu(name):
    fn, args = SAME_AS_CPU[name]
    expected, actual = run(fn, args, "cpu"), run(fn, args, "tpu")
    assert actual.device.type == "tpu"
    assert actual.dtype == expected.dtype
    if name in FLOAT32_ACCUMULATED:
        expected = fn(*[a.to(BF16).float() for a in args]).to(expected.dtype)
    torch.testing.assert_close(actual.cpu(), expected, **BF16_TOL)


# Ops the accelerator policy runs in float32 (CPU autocast leaves them in the input's dtype): the result is
# float32, and equals the CPU op on the float32 value of the same (bfloat16) input.
FLOAT32_OPS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, 1),
    "layer_norm": lambda x: F.layer_norm(x, (6,)),
    "group_norm": lambda x: F.group_norm(x, 2),
    "rms_norm": lambda x: F.rms_norm(x, (6,)),
    "sum": torch.sum,
    "sum_dim": lambda x: x.sum(1),
    "cumsum": lambda x: x.cumsum(0),
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs()),
    "pow": lambda x: x.pow(2),
    "rsqrt": lambda x: x.abs().rsqrt(),
    "softplus": F.softplus,
    "logsumexp": lambda x: x.logsumexp(1),
    "norm": lambda x: x.norm(),
    "norm_dim": lambda x: x.norm(dim=1),
    "vector_norm": lambda x: torch.linalg.vector_norm(x),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x.flip(0)),
    "interpolate": lambda x: F.interpolate(x[None], scale_factor=2, mode="linear"),
}


@pytest.mark.parametrize("name", sorted(FLOAT32_OPS))
def test_autocast_float32_ops(name):
    if name == "rms_norm" and not torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastXPU"):
        pytest.skip("this torch (2.11) gives rms_norm no autocast rule on its accelerators, nor do we")
    fn = FLOAT32_OPS[name]
    x = make(4, 6, dtype=BF16)
    with torch.autocast("tpu"):
        actual = fn(x.to("tpu"))
    assert actual.dtype == FP32
    rtol, atol = float32_tolerance(1e-5, 1e-5)  # log, softplus, ...: the chip's float32 transcendentals
    torch.testing.assert_close(actual.cpu(), fn(x.float()), rtol=rtol, atol=atol)


def test_explicit_dtype_argument_is_kept():
    x = make(4, 6, dtype=BF16).to("tpu")
    with torch.autocast("tpu"):
        assert torch.softmax(x, -1, dtype=torch.float64).dtype == torch.float64
        assert x.sum(dtype=BF16).dtype == BF16


def test_float64_is_not_cast():
    with torch.autocast("tpu"):
        assert torch.mm(make(3, 4, dtype=torch.float64).to("tpu"), make(4, 2, dtype=torch.float64).to("tpu")).dtype == (
            torch.float64
        )


def test_float16_autocast():
    x, w = make(4, 8), make(6, 8)
    with torch.autocast("tpu", dtype=torch.float16):
        out = F.linear(x.to("tpu"), w.to("tpu"))
    assert out.dtype == torch.float16
    rtol, atol = TOLERANCES[torch.float16]
    torch.testing.assert_close(out.cpu(), F.linear(x.half(), w.half()), rtol=rtol, atol=atol)


def test_nested_disable():
    x = make(4, 8).to("tpu")
    with torch.autocast("tpu"):
        with torch.autocast("tpu", enabled=False):
            assert torch.mm(x, x.t()).dtype == FP32
        assert torch.mm(x, x.t()).dtype == BF16


def test_binary_cross_entropy_is_banned():
    with torch.autocast("tpu"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(torch.rand(3).to("tpu"), torch.rand(3).to("tpu"))


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_autocast_training_step():
    """Forward under autocast, backward outside it: float32 master weights get float32 gradients that match a
    CPU autocast(bfloat16) step within bfloat16 tolerance."""
    torch.manual_seed(1)
    x, labels = make(8, 8), torch.randint(0, 4, (8,))
    grads = {}
    for device in ("cpu", "tpu"):
        model = copy.deepcopy(mlp()).to(device)
        with torch.autocast(device, dtype=BF16):
            logits = model(x.to(device))
            loss = F.cross_entropy(logits, labels.to(device))
        assert logits.dtype == BF16 and loss.dtype == FP32
        loss.backward()
        grads[device] = [p.grad for p in model.parameters()]
    for ours, theirs in zip(grads["tpu"], grads["cpu"], strict=True):
        assert ours.dtype == FP32
        torch.testing.assert_close(ours.cpu(), theirs, **BF16_TOL)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "adagrad_fused": lambda p: torch.optim.Adagrad(p, lr=0.1, fused=True),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_grad_scaler(optimizer):
    """Scaled steps, one with an Inf loss (skipped, scale backed off), and scale growth, as on CPU."""
    torch.manual_seed(1)
    data = [(make(8, 8), torch.randint(0, 4, (8,))) for _ in range(5)]
    results = {}
    for device in ("cpu", "tpu"):
        model = copy.deepcopy(mlp()).to(device)
        opt = OPTIMIZERS[optimizer](model.parameters())
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
        scales = []
        for step, (x, labels) in enumerate(data):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), labels.to(device)) * (float("inf") if step == 2 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        results[device] = scales, [p.detach().cpu() for p in model.parameters()]
    assert results["tpu"][0] == results["cpu"][0] == [256.0, 512.0, 256.0, 256.0, 512.0]
    rtol, atol = float32_tolerance(1e-5, 1e-6)  # five steps through softmax's exp and log on the chip
    torch.testing.assert_close(results["tpu"][1], results["cpu"][1], rtol=rtol, atol=atol)


@pytest.mark.parametrize("bad", [None, float("nan"), float("-inf")])
def test_unscale_and_check(bad):
    grads = [make(3, 4), make(5)]
    if bad is not None:
        grads[1][2] = bad
    ours = [g.to("tpu") for g in grads]
    found_inf = torch.zeros((), device="tpu")
    torch._amp_foreach_non_finite_check_and_unscale_(ours, found_inf, torch.full((), 0.5, device="tpu"))
    assert found_inf.item() == (0.0 if bad is None else 1.0)
    torch.testing.assert_close([g.cpu() for g in ours], [g * 0.5 for g in grads], equal_nan=True)
