"""Strict eager's warm-up (`eager.warmup`): a cold op's program compiles on a background thread while the ops
after it queue; every value is CPU PyTorch's, a warm op takes the steady path, a failed compile raises where a
value is read and the op compiles again at its next call."""

import gc
import threading

import jax
import pytest
import torch

from tests.helpers import small_mlp, train_steps
from torch_tpu import metrics
from torch_tpu.eager import fused, warmup
from torch_tpu.testing.compare import assert_close, float32_tolerance

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def test_cold_ops_compile_side_by_side_and_queue_with_cpus_values(compiles):
    compiles["pair"] = True
    x = torch.randn(9, 17)
    t = x.to("tpu")
    a = torch.sinh(t) * 3
    b = a @ a.T
    c = torch.relu(b - 2).sum(0)
    assert fused._sealed  # queued behind their compiles: nothing waited for XLA
    assert compiles["most"] >= 2
    expected = torch.relu((torch.sinh(x) * 3) @ (torch.sinh(x) * 3).T - 2).sum(0)
    assert_close(c, expected)
    assert not fused._sealed  # the read ran the queue
    assert type(c.untyped_storage()._tpu_buffer._array) is not fused.Pending  # and the storages hold arrays


def test_a_warm_op_queues_nothing(compiles, monkeypatch):
    t = torch.randn(5, 19).to("tpu")
    torch.cosh(t).cpu()  # cold: compiled
    made = []
    original = warmup.Queued.__init__
    monkeypatch.setattr(warmup.Queued, "__init__", lambda self, *args: made.append(1) or original(self, *args))
    value = torch.cosh(t)
    assert not made and not fused._sealed
    assert type(value.untyped_storage()._tpu_buffer._array) is not fused.Pending


def test_in_place_writes_into_views_of_queued_values(compiles):
    x = torch.randn(6, 11)
    t = x.to("tpu")
    d = torch.cos(t)
    d[1:3] += 5
    e = d.t().contiguous()
    f = e * 2
    expected = torch.cos(x)
    expected[1:3] += 5
    assert_close(f, expected.t() * 2)
    assert_close(d, expected)


@pytest.mark.parametrize("queued", [True, False])
def test_a_cold_training_step_gives_cpus_values_and_compiles_each_program_once(compiles, monkeypatch, queued):
    """Queued or not (`TORCH_TPU_STRICT_ASYNC_COMPILE=0`), the first step's programs are the steady ones: the
    steps after it compile nothing, and the losses and parameters are CPU's."""
    monkeypatch.setattr(warmup, "ASYNC_COMPILE", queued)
    made = []
    original = warmup.Queued.__init__
    monkeypatch.setattr(warmup.Queued, "__init__", lambda self, *args: made.append(1) or original(self, *args))
    model, data = small_mlp(41 if queued else 43)
    reference = [p.detach().clone() for p in model.parameters()]
    losses, compiled = train_steps(model, data, "tpu")
    assert compiled[1] == compiled[-1], compiled  # the first step compiled every program of the loop
    assert bool(made) == queued
    cpu_model, _ = small_mlp(41 if queued else 43)
    expected, _ = train_steps(cpu_model, data, "cpu")
    rtol, atol = float32_tolerance(1e-5, 1e-6)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=rtol, atol=atol)
    for got, want, initial in zip(model.parameters(), cpu_model.parameters(), reference, strict=True):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=rtol, atol=atol)
        assert not torch.equal(want.detach(), initial)  # (the steps did update them)


def test_an_optimizer_step_cut_while_the_step_is_queued_compiles_its_steady_program(compiles):
    """On a chip a cold step's ops are still queued when its optimizer's cluster is cut, and read the parameters
    the cluster updates in place: the cluster consumes them all the same (the queue reads them first), so that its
    one program serves every later step, as a warm process's would, with CPU's values."""
    compiles["slow"] = 0.2
    model, data = small_mlp(47)
    before = metrics.compiles["fused", "compiled"]
    losses, _ = train_steps(model, data, "tpu")
    assert metrics.compiles["fused", "compiled"] - before == 1
    cpu_model, _ = small_mlp(47)
    expected, _ = train_steps(cpu_model, data, "cpu")
    rtol, atol = float32_tolerance(1e-5, 1e-6)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=rtol, atol=atol)
    for got, want in zip(model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=rtol, atol=atol)


def test_a_failed_compile_raises_where_the_queue_runs_and_the_op_compiles_again(compiles):
    """The queue runs at the next op or read once the compile is over: the failure raises there."""
    compiles["failing"] = ("aten__atan",)
    t = torch.randn(4, 23).to("tpu")
    with pytest.raises(RuntimeError, match="an XLA compile that failed"):
        (torch.atan(t) + 1).cpu()
    assert not fused._sealed
    compiles["failing"] = ()
    assert_close(torch.atan(t), torch.atan(t.cpu()))  # its next call compiles it again
    assert_close(t + 1, t.cpu() + 1)  # the process goes on


def test_debug_mode_and_unqueued_ops_run_the_queue_first(compiles):
    compiles["pair"] = True
    x = torch.randn(3, 29)
    t = x.to("tpu")
    a = torch.tanh(t) + 1
    b = torch.exp(a)
    assert fused._sealed
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        c = b * 2  # Debug mode runs each op at once: the queue first
        assert not fused._sealed
    assert_close(c, torch.exp(torch.tanh(x) + 1) * 2)


def test_a_cold_op_checking_on_the_device_queues_and_a_failed_check_raises_at_the_read(compiles):
    """An embedding checks its indices on the device: its cold program compiles on the pool too (a cold step's host
    waited for it otherwise), with CPU's values, and an index out of range raises CPU's error at the next read."""
    compiles["slow"] = 0.2
    weight = torch.randn(7, 5)
    w = weight.to("tpu")
    indices = torch.tensor([[0, 6, 3]])
    out = torch.nn.functional.embedding(indices.to("tpu"), w)
    assert fused._sealed  # queued behind its compile
    assert_close(out, torch.nn.functional.embedding(indices, weight))
    beyond = torch.nn.functional.embedding(torch.tensor([2, 7]).to("tpu"), w)  # another shape: cold again
    assert fused._sealed
    with pytest.raises(IndexError, match="index out of range"):
        beyond.cpu()


def test_two_threads_warming_up_at_once_get_their_values(compiles):
    """Ops of two threads queue behind the same cold programs (one compile each) and run once each."""
    results, errors = {}, []

    def work(seed: int) -> None:
        try:
            x = torch.randn(5, 31, generator=torch.Generator().manual_seed(seed))
            values = [torch.sin(x.to("tpu")) * 2 + seed for _ in range(20)]
            results[seed] = ([v.cpu() for v in values], torch.sin(x) * 2 + seed)
        except BaseException as error:  # raised again in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for got, want in results.values():
        for value in got:
            assert_close(value, want)
    assert compiles["count"] == 3  # sin, mul, add: one program each, for both threads


def test_a_compile_out_of_memory_is_torchs_and_holds_none_of_the_failed_values(compiles):
    """A TPU refuses a program whose buffers exceed its memory when it compiles (an execution's error on CPU):
    raised where the queue runs as torch's error; neither the error nor the Fused recorder's cluster of the read
    that ran the queue keeps the failed values (a 1 PiB tensor stayed allocated on the chip), the next runs."""
    compiles["failing"], compiles["fail_after"] = ("aten__clone",), 0.3  # queued, its output a tensor, then fails
    message = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (1.00P)"
    compiles["error"] = lambda: jax.errors.JaxRuntimeError(message)
    one = torch.ones(1, dtype=torch.uint8, device="tpu")
    gc.collect()  # (an earlier test's garbage)
    allocated, before = torch.tpu.memory_allocated(), torch.tpu.memory_stats()["num_ooms"]
    with pytest.raises(torch.cuda.OutOfMemoryError, match=r"^TPU out of memory\. Tried to allocate 1024\.00 TiB\."):
        one.expand(1 << 50).clone().flatten()[3].item()
    assert torch.tpu.memory_allocated() == allocated  # without a collection
    assert torch.tpu.memory_stats()["num_ooms"] == before + 1
    compiles["failing"] = ()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        assert (one * 3).item() == 3
    assert (one.expand(5).clone() + 1).tolist() == [2] * 5
