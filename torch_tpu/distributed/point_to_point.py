"""`dist.batch_isend_irecv` on tpu tensors: the batch's transfers run in one order that every rank shares.

On tpu a send and its recv are one XLA program that both ranks run (`kernels._point_to_point`: a two-rank
`ppermute`), so each transfer blocks until its peer reaches it. NCCL runs a batch's sends and recvs concurrently,
so callers may list them in any order, and pipeline schedules do: in `Schedule1F1B`'s steady state stage 0
batches [send activation, recv gradient] while stage 1 batches [send gradient, recv activation] — run in list
order, both ranks would send first and wait for each other. Run sorted by (source rank, destination rank)
instead, every rank meets its transfers in the same global order, so the first transfer not yet done always has
both its ends at it: no deadlock for any batch whose sends and recvs pair up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def _transfer(op: dist.P2POp) -> tuple[int, int]:
    """(source, destination) global ranks of a P2POp."""
    me = dist.get_rank()
    return (me, op.peer) if op.op in (dist.isend, dist.send) else (op.peer, me)


def _ordered(batch: Callable[[list[dist.P2POp]], Any]) -> Callable[[list[dist.P2POp]], Any]:
    @functools.wraps(batch)
    def batch_isend_irecv(p2p_op_list: list[dist.P2POp]) -> Any:
        if p2p_op_list and p2p_op_list[0].tensor.device.type == "tpu":
            p2p_op_list = sorted(p2p_op_list, key=_transfer)  # stable: one pair's transfers keep their order
        return batch(p2p_op_list)

    batch_isend_irecv._tpu_ordered = True
    return batch_isend_irecv


def install() -> None:
    """Order tpu batches of point-to-point ops (once; `torch.distributed` and `distributed_c10d` alike)."""
    if getattr(c10d.batch_isend_irecv, "_tpu_ordered", False):
        return
    c10d.batch_isend_irecv = _ordered(c10d.batch_isend_irecv)
    dist.batch_isend_irecv = c10d.batch_isend_irecv
