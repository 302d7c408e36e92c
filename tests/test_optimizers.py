"""torch.optim on `tpu` against CPU PyTorch: every optimizer in its for-loop, foreach, fused and capturable
implementations, LR schedulers, and gradient clipping.

PyTorch lists every PrivateUse1 backend among the devices with fused optimizers (and capturable ones), so
`fused=True` runs torch_tpu's fused kernels (`ops/nn/optim.py`); CPU runs its own fused kernels to compare with.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.optim import lr_scheduler
from torch.optim.optimizer import _get_capturable_supported_devices
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from torch_tpu.testing.compare import float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

STEPS = 3
# fp32 over a few optimizer steps: per-op differences (~1e-6 relative) compound through the updates.
RTOL, ATOL = float32_tolerance(1e-5, 1e-6)
# (on a TPU, the chip's float32 transcendentals -- tanh, exp, log -- widen that: torch_tpu.testing.compare)


def model():
    """A small MLP in which every parameter gets a real (nonzero) gradient."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batches(steps=STEPS):
    torch.manual_seed(1)
    return [(torch.randn(5, 6), torch.randn(5, 3)) for _ in range(steps)]


def train(optimizer_fn, device, steps=STEPS, scheduler_fn=None):
    """`steps` optimizer steps on `device`; the parameters, optimizer state and learning rates afterwards."""
    net = copy.deepcopy(model()).to(device)
    optimizer = optimizer_fn(net.parameters())
    scheduler = scheduler_fn(optimizer) if scheduler_fn else None
    lrs = []
    for inputs, targets in batches(steps):
        optimizer.zero_grad()
        F.mse_loss(net(inputs.to(device)), targets.to(device)).backward()
        optimizer.step()
        if scheduler:
            scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    state = [
        {key: value.cpu() if isinstance(value, torch.Tensor) else value for key, value in s.items()}
        for s in optimizer.state.values()
    ]
    return [p.detach().cpu() for p in net.parameters()], state, lrs


def assert_matches_cpu(optimizer_fn, cpu_optimizer_fn=None, **kwargs):
    ours = train(optimizer_fn, "tpu", **kwargs)
    theirs = train(cpu_optimizer_fn or optimizer_fn, "cpu", **kwargs)
    torch.testing.assert_close(ours, theirs, rtol=RTOL, atol=ATOL)


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1)),
    "sgd_nesterov_wd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "sgd_maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.5, maximize=True)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_amsgrad_wd": (torch.optim.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    "adam_maximize": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.9), maximize=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=0.01, amsgrad=True)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=0.01)),
    "rmsprop_centered_momentum_wd": (
        torch.optim.RMSprop,
        dict(lr=0.01, centered=True, momentum=0.9, weight_decay=0.01),
    ),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1)),
    "adagrad_decay_wd": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, eps=1e-6)),
}
FUSED = {torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad}
CAPTURABLE = {torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop}


@pytest.mark.parametrize("implementation", ["for_loop", "foreach"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer(name, implementation):
    cls, kwargs = OPTIMIZERS[name]
    assert_matches_cpu(lambda p: cls(p, foreach=implementation == "foreach", **kwargs))


def test_tpu_has_fused_and_capturable_optimizers():
    assert "tpu" in _get_fused_kernels_supported_devices()
    assert "tpu" in _get_capturable_supported_devices()


@pytest.mark.parametrize("name", sorted(n for n, (cls, _) in OPTIMIZERS.items() if cls in FUSED))
def test_fused_optimizer(name):
    cls, kwargs = OPTIMIZERS[name]
    assert_matches_cpu(lambda p: cls(p, fused=True, **kwargs))


@pytest.mark.parametrize("name", ["adam", "adamw_amsgrad", "sgd_nesterov_wd", "adagrad_decay_wd"])
def test_fused_optimizer_with_tensor_lr(name):
    cls, kwargs = OPTIMIZERS[name]
    kwargs = dict(kwargs, lr=torch.tensor(kwargs["lr"]))
    assert_matches_cpu(lambda p: cls(p, fused=True, **kwargs))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", sorted(n for n, (cls, _) in OPTIMIZERS.items() if cls in CAPTURABLE))
def test_capturable_optimizer(name, foreach):
    """Capturable: the step count and learning-rate arithmetic stays on the device (CPU runs the default path)."""
    cls, kwargs = OPTIMIZERS[name]
    assert_matches_cpu(lambda p: cls(p, capturable=True, foreach=foreach, **kwargs), lambda p: cls(p, **kwargs))


SCHEDULERS = {
    "step": (lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.5)),
    "cosine": (lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.001)),
    "one_cycle": (lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=6)),
}


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw"])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_lr_scheduler(scheduler, optimizer):
    cls, kwargs = OPTIMIZERS[optimizer]
    assert_matches_cpu(lambda p: cls(p, **kwargs), steps=6, scheduler_fn=SCHEDULERS[scheduler])


def test_fused_adam_with_lr_scheduler():
    """A fused step reads the learning rate at run time: changing it does not recompile."""
    cls, kwargs = OPTIMIZERS["adam"]
    assert_matches_cpu(lambda p: cls(p, fused=True, **kwargs), steps=6, scheduler_fn=SCHEDULERS["one_cycle"])


def gradients(device):
    net = model().to(device)
    inputs, targets = batches(1)[0]
    F.mse_loss(net(inputs.to(device)), targets.to(device)).backward()
    return list(net.parameters())


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_clip_grad_norm(max_norm, norm_type, foreach):
    ours, theirs = gradients("tpu"), gradients("cpu")
    total = torch.nn.utils.clip_grad_norm_(ours, max_norm, norm_type, foreach=foreach)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type, foreach=foreach)
    assert total.device.type == "tpu"
    torch.testing.assert_close(total.cpu(), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close([p.grad.cpu() for p in ours], [p.grad for p in theirs], rtol=RTOL, atol=ATOL)


def test_clip_grad_norm_nonfinite():
    ours = gradients("tpu")
    ours[0].grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)


@pytest.mark.parametrize("foreach", [False, True])
def test_clip_grad_value(foreach):
    ours, theirs = gradients("tpu"), gradients("cpu")
    torch.nn.utils.clip_grad_value_(ours, 0.05, foreach=foreach)
    torch.nn.utils.clip_grad_value_(theirs, 0.05, foreach=foreach)
    torch.testing.assert_close([p.grad.cpu() for p in ours], [p.grad for p in theirs], rtol=RTOL, atol=ATOL)
    assert max(p.grad.abs().max().item() for p in ours) == torch.tensor(0.05).item()  # some were clipped


def _foreach_sequence(tensors, others, step):
    """Foreach ops as optimizers call them, with a scalar list that changes every step (bias corrections)."""
    corrections = [1 - 0.9**step] * len(tensors)
    torch._foreach_mul_(tensors, 0.99)
    torch._foreach_add_(tensors, others, alpha=-0.1)
    torch._foreach_lerp_(tensors, others, 0.25)
    torch._foreach_addcmul_(tensors, others, others, 0.001)
    torch._foreach_div_(tensors, corrections)
    torch._foreach_addcdiv_(
        tensors, others, torch._foreach_add(torch._foreach_abs(others), 1.0), torch.tensor([0.01 * step] * len(tensors))
    )
    torch._foreach_clamp_min_(tensors, -2.0)
    return list(torch._foreach_sqrt(torch._foreach_abs(tensors)))


def test_foreach_ops_run_one_executable_per_list_and_match_cpu():
    torch.manual_seed(0)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    theirs = [torch.randn(s) for s in shapes]
    their_others = [torch.randn(s) for s in shapes]
    ours, our_others = [t.to("tpu") for t in theirs], [t.to("tpu") for t in their_others]
    reads = [entry["read_count"] for entry in torch.tpu._get_cache_stats()["per_entry_stats"]]
    for step in range(1, 4):
        if step == 3:  # by now every op and signature has compiled once: a new step's scalars recompile nothing
            before = torch.tpu._get_cache_stats()
        expected = _foreach_sequence(theirs, their_others, step)
        got = _foreach_sequence(ours, our_others, step)
        torch.testing.assert_close([t.cpu() for t in ours + got], theirs + expected, rtol=1e-6, atol=1e-7)
    after = torch.tpu._get_cache_stats()
    assert after["num_cache_reqs"] - before["num_cache_reqs"] == after["num_cache_hits"] - before["num_cache_hits"]
    names = {
        entry["name"]
        for i, entry in enumerate(after["per_entry_stats"])  # the executables this test ran
        if i >= len(reads) or entry["read_count"] > reads[i]
    }
    assert {"aten._foreach_addcdiv_.Tensor", "aten._foreach_div_.ScalarList", "aten._foreach_lerp_.Scalar"} <= names
    assert "aten.lerp_.Scalar" not in names  # not dispatched tensor by tensor


@pytest.mark.parametrize("mode", [torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE])
def test_foreach_scalar_lists_act_as_python_numbers(mode):
    """A list of floats or of ints travels as one array (one transfer), yet acts as the Python numbers it holds:
    it does not promote bf16 or int tensors; a mixed list takes each number on its own."""
    torch.manual_seed(0)
    halves = [torch.randn(4, 3, dtype=torch.bfloat16), torch.randn(5, dtype=torch.bfloat16)]
    ints = [torch.randint(-5, 5, (3,)), torch.randint(-5, 5, (2, 2))]
    with torch.tpu.set_eager_mode(mode):
        ours_halves, ours_ints = [t.to("tpu") for t in halves], [t.to("tpu") for t in ints]
        torch._foreach_mul_(ours_halves, [0.75, -1.5])
        torch._foreach_mul_(halves, [0.75, -1.5])
        torch._foreach_add_(ours_ints, [3, -7])
        torch._foreach_add_(ints, [3, -7])
        mixed = torch._foreach_mul([t.to("tpu") for t in ints], [2, 0.5])
        assert [t.dtype for t in ours_halves + ours_ints] == [t.dtype for t in halves + ints]
        torch.testing.assert_close([t.cpu() for t in ours_halves], halves, rtol=0, atol=0)  # exact in bf16
        assert all(torch.equal(o.cpu(), t) for o, t in zip(ours_ints, ints, strict=True))
        torch.testing.assert_close([t.cpu() for t in mixed], torch._foreach_mul(ints, [2, 0.5]), rtol=0, atol=0)


def _fused_lists(device, dtypes=(torch.float32, torch.bfloat16, torch.float32)):
    """Parameters of mixed shapes and dtypes, with gradients and Adam's state, as a fused step takes them."""
    torch.manual_seed(2)
    shapes = [(3, 4), (5,), (2, 1, 3)]
    lists = [[torch.randn(s).abs().to(d).to(device) for s, d in zip(shapes, dtypes, strict=True)] for _ in range(4)]
    steps = [torch.tensor(2.0, device=device) for _ in shapes]
    return lists, steps


FUSED_CALLS = {
    "adamw": lambda lists, steps, **amp: torch._fused_adamw_(
        *lists, [], steps, lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False,
        **amp,
    ),
    "adam_amsgrad": lambda lists, steps, **amp: torch._fused_adam_(
        *lists[:4], [t.clone() for t in lists[3]], steps, lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8,
        amsgrad=True, maximize=True, **amp,
    ),
    "sgd": lambda lists, steps, **amp: torch._fused_sgd_(
        *lists[:3], weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.1, nesterov=True, maximize=False,
        is_first_step=False, **amp,
    ),
    "adagrad": lambda lists, steps, **amp: torch._fused_adagrad_(
        *lists[:3], steps, lr=0.1, lr_decay=0.01, weight_decay=0.1, eps=1e-10, maximize=False, **amp
    ),
}  # fmt: skip


@pytest.mark.parametrize("amp", ["none", "grad_scale", "found_inf"])
def test_fused_step_compiled_matches_cpu(amp, name="adam_amsgrad"):
    """The fused steps are registry lowerings, so a compiled graph runs them too (torch.optim's own calls of them
    are excluded from Dynamo; a user's are not): mixed shapes and dtypes, and the grad scaler's arguments. (Only
    Adam's here: in torch 2.13 AOTAutograd's functionalization of `_fused_adamw_` and `_fused_sgd_` fails an
    internal assert before any lowering runs, and Adagrad's has no fake kernel.)"""

    def step(lists, steps, device):
        extra = {}
        if amp != "none":
            extra["grad_scale"] = torch.tensor(4.0, device=device)
        if amp == "found_inf":
            extra["found_inf"] = torch.tensor(1.0, device=device)
        FUSED_CALLS[name](lists, steps, **extra)

    torch._dynamo.reset()
    ours, our_steps = _fused_lists("tpu")
    theirs, their_steps = _fused_lists("cpu")
    torch.compile(step, backend="tpu", fullgraph=True)(ours, our_steps, "tpu")
    step(theirs, their_steps, "cpu")
    torch.testing.assert_close([[t.cpu() for t in ts] for ts in ours], theirs, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", [torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE])
@pytest.mark.parametrize(
    "call",
    [
        lambda ts: torch._foreach_mul_(ts, 1.5),
        lambda ts: torch._foreach_div_(ts, 2),
        lambda ts: torch._foreach_add_(ts, [0.5, 1.5]),
    ],
    ids=["mul_float", "div_int", "add_float_list"],
)
def test_an_inplace_foreach_op_refuses_a_result_its_tensors_cannot_take(call, mode):
    """An int list cannot take a float result: CPU raises, and so do we, writing nothing (the values used to be
    cast to the list's dtype, silently truncated)."""
    theirs = [torch.tensor([3, 4]), torch.tensor([5, -7])]
    refused = "can't be cast to the desired output type|not possible due to element size change"
    with pytest.raises(RuntimeError, match=refused):
        call(theirs)
    with torch.tpu.set_eager_mode(mode):
        ours = [t.to("tpu") for t in theirs]
        with pytest.raises(RuntimeError, match=refused):
            call(ours)
        assert all(torch.equal(o.cpu(), t) for o, t in zip(ours, theirs, strict=True))
