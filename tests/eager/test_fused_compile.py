"""Fused eager compiles a cut cluster on a background thread (`fused.ASYNC_COMPILE`): a cold step's clusters
compile side by side, and every value is still the one CPU PyTorch computes."""

import pytest
import torch

from tests.helpers import small_mlp, train_steps
from torch_tpu.eager import fused, programs
from torch_tpu.runtime import persistent
from torch_tpu.testing.compare import assert_close

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def test_a_cold_steps_clusters_compile_side_by_side_with_cpus_values(compiles):
    """The forward-and-backward cluster, cut before `optimizer.step()`, compiles while Python records the
    optimizer's; that one, cut after the step, compiles beside it; `loss.item()` runs both in order. Later steps
    replay them: nothing compiles again (an input that was still being computed when its program compiled is never
    donated, in later steps too, where it would have made the cache recompile)."""
    compiles["pair"] = True
    model, data = small_mlp(29)
    reference = [p.detach().clone() for p in model.parameters()]
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        losses, inserts = train_steps(model, data, "tpu")
    assert compiles["most"] >= 2 and compiles["count"] >= 2, compiles
    assert len(set(inserts[1:])) == 1, inserts
    cpu_model, _ = small_mlp(29)
    for parameter, initial in zip(cpu_model.parameters(), reference, strict=True):
        torch.testing.assert_close(parameter.detach(), initial)  # the same init
    expected, _ = train_steps(cpu_model, data, "cpu")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    for got, want in zip(model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5)


def test_without_async_compile_each_cluster_compiles_where_it_is_cut(compiles, monkeypatch):
    monkeypatch.setattr(fused, "ASYNC_COMPILE", False)
    model, data = small_mlp(31)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        train_steps(model, data[:1], "tpu")
    assert compiles["count"] >= 2 and compiles["most"] == 1 and not fused._sealed  # one at a time, each waited for


def test_a_cluster_recorded_while_another_compiles_reads_its_values(compiles):
    x = torch.randn(7, 19)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        a = torch.sin(x.to("tpu")) * 3
        fused.flush(urgent=False)  # a cut nothing waits on: the cluster is sealed, its value still to compute
        assert len(fused._sealed) == 1 and fused.is_pending(a.untyped_storage()._tpu_buffer._array)
        b = torch.cos(a) + a  # recorded with `a` as an input of the new cluster
        fused.flush(urgent=False)
        assert len(fused._sealed) == 2
        got = b.cpu()  # a read runs both, in order
        assert not fused._sealed
    torch.testing.assert_close(got, torch.cos(torch.sin(x) * 3) + torch.sin(x) * 3)
    torch.testing.assert_close(a.cpu(), torch.sin(x) * 3)


@pytest.mark.parametrize("sealed", [True, False])
def test_a_failed_compile_raises_at_the_read_and_later_work_goes_on(compiles, monkeypatch, sealed):
    """The compile's error at the read that runs the cluster (sealed: when it was cut; else there); then every
    read or use of its values names the failure — none is taken for a value of a later cluster — while new work
    runs."""

    def fails(*args, **kwargs):
        raise RuntimeError("XLA refused the program")

    monkeypatch.setattr(persistent, "_timed_compile", fails)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        a = torch.ones(4, 3, device="tpu") * 2 + 1
        if sealed:
            fused.flush(urgent=False)
        with pytest.raises(RuntimeError, match="XLA refused the program"):
            a.cpu()
        assert not fused._sealed
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match=r"shape \(4, 3\).* has no value.*XLA refused the program"):
            a.cpu()
        b = torch.arange(12.0, device="tpu").reshape(4, 3) * 2  # recorded after the failure: its own cluster
        e, f = torch.full((4, 3), 7.0), torch.full((4, 3), 0.25)
        with pytest.raises(RuntimeError, match="has no value"):
            e.to("tpu") * a  # refused where it is recorded
        d = b + f.to("tpu") * 3  # later work reads its own inputs
        torch.testing.assert_close(d.cpu(), torch.arange(12.0).reshape(4, 3) * 2 + f * 3)
        torch.testing.assert_close(b.cpu(), torch.arange(12.0).reshape(4, 3) * 2)
    torch.testing.assert_close((torch.ones(4, 3, device="tpu") * 5).cpu(), torch.full((4, 3), 5.0))


def test_an_input_that_was_still_to_compute_is_never_donated_so_nothing_recompiles(compiles):
    """The second cluster's input `a` was a sealed value when its program compiled, so that program does not
    consume it; when it runs again with `a` computed and held by nothing else (which would let it be donated),
    it keeps the program instead of compiling one that consumes `a`."""
    x = torch.randn(9, 17)
    inserts = []
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for _ in range(3):
            a = torch.sin(x.to("tpu")) * 3
            fused.flush(urgent=False)
            b = torch.cos(a) + 1
            del a  # its value is an input of b's cluster alone
            fused.flush(urgent=False)
            torch.testing.assert_close(b.cpu(), torch.cos(torch.sin(x) * 3) + 1)
            inserts.append(torch.tpu._get_cache_stats()["num_inserts"])
    assert inserts[0] == inserts[1] == inserts[2], inserts


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX's; the child only reports and exits
def test_a_forked_child_starts_with_a_pool_of_its_own(compiles):
    """A child forked while the parent's pool exists (a DataLoader worker) has none of its threads: its own
    sealed clusters would wait forever on the parent's pool."""
    import os

    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        a = torch.ones(3, 2, device="tpu") * 4 - 1
        fused.flush(urgent=False)  # sealed: compiling on the pool
        assert fused._compiler and fused._sealed
        torch.testing.assert_close(a.cpu(), torch.full((3, 2), 3.0))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest here, only an exit status
        ok = not fused._compiler and not fused._sealed
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    reported = os.read(read, 1)
    os.waitpid(pid, 0)
    assert reported == b"1"


def test_streams_and_events_count_a_sealed_cluster_as_work_not_done(compiles):
    """A sealed cluster is work issued to the `tpu` device from the user's view: a stream is not idle and an event
    recorded after it waits for it (its values are then computed)."""
    compiles["pair"] = False
    x = torch.randn(5, 23)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        a = torch.exp(x.to("tpu")) - 2
        fused.flush(urgent=False)
        assert fused._sealed
        assert not torch.tpu.current_stream().query()
        event = torch.tpu.Event()
        event.record()
        assert not event.query()
        event.synchronize()
        assert event.query() and not fused._sealed
        assert not fused.is_pending(a.untyped_storage()._tpu_buffer._array)
    assert_close(a, torch.exp(x) - 2)  # (a TPU's float32 exp errs by up to ~1e-5: the chip's tolerance)


def test_a_program_is_lowered_alike_whatever_its_inputs_were_when_it_was_made():
    """A cluster's StableHLO (and so its persistent cache key) is the same whether an input was still queued (a
    Pending value), an uncommitted or a committed array, and a number a Python float or its cached array: otherwise
    a second process, whose inputs are ready sooner, misses the first one's programs. The program computes the same
    values from each kind of input."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.runtime.deferred import Pending

    device = jax.local_devices()[0]
    data = jnp.arange(6.0, dtype=jnp.float32)
    uncommitted, committed = jnp.asarray(data), jax.device_put(data, device)
    as_float, as_array = 0.5, jax.device_put(jnp.asarray(0.5), device)
    pending = Pending(jax.ShapeDtypeStruct((6,), jnp.float32), (0, 0))
    cluster = lambda x, scale: x * scale + 1
    texts = {
        kinds: programs.trace(cluster, (), programs.lowering_avals(list(leaves))).lower().as_text()
        for kinds, leaves in {
            "committed, float": (committed, as_float),
            "uncommitted, array": (uncommitted, as_array),
            "pending, float": (pending, as_float),
        }.items()
    }
    assert len(set(texts.values())) == 1, texts
    executable = programs.trace(cluster, (), programs.lowering_avals([pending, as_float])).lower().compile()
    for leaves in ((committed, as_float), (uncommitted, as_array)):
        assert_close(torch.from_numpy(jax.device_get(executable(*leaves)).copy()), torch.arange(6.0) * 0.5 + 1)
