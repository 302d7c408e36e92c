"""torch.compile(backend="tpu") with bounded dynamic shapes: options num_dynamic_buckets / bucket_size.

A dynamic size n runs in the program compiled for ceil(n / bucket_size) * bucket_size; results must equal the
unpadded computation on CPU, and a graph compiles one program per bucket, at most num_dynamic_buckets.
"""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import cross_entropy_step
from torch_tpu.eager.cache import executables
from torch_tpu.testing.compare import assert_close

# tpu_device: the device part of the suite (bench/device_run.sh); each test compiles afresh
pytestmark = [pytest.mark.tpu_device, pytest.mark.usefixtures("fresh_dynamo")]

OPTIONS = {"num_dynamic_buckets": 4, "bucket_size": 8}


def _dynamic(*tensors):
    """`tpu` copies of `tensors` with dimension 0 marked dynamic."""
    moved = [t.to("tpu") for t in tensors]
    for t in moved:
        torch._dynamo.mark_dynamic(t, 0)
    return moved


def _programs(name):
    """How many executables the compiled graphs named `name:<kind>` hold, by kind."""
    counts = {}
    for entry in executables.entries.values():
        prefix, _, kind = entry.name.partition(":")
        if prefix == name:
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


@pytest.mark.parametrize("loss_name", ["cross_entropy", "mse_loss"])
def test_mlp_forward_backward_and_step_match_cpu_with_one_program_per_bucket(loss_name):
    torch.manual_seed(0)
    model = mlp()
    tpu_model = copy.deepcopy(model).to("tpu")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, tpu_model)]

    def forward(m, x, y):
        out = m(x)
        return out, getattr(F, loss_name)(out, y)

    name = f"mlp_{loss_name}"
    compiled = torch.compile(lambda x, y: forward(tpu_model, x, y), backend="tpu", options=dict(OPTIONS, name=name))
    sizes = (3, 5, 8, 11, 16, 13, 20)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*dynamic-shape buckets")
        for n in sizes:
            x = torch.randn(n, 6)
            y = torch.randint(0, 3, (n,)) if loss_name == "cross_entropy" else torch.randn(n, 3)
            for optimizer in optimizers:
                optimizer.zero_grad()
            out, loss = forward(model, x, y)
            loss.backward()
            tpu_out, tpu_loss = compiled(*_dynamic(x, y))
            tpu_loss.backward()
            assert_close(tpu_out, out.detach())
            assert_close(tpu_loss, loss.detach())
            for ours, theirs in zip(tpu_model.parameters(), model.parameters(), strict=True):
                assert_close(ours.grad, theirs.grad)
            for optimizer in optimizers:
                optimizer.step()
    buckets = len({-(-n // OPTIONS["bucket_size"]) for n in sizes})
    assert _programs(name) == {"forward": buckets, "backward": buckets}


def test_whole_adamw_training_step_compiled_with_buckets_matches_cpu():
    torch.manual_seed(0)
    model = mlp()
    data = [(torch.randn(n, 6), torch.randint(0, 3, (n,))) for n in (4, 9, 7, 16)]

    def train(device):
        m = copy.deepcopy(model).to(device)
        optimizer = torch.optim.AdamW(m.parameters(), lr=1e-2)

        step = cross_entropy_step(m, optimizer)
        if device == "tpu":
            step = torch.compile(step, backend="tpu", options=dict(OPTIONS, name="adamw"))
        losses = [step(*(_dynamic(x, y) if device == "tpu" else (x, y))).detach().cpu() for x, y in data]
        return m, torch.stack(losses)

    cpu_model, cpu_losses = train("cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*dynamic-shape buckets")
        tpu_model, tpu_losses = train("tpu")
    assert_close(tpu_losses, cpu_losses, rtol=1e-4)
    for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
        assert_close(ours.detach(), theirs.detach(), rtol=1e-4)
    assert _programs("adamw")["forward"] == 2


def test_reductions_and_contractions_over_the_padded_axis_match_cpu():
    def fn(x):
        y = 1 / x  # the zero padding becomes inf here: masks must not let it reach real values
        return (
            y.sum(0),
            y.mean(0),
            y.mean(),
            y.amax(0),
            y.max(0).values,
            y.argmin(0),
            y.softmax(0),
            y.log_softmax(0),
            y.t() @ y,
            y.logsumexp(0),
            y * x.shape[0],
            y.sum(0) / x.shape[0],
        )

    compiled = torch.compile(fn, backend="tpu", options=dict(OPTIONS, name="reduce"))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*dynamic-shape buckets")
        for n in (3, 7, 10):
            x = torch.rand(n, 4) + 0.5
            assert_close(compiled(*_dynamic(x)), fn(x))
    assert _programs("reduce") == {"inference": 2}


class Block(torch.nn.Module):
    """Pre-norm attention and MLP, the batch dimension dynamic."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        attention = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_transformer_block_forward_and_backward_match_cpu():
    torch.manual_seed(0)
    model = Block()
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu", options=dict(OPTIONS, name="block"))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*dynamic-shape buckets")
        for n in (3, 10, 6):
            x = torch.randn(n, 4, 8)
            model.zero_grad()
            tpu_model.zero_grad()
            out = model(x)
            out.square().mean().backward()
            tpu_out = compiled(*_dynamic(x))
            tpu_out.square().mean().backward()
            assert_close(tpu_out, out.detach())
            for ours, theirs in zip(tpu_model.parameters(), model.parameters(), strict=True):
                assert_close(ours.grad, theirs.grad)
    assert _programs("block") == {"forward": 2, "backward": 2}


def test_convolution_over_a_dynamic_batch_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(48, 2))
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu", options=dict(OPTIONS, name="conv"))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*dynamic-shape buckets")
        for n in (3, 10):
            x = torch.randn(n, 2, 6, 6)
            tpu_model.zero_grad()
            model.zero_grad()
            model(x).sum().backward()
            compiled(*_dynamic(x)).sum().backward()
            for ours, theirs in zip(tpu_model.parameters(), model.parameters(), strict=True):
                assert_close(ours.grad, theirs.grad)
    assert _programs("conv") == {"forward": 2, "backward": 2}


def test_input_mutation_writes_back_only_the_real_rows():
    def fn(x, total):
        x.mul_(2)
        total.copy_(x.sum(0))
        return x + 1

    compiled = torch.compile(fn, backend="tpu", options=dict(OPTIONS, name="mutate"))
    for n in (3, 6):
        x, total = torch.randn(n, 3), torch.zeros(3)
        tpu_x, tpu_total = _dynamic(x)[0], total.to("tpu")
        assert_close(compiled(tpu_x, tpu_total), fn(x, total))
        assert_close(tpu_x, x)
        assert_close(tpu_total, total)


def test_more_buckets_than_allowed_is_an_error_naming_the_option():
    compiled = torch.compile(lambda x: x.sum(0), backend="tpu", options={"num_dynamic_buckets": 2, "bucket_size": 4})
    for n in (3, 6):
        compiled(*_dynamic(torch.randn(n, 2)))
    with pytest.raises(RuntimeError, match=r"num_dynamic_buckets=2.*s\d+=12"):
        compiled(*_dynamic(torch.randn(10, 2)))


def test_op_without_masked_form_falls_back_to_exact_sizes_and_warns():
    def fn(x):
        return x.cumsum(0) * 2

    compiled = torch.compile(fn, backend="tpu", options=dict(OPTIONS, name="cumsum"))
    with pytest.warns(UserWarning, match=r"cannot use dynamic-shape buckets.*cumsum.*test_compile_buckets\.py"):
        for n in (3, 5, 6):
            x = torch.randn(n, 3)
            assert_close(compiled(*_dynamic(x)), fn(x))
    assert _programs("cumsum") == {"inference": 3}


def test_bucket_options_are_validated():
    with pytest.raises(Exception, match="num_dynamic_buckets must be a positive int up to 8"):
        torch.compile(lambda x: x + 1, backend="tpu", options={"num_dynamic_buckets": 9})(torch.ones(2, device="tpu"))
