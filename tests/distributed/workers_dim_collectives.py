"""What each rank runs in tests/distributed/test_dim_collectives.py (launched by `launch.py`): `torch.tpu.ops`'s
all_gather_dim and reduce_scatter_dim, eager (values and gradients) and compiled, each result compared with the
same computation done locally from every rank's known input (exact: float64, two ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from workers import _TIMEOUT, _equal, _input


def _raises(error: type[Exception], words: str, call) -> None:
    try:
        call()
    except error as raised:
        assert words in str(raised), raised
        return
    raise AssertionError(f"expected {error.__name__} containing {words!r}")


def dim_collectives() -> None:
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    ops = torch.tpu.ops
    xs = [_input(r, (4, 6)) for r in range(world)]
    x = xs[rank].to("tpu")
    for dim in (0, 1, -1):
        _equal(ops.all_gather_dim(x, dim), torch.cat(xs, dim), f"all_gather_dim dim={dim}")
    total = torch.stack(xs).sum(0)
    _equal(ops.reduce_scatter_dim(x, 1), total.chunk(world, 1)[rank], "reduce_scatter_dim sum dim=1")
    named = ops.reduce_scatter_dim(x, 0, "max", dist.group.WORLD.group_name)
    _equal(named, torch.stack(xs).amax(0).chunk(world, 0)[rank], "reduce_scatter_dim max dim=0, named group")

    # gradients: of a gather, the sum of every rank's gradient block; of a reduce-scatter, every rank's gradient
    ws = [_input(10 + r, (4, 6 * world)) for r in range(world)]
    leaf = x.clone().requires_grad_()
    (ops.all_gather_dim(leaf, 1) * ws[rank].to("tpu")).sum().backward()
    _equal(leaf.grad, torch.stack([w.chunk(world, 1)[rank] for w in ws]).sum(0), "all_gather_dim gradient")
    us = [_input(20 + r, (4, 6 // world)) for r in range(world)]
    leaf = x.clone().requires_grad_()
    (ops.reduce_scatter_dim(leaf, 1) * us[rank].to("tpu")).sum().backward()
    _equal(leaf.grad, torch.cat(us, 1), "reduce_scatter_dim gradient")

    step = torch.compile(
        lambda t: ops.reduce_scatter_dim(ops.all_gather_dim(t, 1) * 2, 0), backend="tpu", fullgraph=True
    )
    _equal(step(x), (torch.cat(xs, 1) * 2 * world).chunk(world, 0)[rank], "compiled gather then reduce-scatter")

    _raises(
        ValueError, f"on rank {rank} must be a multiple of the group size", lambda: ops.reduce_scatter_dim(x[:3], 0)
    )
    _raises(IndexError, "dim 2 is out of range", lambda: ops.all_gather_dim(x, 2))
    dist.destroy_process_group()
    print("dim collectives checks passed", flush=True)
