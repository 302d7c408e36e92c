"""Device-side checks (runtime/checks.py): a failed check raises CPU's error at the next synchronisation — every
host read and `synchronize()` — from a flag the op's own executable computed; Debug mode raises at the op; the
switch (TORCH_TPU_CHECK_INDICES, torch_tpu.set_index_checks) turns them off and is part of the cache keys."""

import gc
import subprocess
import sys

import pytest
import torch
from torch.func import grad, vmap

import torch_tpu
from tests.helpers import ROOT
from torch_tpu.eager.cache import executables
from torch_tpu.runtime import checks
from torch_tpu.testing.processes import child_env

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

MESSAGE = "index 10 is out of bounds for dimension 0 with size 5"


def _bad_index() -> torch.Tensor:
    """`a[10]` on 5 elements, as an op that returns without waiting for the device."""
    return torch.arange(5.0, device="tpu")[torch.tensor([10], device="tpu")]


@pytest.fixture(autouse=True)
def _no_pending():
    """Each test starts and ends with nothing pending, and with the checks on."""
    checks.raise_pending()
    yield
    checks.set_index_checks(True)
    checks._pending.clear()


def test_raises_at_the_next_synchronisation_not_at_the_op():
    result = _bad_index()  # no error yet: the op did not wait for its value
    assert result.device.type == "tpu"
    with pytest.raises(IndexError, match=MESSAGE):
        torch.tpu.synchronize()
    torch.tpu.synchronize()  # raised once, then forgotten (the process carries on, unlike CUDA's sticky error)


@pytest.mark.parametrize(
    "read",
    ["item", "cpu", "tolist", "str", "accelerator_synchronize", "other_tensor"],
)
def test_every_host_read_raises(read):
    """Each way a value reaches the host raises a failed check pending from an earlier op."""
    bad = _bad_index()
    other = torch.ones(2, device="tpu") * 3
    reads = {
        "item": lambda: bad.sum().item(),
        "cpu": lambda: bad.cpu(),
        "tolist": lambda: bad.tolist(),
        "str": lambda: str(bad),
        "accelerator_synchronize": lambda: torch.accelerator.synchronize(),
        "other_tensor": lambda: other.cpu(),  # as with CUDA's asserts, the next sync raises whatever it reads
    }
    with pytest.raises(IndexError, match=MESSAGE):
        reads[read]()


def test_a_host_read_starts_copying_the_pending_flags_with_its_value(monkeypatch):
    """A read sends the pending checks' flags to the host before it waits for its value (one round trip, not
    two: ~0.5 ms of a small training step on a TPU), and still raises a failed check's error."""
    _bad_index()
    value = torch.ones(2, device="tpu") * 3
    real, calls = checks.prefetch_pending, []
    monkeypatch.setattr(checks, "prefetch_pending", lambda: calls.append(len(checks._pending)) or real())
    with pytest.raises(IndexError, match=MESSAGE):
        value.cpu()
    assert calls == [1]
    assert value.cpu().tolist() == [3.0, 3.0] and calls == [1, 0]


def test_a_failed_check_raised_by_print_leaves_functorch_working():
    """`str` of a tpu tensor reads it inside torch's `_str`, which turns functorch off while its frame lives: the
    raised check must not keep that frame alive (a reference cycle through `raise_pending`'s frame did until a gc
    pass, so a later `vmap(grad(...))` on CPU raised "Cannot access storage of BatchedTensorImpl")."""
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    gc.disable()  # the cycle would be freed by whichever collection happens to run first
    try:
        with pytest.raises(IndexError, match=MESSAGE):
            str(_bad_index())
        got = vmap(grad(lambda row, w: torch.tanh(row @ w).sum()), in_dims=(0, None))(x, w)
    finally:
        gc.enable()
    torch.testing.assert_close(got, (1 - torch.tanh(x @ w) ** 2) @ w.T)


def test_debug_mode_raises_at_the_op():
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        with pytest.raises(IndexError, match=MESSAGE):
            _bad_index()
        with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 1 with size 4"):
            torch.zeros(2, 4, device="tpu").gather(1, torch.tensor([[4]], device="tpu"))


def test_fused_mode_raises_at_the_cluster_flush():
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        y = (x * 2).gather(1, torch.tensor([[0, 4]], device="tpu")) + 1
        unused = x.index_select(0, torch.tensor([-1], device="tpu"))  # dead, yet checked
        del unused
        with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 1 with size 4"):
            y.cpu()
        good = (x * 2).gather(1, torch.tensor([[0, 3]], device="tpu")) + 1
        assert good.cpu().tolist() == [[1.0, 7.0]]


def test_fused_mode_dead_checked_op_still_raises():
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        kept = x + 1
        x.index_select(0, torch.tensor([5], device="tpu"))  # its result is dropped at once
        with pytest.raises(RuntimeError, match="INDICES element is out of DATA bounds, id=5 axis_dim=3"):
            kept.cpu()


def test_switch_off_and_on_again_recompiles():
    """The switch is part of the cache key: an executable traced with checks is not reused without them, nor the
    other way round."""
    _bad_index()
    with pytest.raises(IndexError, match=MESSAGE):
        torch.tpu.synchronize()
    torch_tpu.set_index_checks(False)
    assert not torch_tpu.index_checks()
    assert _bad_index().cpu().tolist() == [4.0]  # unchecked: the index is clamped
    torch_tpu.set_index_checks(True)
    _bad_index()
    with pytest.raises(IndexError, match=MESSAGE):
        torch.tpu.synchronize()


@pytest.mark.children
def test_switch_off_through_the_environment():
    script = "import torch; print(torch.arange(5.0, device='tpu')[torch.tensor([10], device='tpu')].tolist())"
    env = child_env(root=ROOT, TORCH_TPU_CHECK_INDICES="0")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "[4.0]", done.stderr[-3000:]


def test_checks_survive_the_persistent_cache():
    """An executable loaded from disk keeps its checks (they travel in its output tree)."""
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    index = torch.tensor([[3]], device="tpu")
    x.gather(1, index)
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 1 with size 3"):
        torch.tpu.synchronize()
    executables.clear()  # the next call compiles again, which loads the stored executable
    x.gather(1, index)
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 1 with size 3"):
        torch.tpu.synchronize()


def test_compiled_graph_raises_at_the_next_synchronisation():
    @torch.compile(backend="tpu")
    def lookup(table, ids):
        return torch.nn.functional.embedding(ids, table) * 2

    table = torch.randn(4, 3).to("tpu")
    assert torch.equal(lookup(table, torch.tensor([3, 0], device="tpu")).cpu(), table.cpu()[[3, 0]] * 2)
    lookup(table, torch.tensor([4, 0], device="tpu"))
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.tpu.synchronize()


def test_pending_checks_stay_bounded_without_synchronisation():
    """A loop that never synchronises keeps at most a bounded list, and still raises its first failure."""
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    index = torch.tensor([[0, 3]], device="tpu")
    x.gather(1, torch.tensor([[4]], device="tpu"))
    for _ in range(2 * checks._MAX_PENDING):
        x.gather(1, index)
    assert len(checks._pending) <= checks._MAX_PENDING + 1
    with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 1 with size 4"):
        torch.tpu.synchronize()


_WARM_SCRIPT = """
import torch
from torch_tpu.runtime import persistent as cache
lookup = torch.compile(lambda table, ids: torch.nn.functional.embedding(ids, table) * 2, backend="tpu")
table = torch.arange(12.0).reshape(4, 3).to("tpu")
assert lookup(table, torch.tensor([3, 0], device="tpu")).cpu().tolist() == [[18.0, 20.0, 22.0], [0.0, 2.0, 4.0]]
lookup(table, torch.tensor([4, 0], device="tpu"))
try:
    torch.tpu.synchronize()
except IndexError as error:
    print("raised:", error, "graph hits:", cache.stats.graph_hits)
"""


@pytest.mark.children
def test_compiled_graph_loaded_by_a_warm_process_keeps_its_checks(tmp_path):
    env = child_env(
        root=ROOT,
        TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path / "xla"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    for hits in (0, 1):  # cold, then warm: the executable comes from the graph index without tracing
        done = subprocess.run(
            [sys.executable, "-c", _WARM_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        expected = f"raised: index out of range in self graph hits: {hits}"
        assert done.returncode == 0 and done.stdout.strip() == expected, (done.stdout, done.stderr[-3000:])
