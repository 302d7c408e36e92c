"""The same training numerics in Strict, Debug and Fused eager, against CPU; Fused reaches a steady state."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_tpu.testing.compare import EAGER_MODES as MODES
from torch_tpu.testing.compare import float32_tolerance
from torch_tpu.testing.processes import child_env

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

RTOL, ATOL = 1e-4, 1e-5


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def make(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        data = [(torch.randn(32, 16), torch.randint(0, 8, (32,))) for _ in range(5)]
    else:
        model = TinyTransformer()
        data = [(torch.randint(0, 50, (4, 12)), torch.randint(0, 50, (4, 12))) for _ in range(4)]
    return model, data


def train(model, data, device):
    model = copy.deepcopy(model).to(device)
    if isinstance(model, TinyTransformer):
        # The key projection's bias has an exactly-zero gradient (softmax ignores a constant shift); Adam would
        # blow its rounding noise up to lr-sized steps, so the transformer trains with SGD + momentum.
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for inputs, target in data:
        optimizer.zero_grad()
        logits = model(inputs.to(device))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.to(device).reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_training_matches_cpu_in_every_mode(kind, mode):
    model, data = make(kind)
    cpu_model, cpu_losses = train(model, data, "cpu")
    with torch.tpu.set_eager_mode(MODES[mode]):
        tpu_model, tpu_losses = train(model, data, "tpu")
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=RTOL, atol=ATOL)
    for (name, ours), theirs in zip(tpu_model.state_dict().items(), cpu_model.state_dict().values(), strict=True):
        torch.testing.assert_close(ours.cpu(), theirs, rtol=RTOL, atol=ATOL, msg=name)


def test_fused_steady_state_does_not_recompile():
    model, data = make("mlp")
    model = model.to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(x.to("tpu"), y.to("tpu")) for x, y in data] * 3
    entries = []
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for inputs, target in batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), target)
            loss.backward()
            optimizer.step()
            loss.item()
            entries.append(torch.tpu._get_cache_stats()["num_inserts"])
    assert len(set(entries[4:])) == 1, entries  # AdamW's step count changes scalars, not the program


@pytest.mark.parametrize("max_ops", [16, 1024])
def test_fused_clusters_align_with_optimizer_steps(monkeypatch, max_ops):
    """Clusters are cut before and after `optimizer.step()`, so a loop replays the same clusters every step even
    when a size bound cuts them too (without the cut after the step, the remainder of one step's ops would
    open the next step's cluster and shift every later cut: a new cluster to compile each step)."""
    from torch_tpu.eager import fused

    monkeypatch.setattr(fused, "MAX_CLUSTER_OPS", max_ops)
    model, data = make("mlp")
    model = model.to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, target = data[0][0].to("tpu"), data[0][1].to("tpu")
    entries = []
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for _ in range(6):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), target)
            loss.backward()
            optimizer.step()
            assert not fused.recorder.plan  # the step's ops are running, none left to record into the next step
            values = [p.untyped_storage()._tpu_buffer._array for p in model.parameters()]
            assert not any(fused.is_pending(v) and not v.sealed for v in values)  # running, or compiling to run
            loss.item()
            entries.append(torch.tpu._get_cache_stats()["num_inserts"])
    assert len(set(entries[2:])) == 1, entries


@pytest.mark.parametrize("cut_bytes, cut_at", [(1, 0.0), (1, 0.7), (1 << 40, 0.7)])
def test_fused_cuts_a_large_cluster_in_the_backward(monkeypatch, cut_bytes, cut_at):
    """With TORCH_TPU_FUSED_BACKWARD_CUT_BYTES, a cluster that large is cut when the autograd engine starts
    recording the backward on its device thread (the device computes the forward meanwhile), or with
    TORCH_TPU_FUSED_BACKWARD_CUT_AT once the backward has recorded that many ops per op of the forward; a smaller
    one is not cut. Either way the gradients are CPU's and a loop replays the same clusters every step."""
    from torch_tpu import metrics
    from torch_tpu.eager import fused

    monkeypatch.setattr(fused, "BACKWARD_CUT_BYTES", cut_bytes)
    monkeypatch.setattr(fused, "BACKWARD_CUT_AT", cut_at)
    cuts, flush = [], fused.flush
    monkeypatch.setattr(fused, "flush", lambda *a, **k: cuts.append(len(fused.recorder.plan)) or flush(*a, **k))
    model, data = make("transformer")
    ours = copy.deepcopy(model).to("tpu")
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    runs, entries = [], []
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for inputs, target in data:
            optimizer.zero_grad()
            logits = ours(inputs.to("tpu"))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.to("tpu").reshape(-1))
            before = sum(metrics.fused_clusters.values()) + len(fused._sealed)
            forward_ops, cuts[:] = len(fused.recorder.plan), []
            loss.backward()
            runs.append(sum(metrics.fused_clusters.values()) + len(fused._sealed) - before)  # run, or compiling
            assert cuts == ([int(forward_ops * (1 + cut_at))] if cut_bytes == 1 else []), (forward_ops, cuts)
            grads = [p.grad.cpu() for p in ours.parameters()]
            optimizer.step()
            loss.item()
            entries.append(torch.tpu._get_cache_stats()["num_inserts"])
    assert runs == [1 if cut_bytes == 1 else 0] * len(data), runs  # the forward's cluster, run by the backward
    assert len(set(entries[2:])) == 1, entries
    reference, _ = train(model, data[:-1], "cpu")
    reference.zero_grad()
    inputs, target = data[-1]
    logits = reference(inputs)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1)).backward()
    for got, expected in zip(grads, (p.grad for p in reference.parameters()), strict=True):
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)  # the training test's, after 3 steps


def test_a_backward_that_makes_a_cluster_large_is_cut_where_the_recording_moves_back(monkeypatch):
    """A forward under TORCH_TPU_FUSED_BACKWARD_CUT_BYTES that its backward takes over it is not cut inside the
    backward: the cluster is cut where the recording moves back to the forward's thread, as with the cut at the
    backward's start, and the gradients are CPU's; ops recorded on other threads before change nothing."""
    import threading

    from torch_tpu.eager import fused

    monkeypatch.setattr(fused, "BACKWARD_CUT_AT", 0.7)
    cuts, flush = [], fused.flush
    monkeypatch.setattr(fused, "flush", lambda *a, **k: cuts.append(len(fused.recorder.plan)) or flush(*a, **k))
    torch.manual_seed(0)
    # ReLU, not a transcendental: CPU's tolerance holds on the chip (tanh's 1.3e3 ulp there is not what this tests)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ours = copy.deepcopy(model).to("tpu")
    x = torch.randn(5, 8)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for _ in range(2):  # a thread of the user's records, then another
            worker = threading.Thread(target=lambda: torch.ones(3, device="tpu").mul(2).cpu())
            worker.start()
            worker.join()
        loss = ours(x.to("tpu")).square().sum()
        monkeypatch.setattr(fused, "BACKWARD_CUT_BYTES", fused.recorder.nbytes + 1)  # the forward stays under it
        cuts[:] = []
        loss.backward()
        recorded = len(fused.recorder.plan)
        assert cuts == [], cuts  # nothing armed in the backward, nothing cut there
        doubled = [p.grad * 2 for p in ours.parameters()]  # the first ops back on this thread
        assert cuts[:1] == [recorded], (cuts, recorded)
        got = [g.cpu() / 2 for g in doubled]
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=RTOL, atol=ATOL)


def test_a_bad_backward_cut_setting_is_named():
    from torch_tpu.eager import fused

    assert fused._ops_per_forward_op("0.7") == 0.7 and fused._ops_per_forward_op("0") == 0
    for bad in ("x", "-0.5", "nan", "inf"):
        with pytest.raises(ValueError, match=f"TORCH_TPU_FUSED_BACKWARD_CUT_AT='{bad}'"):
            fused._ops_per_forward_op(bad)


def test_no_program_of_a_training_step_divides_64_bit_integers(monkeypatch):
    """A TPU emulates 64-bit integer division: a view read at a run-time offset that divided it took each program
    ~5 s more to compile on the chip. No program of a transformer's training step, Strict or Fused, divides in 64
    bits (shapes no other test uses, so that every program is lowered here)."""
    import re

    from torch_tpu.runtime import persistent

    programs = []
    look_up = persistent.look_up  # every compile asks the persistent tier first, here or on the pool
    monkeypatch.setattr(
        persistent, "look_up", lambda lowered, *a, **k: programs.append(lowered.as_text()) or look_up(lowered, *a, **k)
    )
    torch.manual_seed(0)
    for mode in (torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE):
        model = TinyTransformer(vocab=37, d=24).to("tpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        tokens = torch.randint(0, 37, (3, 11)).to("tpu")
        with torch.tpu.set_eager_mode(mode):
            logits = model(tokens)
            F.cross_entropy(logits.reshape(-1, 37), tokens.reshape(-1)).backward()
            optimizer.step()
            logits.sum().item()
    assert len(programs) > 20, len(programs)
    divisions = [d for text in programs for d in re.findall(r"stablehlo\.(?:divide|remainder) .*i64>", text)]
    assert divisions == [], divisions


def test_fused_reads_views_of_its_own_values_at_offsets_compiled_in(monkeypatch):
    """Heads split out of a projection the cluster computes are read at offsets compiled into its program: a
    run-time offset cost a dynamic slice and its index arithmetic per head, which XLA cannot fold. A window moved
    over such a value by a loop takes its offset at run time after `MAX_STATIC_OFFSETS` offsets, so the loop
    compiles a bounded number of clusters; every value is CPU's."""
    import re

    from torch_tpu.eager import encoding
    from torch_tpu.runtime import persistent

    texts = []
    look_up = persistent.look_up
    monkeypatch.setattr(
        persistent, "look_up", lambda lowered, *a, **k: texts.append(lowered.as_text()) or look_up(lowered, *a, **k)
    )
    torch.manual_seed(0)
    x, w = torch.randn(5, 13), torch.randn(13, 3 * 19)

    def heads(x, w):
        q, k, v = (x @ w).split(19, dim=-1)
        return (q * k.contiguous() - v.t().contiguous().t()).sum(0)

    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        got = heads(x.to("tpu"), w.to("tpu")).cpu()
    rtol, atol = float32_tolerance(1e-5, 1e-5)  # a 13-term product on the chip
    torch.testing.assert_close(got, heads(x, w), rtol=rtol, atol=atol)
    assert texts and not any("dynamic_slice" in text for text in texts), [t for t in texts if "dynamic_slice" in t]

    fused_programs = lambda: sum(e["source"] == "fused" for e in torch.tpu._get_cache_stats()["per_entry_stats"])
    before, rows = fused_programs(), encoding.MAX_STATIC_OFFSETS + 6
    data = torch.randn(rows, 7)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        on_tpu = data.to("tpu")
        got = [((on_tpu * 3)[i] + 1).cpu() for i in range(1, rows)]
    assert fused_programs() - before == encoding.MAX_STATIC_OFFSETS + 1  # one per static offset, the run-time one
    torch.testing.assert_close(torch.stack(got), data[1:] * 3 + 1, rtol=1e-6, atol=1e-6)
    assert re.search(r"dynamic_slice", texts[-1]), "the last rows were read at a run-time offset"


def test_fused_size_bound_cuts_a_loop_in_phase(monkeypatch):
    """A loop that never synchronises is cut by the size bound before the op that began the cluster, so its
    clusters repeat (6 ops per iteration against a bound of 20: cut at fixed counts, they would begin at three
    points of the loop's body in turn and compile three programs)."""
    from torch_tpu.eager import fused

    monkeypatch.setattr(fused, "MAX_CLUSTER_OPS", 20)

    def loop(z):
        outs = []
        for _ in range(40):
            z = torch.tanh(z * 0.9 + 0.1)
            outs.append((z + 0.5).abs().sum())  # z nears 0.5: z - 0.5 would cancel to a few ulp of noise
        return torch.stack(outs)

    x = torch.randn(8)
    compiled = lambda: sum(e["source"] == "fused" for e in torch.tpu._get_cache_stats()["per_entry_stats"])
    before = compiled()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        got = loop(x.to("tpu")).cpu()
    assert compiled() - before <= 2  # the loop's cluster, and the last one with the stack
    rtol, atol = float32_tolerance(1e-6, 1e-6)  # 40 tanh on the chip (1.3e3 ulp each, contracted by the loop)
    torch.testing.assert_close(got, loop(x), rtol=rtol, atol=atol)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):  # a first op that never recurs: cut at 2x
        z, expected = torch.sin(x.to("tpu")), torch.sin(x)
        for _ in range(50):
            z, expected = z + 1, expected + 1
            assert len(fused.recorder.plan) <= 40
        torch.testing.assert_close(z.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_fused_runs_a_stack_of_many_tensors_on_its_own():
    """A `stack` of hundreds of pending tensors runs as its own executable after the cluster that computes them,
    not fused into its consumer (whose XLA compile time would grow superlinearly with the operands)."""
    torch.manual_seed(0)
    xs = [torch.randn(4) for _ in range(300)]
    runs = lambda: sum(
        e["read_count"] + 1
        for e in torch.tpu._get_cache_stats()["per_entry_stats"]
        if e["name"] == "aten.stack.default"
    )
    before = runs()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        got = torch.stack([x.to("tpu") * 2 for x in xs]).sum(0).cpu()
    assert runs() > before
    torch.testing.assert_close(got, torch.stack([x * 2 for x in xs]).sum(0), rtol=1e-5, atol=1e-5)


def test_fused_clusters_follow_the_excess_precision_setting(monkeypatch):
    from torch_tpu import precision

    options = []
    original = precision.compiler_options
    monkeypatch.setattr(precision, "compiler_options", lambda: options.append(original()) or options[-1])
    x = torch.randn(64, device="tpu", dtype=torch.bfloat16)
    expected = (x.cpu() * 3 + 1).exp().sum().item()  # CPU rounds every bf16 op, as the cluster must then
    try:
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            torch.tpu.allow_excess_precision = False
            value = (x * 3 + 1).exp().sum().item()
    finally:
        torch.tpu.allow_excess_precision = True
    assert {"xla_allow_excess_precision": False} in options  # the cluster was compiled with XLA's option off
    assert value == pytest.approx(expected, rel=2**-7)


def test_fused_views_inplace_and_rng_match_strict():
    def run(mode):
        torch.manual_seed(7)
        with torch.tpu.set_eager_mode(mode):
            base = torch.arange(12.0, device="tpu").reshape(3, 4)
            view = base.t()[1:]
            view.mul_(10)
            base[0].add_(torch.rand(4, device="tpu"))
            dropped = F.dropout(torch.ones(8, 8, device="tpu"), 0.5)
            return base.cpu(), view.cpu(), dropped.cpu()

    strict = run(MODES["strict"])
    fused = run(MODES["fused"])
    for a, b in zip(strict, fused, strict=True):
        assert torch.equal(a, b)


def test_fused_materialises_on_control_flow_and_print():
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        x = torch.ones(3, device="tpu") * 2
        assert bool((x > 1).all())
        assert "2." in str(x)
        assert x.tolist() == [2.0, 2.0, 2.0]


def test_fused_dead_intermediates_are_not_kept():
    from torch_tpu.eager import fused

    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        x = torch.ones(4, device="tpu")
        for _ in range(10):
            x = x * 2 + 1  # each step's temporaries die at once
        assert len(fused.recorder.buffers) <= 2
        assert x.cpu().tolist() == [2047.0] * 4


@pytest.mark.children
def test_fused_environment_variable():
    import subprocess
    import sys

    code = "import torch; x = torch.ones(2, device='tpu') + 1; print(torch.tpu.eager_mode.name, x.tolist())"
    env = child_env(clean=True, TORCH_TPU_DEFER_AND_FUSE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "DEFER_AND_FUSE [2.0, 2.0]"


def test_mode_change_inside_compiled_region_raises(monkeypatch):
    def fn(x):
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            return x + 1

    torch._dynamo.reset()
    with pytest.raises(Exception, match="set_eager_mode|torch_tpu"):
        torch.compile(fn, backend="tpu", fullgraph=True)(torch.ones(2, device="tpu"))
    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError, match="cannot change inside a torch.compile region"):
        torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE


def _fused_donations() -> dict[str, int]:
    """The inputs each cached Fused cluster consumes (donates), by the cluster's name and position."""
    stats = torch.tpu._get_cache_stats()["per_entry_stats"]
    return {f"{i}: {e['name']}": e["donated"] for i, e in enumerate(stats) if e["source"] == "fused"}


def test_a_fused_cluster_consumes_old_values_nothing_holds_and_copies_one_the_user_holds():
    """An in-place update's old value is donated to the cluster (JAX deletes it; XLA may write the new value into
    its memory); the cached program consumes the same input every run, so when the user holds that value it gets
    a copy instead of a recompile, and the user's array stays whole."""
    import torch_tpu
    from torch_tpu.eager.cache import executables

    executables.clear()  # this test's clusters only
    x = torch.arange(64.0).to("tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for step in range(3):
            held = torch_tpu.to_jax(x) if step == 2 else None
            x.mul_(2).add_(1)
            torch.tpu.synchronize()
    assert list(_fused_donations().values()) == [1]  # one program for the three runs, consuming x's old value
    assert not held.is_deleted() and torch.equal(torch.from_numpy(np.array(held)), (torch.arange(64.0) * 4 + 3))
    torch.testing.assert_close(x.cpu(), torch.arange(64.0) * 8 + 7)
