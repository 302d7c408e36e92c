"""Collectives that differ across ranks raise on every rank, naming each side, before anything is written.

gloo and XLA trust every rank to call the same collective on the same shapes and dtypes: a float32[4] all_reduce
against an int32[4] one returns garbage, a different shape hangs or corrupts. So before each collective the ranks
of the group all-gather one fixed-size message over the group's gloo backend: a header (the call's number in the
group, a digest and a description of what it is: kind, dtype, shape, op, root; with TORCH_DISTRIBUTED_DEBUG=DETAIL
every tensor of the call too) and, when the data is small, the data itself, so that a small collective is this
one exchange (`host.py` computes its result from the gathered data). Results are written only once every header
agrees. `TORCH_TPU_DIST_CHECK=0` (or `enabled = False`) turns the check off; the bench measures its cost so.
"""

from __future__ import annotations

import hashlib
import os
import struct
import weakref

import numpy as np
import torch
import torch.distributed as dist

HEADER = 256
# Data bytes a message carries besides its header: a collective this small costs one exchange.
INLINE = 4096
MESSAGE = HEADER + INLINE
_LAYOUT = struct.Struct(f"<q8sq{HEADER - 24}s")  # call number, digest, data bytes, description
_CPU = torch.device("cpu")
enabled = os.environ.get("TORCH_TPU_DIST_CHECK", "1") != "0"


class Group:
    """What the check keeps per process group: its gloo backend, global ranks, call count and message buffers."""

    __slots__ = ("gloo", "ranks", "rank", "calls", "mine", "gathered", "_mine", "_gathered")

    def __init__(self, group: dist.ProcessGroup, gloo: dist.ProcessGroup) -> None:
        self.gloo = gloo
        self.ranks = tuple(dist.get_process_group_ranks(group))
        self.rank = group.rank()
        self.calls = 0
        self.mine = torch.zeros(MESSAGE, dtype=torch.uint8)
        self.gathered = torch.zeros(len(self.ranks) * MESSAGE, dtype=torch.uint8)
        self._mine = self.mine.numpy()
        self._gathered = self.gathered.numpy().reshape(len(self.ranks), MESSAGE)


# Keyed weakly by the group: a destroyed group's state (its gloo backend, whose store the next group's rendezvous
# would meet) goes with it.
_groups: weakref.WeakKeyDictionary[dist.ProcessGroup, Group] = weakref.WeakKeyDictionary()


def group(process_group: dist.ProcessGroup) -> Group:
    """The check's state of `process_group` (made again when a group of the same name has a new backend)."""
    gloo = process_group._get_backend(_CPU)
    found = _groups.get(process_group)
    if found is None or found.gloo is not gloo:
        found = _groups[process_group] = Group(process_group, gloo)
    return found


def detail() -> bool:
    """Whether TORCH_DISTRIBUTED_DEBUG=DETAIL asks for full per-call checks."""
    return dist.get_debug_level() == dist.DebugLevel.DETAIL


def agree(state: Group, description: str, data: np.ndarray | None = None) -> np.ndarray | None:
    """Check that every rank of the group is making the same call; raise on every rank if not.

    `description` names the call ("all_reduce float32[4] SUM"); `data` (bytes, at most INLINE) travels with the
    header. Returns every rank's data, one row per group rank (None without data).
    """
    state.calls += 1
    if len(state.ranks) == 1:
        return None if data is None else data[None]
    size = 0 if data is None else data.size
    text = description.encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    header = _LAYOUT.pack(state.calls, digest, size, text)
    mine = state._mine
    mine[:HEADER] = np.frombuffer(header, np.uint8)
    if size:
        mine[HEADER : HEADER + size] = data
    try:
        state.gloo._allgather_base(state.gathered, state.mine).wait()
    except RuntimeError as error:
        raise RuntimeError(
            f"tpu_dist: {description} (call {state.calls} on the group) failed while waiting for the group's other "
            f"ranks {list(state.ranks)}: {error}"
        ) from error
    headers = state._gathered[:, :HEADER]
    if headers.tobytes() != header * len(state.ranks):
        raise RuntimeError(_mismatch(state, headers))
    return None if data is None else state._gathered[:, HEADER : HEADER + size]


def _mismatch(state: Group, headers: np.ndarray) -> str:
    """The error every rank raises: each distinct call and the ranks that made it."""
    sides = []
    for row in headers:
        calls, digest, _, text = _LAYOUT.unpack(row.tobytes())
        sides.append((calls, digest, text.rstrip(b"\0").decode(errors="replace")))
    kinds = {text.split(" ", 1)[0] for _, _, text in sides}
    numbered = len({calls for calls, _, _ in sides}) > 1
    same_text = len({text for _, _, text in sides}) == 1
    by_call: dict[str, list[int]] = {}
    for global_rank, (calls, digest, text) in zip(state.ranks, sides, strict=True):
        shown = text.split(" ", 1)[1] if len(kinds) == 1 and " " in text else text
        if numbered:
            shown += f" (call {calls})"
        if same_text:  # only the digests of descriptions too long for the header differ
            shown += f" (digest {digest.hex()})"
        by_call.setdefault(shown, []).append(global_rank)
    parts = [
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} {shown}" for shown, ranks in by_call.items()
    ]
    what = f"{kinds.pop()} mismatch" if len(kinds) == 1 else "collective mismatch"
    return (
        f"tpu_dist: {what}: {', '.join(parts)} (every rank of a group must make the same collective calls in the "
        "same order, with the same shapes, dtypes and ops; nothing was written)"
    )


# The gloo tag of the pair check's messages (apart from any tag a user's own gloo send/recv may use).
_PAIR_TAG = 0x7470


def agree_pair(state: Group, peer: int, kind: str, transfer: str) -> None:
    """Check that this rank's point-to-point call (`kind`: "send" or "recv") and the call its peer (group rank
    `peer`) makes now are the two ends of one `transfer` ("float32[4] from rank 0 to rank 1"); raise on both if
    not (both sending, a different shape or dtype, another peer), before anything moves. The two exchange their
    descriptions over the group's gloo backend, a send and a receive each, so the order cannot deadlock."""
    mine = f"{kind} {transfer}".encode()[:HEADER]
    sent = torch.zeros(HEADER, dtype=torch.uint8)
    sent[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    received = torch.zeros(HEADER, dtype=torch.uint8)
    try:
        works = [state.gloo.send([sent], peer, _PAIR_TAG), state.gloo.recv([received], peer, _PAIR_TAG)]
        for work in works:
            work.wait()
    except RuntimeError as error:
        raise RuntimeError(
            f"tpu_dist: {kind} {transfer} failed while waiting for rank {state.ranks[peer]} to make the other end "
            f"of it: {error}"
        ) from error
    theirs = bytes(received.numpy()).rstrip(b"\0").decode(errors="replace")
    their_kind, _, their_transfer = theirs.partition(" ")
    if their_transfer != transfer or {kind, their_kind} != {"send", "recv"}:
        raise RuntimeError(
            f"tpu_dist: send/recv mismatch: rank {state.ranks[state.rank]} makes {kind} {transfer}, its peer rank "
            f"{state.ranks[peer]} makes {theirs} (a send must meet a recv of the same dtype and shape between the "
            "same ranks; nothing was sent)"
        )
