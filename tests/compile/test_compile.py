"""torch.compile(backend="tpu"): numerics against CPU, training steps, mutations, RNG, options and errors."""

import copy
import json
import subprocess
import sys

import pytest
import torch

import torch_tpu
from tests.helpers import cross_entropy_step, needs_smoke, run_smoke

# tpu_device: the device part of the suite (bench/device_run.sh); each test compiles afresh
pytestmark = [pytest.mark.tpu_device, pytest.mark.usefixtures("fresh_dynamo")]

RTOL, ATOL = 1e-4, 1e-5  # fp32 over several optimizer steps


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def test_forward_matches_cpu():
    torch.manual_seed(0)
    model, x = mlp(), torch.randn(8, 16)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    out = compiled(x.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), model(x), rtol=1.3e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_multiply_adds_dynamo_writes_match_cpu(dtype):
    """Dynamo writes `addcmul_`/`addcdiv_` with a value and `add_` with a tensor alpha as Inductor's prims.fma."""

    def fn(x, a, b, alpha):
        y = x.clone()
        y.addcmul_(a, b, value=0.5)
        y.addcdiv_(a, b.abs() + 1, value=-2.0)
        y.add_(a, alpha=alpha)
        return y

    torch.manual_seed(0)
    args = [torch.randn(4, 8, dtype=dtype) for _ in range(3)] + [torch.tensor(0.25, dtype=dtype)]
    out = torch.compile(fn, backend="tpu")(*(t.to("tpu") for t in args))
    expected = fn(*args)
    if dtype == torch.float32:  # one rounding of each multiply-add against CPU's two: a few ulp
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-6)
        return
    # bfloat16: each side rounds the running sum and the products to bfloat16 at different points (Dynamo's
    # decomposition rounds a * b before its fma; CPU's addcmul_ does not): eight roundings at most between them,
    # each within half a bfloat16 ulp (2^-9 relative) of a value no larger than the sum of the terms' magnitudes
    x, a, b, alpha = (t.float() for t in args)
    terms = x.abs() + (0.5 * a * b).abs() + (2 * a / (b.abs() + 1)).abs() + (alpha * a).abs()
    assert ((out.cpu().float() - expected.float()).abs() <= 8 * 2**-9 * terms).all()


def test_forward_and_backward_match_cpu():
    torch.manual_seed(0)
    model, x = mlp(), torch.randn(8, 16)
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    compiled(x.to("tpu")).square().mean().backward()
    model(x).square().mean().backward()
    for ours, theirs in zip(tpu_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(ours.grad.cpu(), theirs.grad, rtol=1.3e-5, atol=1e-5)


def _train(device, compiled, model, data, make_optimizer):
    model = copy.deepcopy(model).to(device)
    optimizer = make_optimizer(model.parameters())

    step = cross_entropy_step(model, optimizer)
    if compiled:
        step = torch.compile(step, backend="tpu")
    losses = [step(x.to(device), y.to(device)).detach().cpu() for x, y in data]
    return model, torch.stack(losses)


def test_compiled_optimizer_step_breaks_only_where_torch_optim_does():
    """Fused mode's step hooks (`eager.steps`, under torch_tpu's skipped frames) are traced, not a
    graph break of their own: the only breaks are the two `torch.optim` puts around every step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(3, 4, device="tpu")).sum().backward()
    expected = [p.detach().cpu() - 0.1 * p.grad.cpu() for p in model.parameters()]
    torch._dynamo.utils.counters.clear()
    torch.compile(optimizer.step, backend="tpu")()
    reasons = list(torch._dynamo.utils.counters["graph_break"])
    assert all("Call to `torch._dynamo.graph_break()`" in reason for reason in reasons), reasons
    for got, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach().cpu(), want)  # float32: one rounding apart at most (an FMA)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_whole_training_step_compiled_matches_cpu(optimizer):
    torch.manual_seed(0)
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    }[optimizer]
    model = mlp()
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(4)]
    cpu_model, cpu_losses = _train("cpu", False, model, data, make)
    tpu_model, tpu_losses = _train("tpu", True, model, data, make)
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=RTOL, atol=ATOL)
    for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), rtol=RTOL, atol=ATOL)


def test_batchnorm_running_stats_are_updated_in_real_storages():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    for _ in range(2):
        compiled(x.to("tpu")).sum().backward()
        model(x).sum().backward()
    bn_tpu, bn_cpu = tpu_model[1], model[1]
    torch.testing.assert_close(bn_tpu.running_mean.cpu(), bn_cpu.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn_tpu.running_var.cpu(), bn_cpu.running_var, rtol=1e-5, atol=1e-6)
    assert bn_tpu.num_batches_tracked.item() == 2


def test_compiled_dropout_is_reproducible_under_manual_seed():
    model = torch.compile(torch.nn.Dropout(0.5).to("tpu"), backend="tpu")
    x = torch.ones(64, 64, device="tpu")
    torch.manual_seed(3)
    first = model(x).cpu()
    torch.manual_seed(3)
    again = model(x).cpu()
    other = model(x).cpu()
    assert torch.equal(first, again) and not torch.equal(first, other)
    kept = (first != 0).float().mean().item()
    assert 0.4 < kept < 0.6 and set(first.unique().tolist()) <= {0.0, 2.0}


@pytest.fixture
def reshape_copies(monkeypatch):
    """The calls of the storage helper that copies a tensor read in another shape than its storage's array."""
    from torch_tpu.runtime import storage

    copies = []
    reshape = storage._reshape
    monkeypatch.setattr(storage, "_reshape", lambda *a: copies.append(a) or reshape(*a))
    return copies


def test_a_reshaped_view_argument_is_reshaped_in_the_program_not_copied(reshape_copies):
    """A graph argument that is all of its storage in another shape — the compiled model's backward takes the
    logits' gradient as a `view` of the eager loss's result — arrives as the stored array and the program reshapes
    it: reading it first made a helper program copy it (1.6 ms a step on the chip for the large GPT's logits). Its
    values are CPU's; a contiguous argument of the same shape takes a program of its own."""
    compiled = torch.compile(lambda x, w: (x * w).sum(-1), backend="tpu")
    torch.manual_seed(0)
    base, w = torch.randn(4, 6), torch.randn(6)
    ours = (base.to("tpu") * 2).view(2, 2, 6)  # an op's result, read as a view of another shape
    before = torch.tpu._get_cache_stats()["num_inserts"]
    torch.testing.assert_close(compiled(ours, w.to("tpu")).cpu(), ((base * 2).view(2, 2, 6) * w).sum(-1))
    assert reshape_copies == []
    whole = (base.view(2, 2, 6) * 2).to("tpu")
    torch.testing.assert_close(compiled(whole, w.to("tpu")).cpu(), ((base * 2).view(2, 2, 6) * w).sum(-1))
    assert torch.tpu._get_cache_stats()["num_inserts"] - before == 2  # the view's program, the contiguous one's


def test_a_compiled_models_backward_takes_the_logits_gradient_without_a_copy(reshape_copies):
    """The compiled model's loss outside it, as users write it: the backward graph's gradient argument is a
    reshaped view of `log_softmax`'s backward; the gradients are CPU's."""
    torch.manual_seed(0)
    model, x, target = torch.nn.Linear(16, 10), torch.randn(2, 4, 16), torch.randint(0, 10, (2, 4))
    ours = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    for net, inputs, labels in ((ours, x.to("tpu"), target.to("tpu")), (model, x, target)):
        logits = net(inputs)
        torch.nn.functional.cross_entropy(logits.view(-1, 10), labels.view(-1)).backward()
    assert reshape_copies == []
    for got, expected in zip(ours.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=RTOL, atol=ATOL)


def test_second_call_reuses_the_executable():
    compiled = torch.compile(mlp().to("tpu"), backend="tpu", options={"name": "reuse"})
    x = torch.randn(4, 16, device="tpu")
    compiled(x)
    before = torch.tpu._get_cache_stats()
    compiled(x)
    after = torch.tpu._get_cache_stats()
    assert after["num_cache_hits"] > before["num_cache_hits"]
    assert after["num_inserts"] == before["num_inserts"]
    names = [e["name"] for e in after["per_entry_stats"]]
    assert any(n.startswith("reuse:") for n in names)


def test_debug_callback_receives_fx_and_stablehlo():
    seen = []
    options = {"debug_callback": lambda fx, hlo: seen.append((fx, hlo))}
    compiled = torch.compile(torch.nn.Linear(4, 3).to("tpu"), backend="tpu", options=options)
    compiled(torch.ones(2, 4, device="tpu"))
    assert seen and "aten.addmm" in seen[0][0] and "stablehlo.dot_general" in seen[0][1]


def test_export_stablehlo():
    text = torch_tpu.export_stablehlo(torch.nn.Linear(4, 2).to("tpu"), (torch.ones(3, 4, device="tpu"),))
    assert text.startswith("module") and "stablehlo.dot_general" in text


def test_graph_break_falls_back_to_eager_on_tpu():
    def fn(x):
        y = x * 2
        if y.sum().item() > 0:  # data-dependent control flow: a graph break
            return y + 1
        return y - 1

    compiled = torch.compile(fn, backend="tpu")
    x = torch.arange(4.0)
    out = compiled(x.to("tpu"))
    assert out.device.type == "tpu" and torch.equal(out.cpu(), fn(x))


def test_unlowered_op_names_op_and_source_line():
    def fn(x):
        return torch.special.bessel_j0(x) + 1  # the line the error must name

    with pytest.raises(Exception, match=r"special_bessel_j0.*test_compile\.py"):
        torch.compile(fn, backend="tpu")(torch.ones(3, device="tpu"))


def test_failed_compile_leaves_model_unchanged():
    model = torch.nn.Linear(3, 3).to("tpu")
    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}

    def step(x):
        with torch.no_grad():
            model.weight.add_(1.0)
        return torch.special.bessel_j0(model(x))

    with pytest.raises(Exception, match="special_bessel_j0"):
        torch.compile(step, backend="tpu")(torch.ones(2, 3, device="tpu"))
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k


def test_dynamic_true_is_refused_clearly():
    with pytest.raises(Exception, match=r"dynamic=True\) is not supported"):
        torch.compile(lambda x: x * 2, backend="tpu", dynamic=True)(torch.ones(5, device="tpu"))


def test_new_shapes_compile_new_programs_and_match_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    for batch in (3, 5, 9, 5):  # the third shape triggers Dynamo's automatic dynamic dimension
        x = torch.randn(batch, 6)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), model(x), rtol=1.3e-5, atol=1e-5)


def test_marked_dynamic_dimension_matches_cpu():
    model = torch.nn.Linear(4, 3)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    for batch in (7, 12):
        x = torch.randn(batch, 4)
        x_tpu = x.to("tpu")
        torch._dynamo.mark_dynamic(x_tpu, 0)
        torch.testing.assert_close(compiled(x_tpu).cpu(), model(x), rtol=1.3e-5, atol=1e-5)


def test_unknown_option_is_refused():
    with pytest.raises(Exception, match="unknown torch.compile options"):
        torch.compile(lambda x: x + 1, backend="tpu", options={"fast": True})(torch.ones(2, device="tpu"))


@pytest.mark.children
@needs_smoke
def test_seed_smoke_compiled():
    run_smoke("compiled")


# A forward hook whose eager ops (`.tolist()` breaks the graph) run inside the compiled region: Dynamo must not
# trace torch_tpu's kernels then, whichever backend compiles, in a process that never loaded ours (a fresh one).
HOOKED = """
import json, torch

def run(device, backend):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    seen = []

    def hook(module, args, out):
        seen.append(torch.nn.functional.gelu(out).sum().tolist())
        return out * 2 + out.sum()

    model.register_forward_hook(hook)
    x = torch.arange(8.0).reshape(2, 4).to(device)
    out = torch.compile(model, backend=backend)(x) if backend else model(x)
    return {"out": out.detach().cpu().tolist(), "seen": seen}

results = {backend: run("tpu", backend) for backend in ("eager", "aot_eager", "tpu")}
print(json.dumps(results | {"cpu": run("cpu", None)}))
"""


@pytest.mark.children
def test_dynamo_skips_torch_tpu_frames_under_every_backend():
    done = subprocess.run([sys.executable, "-c", HOOKED], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = results.pop("cpu")
    for backend, result in results.items():
        # One fp32 linear, a GELU and sums of six values: a few ulps.
        torch.testing.assert_close(result, cpu, rtol=1.3e-6, atol=1e-5, msg=lambda m, b=backend: f"{b}: {m}")


def test_a_graph_returns_an_input_it_does_not_write_as_the_callers_tensor():
    """A forward graph returns the weights it saves for its backward: the program would copy each into a new buffer
    (the large GPT's forward, 0.21 GiB a step), so the caller's tensor itself comes back; one that is its storage's
    array in another shape (a reshaped view) comes back as its value, the form a backward compiled ahead expects."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_tpu.compile.backend import CompiledGraph

    weight, base = torch.randn(4, 3), torch.randn(8)
    on_tpu, viewed = weight.to("tpu"), base.to("tpu").view(2, 4)
    gm = make_fx(lambda w, x: (torch.mm(x, w), w, x), tracing_mode="fake")(on_tpu, viewed)
    compiled = CompiledGraph(gm, "returns_inputs", None)
    assert compiled.fn.passthrough == {1: 0, 2: 1}
    product, same, value = compiled(on_tpu, viewed)
    assert same is on_tpu
    assert value is not viewed and value.shape == (2, 4)
    torch.testing.assert_close(value.cpu(), base.view(2, 4), rtol=0, atol=0)
    torch.testing.assert_close(product.cpu(), base.view(2, 4) @ weight, rtol=1.3e-6, atol=1e-5)


def test_an_eager_compile_in_a_compiled_region_gives_dynamo_no_frame(monkeypatch):
    """`loss.backward()` breaks the graph and runs eagerly with Dynamo's frame callback set: the fill of its first
    gradient (a shape no program served yet) lowers through JAX, whose standard-library calls (`inspect`,
    `logging`) Dynamo would compile; our compile paths run with the callback cleared, so only the user's frames
    reach Dynamo. The gradient matches CPU's."""
    import torch._dynamo.convert_frame as convert_frame

    compiled_frames, original = [], convert_frame._compile

    def spy(code, *args, **kwargs):
        compiled_frames.append(code.co_filename)
        return original(code, *args, **kwargs)

    monkeypatch.setattr(convert_frame, "_compile", spy)
    weight = torch.randn(7, 3, 11)

    def step(w):
        loss = (w * w).sum()
        loss.backward()
        return loss

    w = weight.to("tpu").requires_grad_()
    torch.compile(step, backend="tpu")(w)
    assert compiled_frames and set(compiled_frames) == {__file__}
    torch.testing.assert_close(w.grad.cpu(), 2 * weight, rtol=0, atol=0)  # doubling: exact


def test_integer_advanced_indexing_compiles_and_matches_cpu():
    # Hugging Face's masks index `padding_mask[batch_idx, kv_idx]`: integer indices have a static output shape.
    def gather(x, rows, cols):
        return x[rows, cols] * 2

    x, rows, cols = torch.randn(3, 5), torch.tensor([[0], [2]]), torch.tensor([1, 4, 0])
    out = torch.compile(gather, backend="tpu")(x.to("tpu"), rows.to("tpu"), cols.to("tpu"))
    assert torch.equal(out.cpu(), gather(x, rows, cols))  # a gather and a doubling: exact


def test_boolean_mask_index_in_a_graph_is_refused_clearly():
    # Dynamo's own patch (monkeypatch's undo deletes the key from Dynamo's config module)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):  # else a graph break
        with pytest.raises(Exception, match=r"aten.index.Tensor' has a data-dependent output shape.*test_compile\.py"):
            torch.compile(lambda x: x[x > 0] * 2, backend="tpu")(torch.randn(6, device="tpu"))


def test_a_compiled_graph_reports_its_programs_scratch_memory():
    """`temp_bytes` in the cache stats: the memory XLA planned for a graph's intermediates, which the buffers the
    user holds do not show. Here tanh of the first product, (8192, 8192) float32 = 256 MiB, is an operand of the
    second product, so it cannot fuse away, and it is larger than a TPU core's on-chip memory: the program needs it
    in device memory beside its inputs and output (a 256x256 one stayed on a v5e's chip: 0 bytes planned). Summing
    the last product instead lets XLA rewrite the chain without the intermediate."""
    x, w, back = torch.randn(8192, 32), torch.randn(32, 8192) / 4, torch.randn(8192, 32) / 90

    def chain(x, w, back):
        return torch.tanh(torch.tanh(x @ w) @ back)

    compiled = torch.compile(chain, backend="tpu", options={"name": "scratch"})
    result = compiled(x.to("tpu"), w.to("tpu"), back.to("tpu"))
    torch.testing.assert_close(result.cpu(), chain(x, w, back), rtol=1e-4, atol=1e-4)
    [entry] = [e for e in torch.tpu._get_cache_stats()["per_entry_stats"] if e["name"].startswith("scratch:")]
    assert entry["temp_bytes"] >= 8192 * 8192 * 4, entry
