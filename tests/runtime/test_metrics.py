"""`torch_tpu.metrics` after known workloads: compiles, cache hits per tier, transfers and their bytes, Fused
clusters, compiled graphs, the text report and reset (collectives: tests/distributed/workers_c10d.py)."""

import torch

import torch_tpu
from torch_tpu import metrics
from torch_tpu.eager.modes import EagerMode

SHAPE = (7, 13, 3)  # a shape no other test uses: its executables are compiled here


def _made(kind: str) -> int:
    """Executables of `kind` made since the reset: compiled, or loaded from the persistent tier."""
    made = metrics.summary()["compiles"].get(kind, {})
    return made.get("compiled", 0) + made.get("disk", 0)


def test_distinct_ops_compile_once_then_hit_the_in_process_cache():
    x = torch.arange(91 * 3, dtype=torch.float32).reshape(SHAPE).to("tpu")
    metrics.reset()
    ops = (torch.sin, torch.cos, torch.exp, torch.tanh)
    for op in ops:
        op(x)
    torch.tpu.synchronize()  # a compile counts once done (a cold op's may go on while later ops queue)
    found = metrics.summary()
    assert _made("eager") == len(ops) and found["compiles"]["eager"]["seconds"] > 0
    assert found["cache"]["in_process"] == {"requests": len(ops), "hits": 0}
    disk = found["cache"]["persistent"]
    assert disk["hits"] + disk["misses"] == len(ops)  # each new executable asked the persistent tier first
    for _ in range(3):
        for op in ops:
            op(x)
    found = metrics.summary()
    assert _made("eager") == len(ops), "a repeated op compiled again"
    assert found["cache"]["in_process"] == {"requests": 4 * len(ops), "hits": 3 * len(ops)}


def test_transfers_count_copies_and_exact_bytes():
    host = torch.arange(12, dtype=torch.float64)
    metrics.reset()
    on_tpu = host.to("tpu")
    back = (on_tpu[:5] * 1).cpu()
    assert on_tpu.sum().item() == 66
    found = metrics.summary()["transfers"]
    assert found["host_to_device"] == {"count": 1, "bytes": 12 * 8}
    assert found["device_to_host"] == {"count": 2, "bytes": 5 * 8 + 8}  # the slice, then the 0-d sum by item()
    assert back.tolist() == list(range(5))


def test_fused_clusters_count_runs_and_ops():
    x = torch.ones(SHAPE, device="tpu")
    metrics.reset()
    with torch.tpu.set_eager_mode(EagerMode.DEFER_AND_FUSE):
        for _ in range(3):
            ((x + 1) * 2).sin().cpu()
    found = metrics.summary()
    assert found["fused_clusters"] == {"runs": 3, "ops": 9, "mean_ops": 3.0, "max_ops": 3, "by_size": {3: 3}}
    assert _made("fused") == 1  # one cluster, compiled once, replayed twice


def test_a_compiled_graph_compiles_once():
    x = torch.ones(SHAPE, device="tpu")

    def step(t: torch.Tensor) -> torch.Tensor:
        return (t * 3).cos() - 1

    compiled = torch.compile(step, backend="tpu")
    metrics.reset()
    first = compiled(x)
    compiled(x)
    torch.testing.assert_close(first.cpu(), step(x.cpu()))
    assert _made("graph") == 1
    assert metrics.summary()["cache"]["in_process"]["hits"] >= 1


def test_report_text_reset_and_summary_dict():
    x = torch.ones(SHAPE, device="tpu")
    metrics.reset()
    (x + 41).cpu()
    text = torch_tpu.metrics.report()
    assert text.startswith("torch_tpu metrics (since the last reset)")
    lines = text.splitlines()
    assert f"  {'device to host':<24}: 1 copies, 1.1 KiB" in lines  # 7 * 13 * 3 float32
    assert f"  {'CPU fallbacks':<24}: none" in lines
    metrics.reset()
    found = metrics.summary()
    assert found["compiles"] == {} and found["transfers"]["device_to_host"] == {"count": 0, "bytes": 0}
    assert found["cache"]["in_process"] == {"requests": 0, "hits": 0}
    assert set(found) == {
        "compiles",
        "cache",
        "cpu_fallbacks",
        "decompositions",
        "transfers",
        "fused_clusters",
        "collectives",
        "graph_collectives",
        "memory",
    }
    assert f"  {'compiles':<24}: none" in metrics.report().splitlines()
