"""Collectives that differ across ranks raise on every rank, naming each side, before anything is written.

gloo and XLA trust every rank to call the same collective on the same shapes and dtypes: a float32[4] all_reduce
against an int32[4] one returns garbage, a different shape hangs or corrupts. So before each collective the ranks
of the group compare a fingerprint of the call (its number in the group and a description of what it is: kind,
dtype, shape, op, root; with TORCH_DISTRIBUTED_DEBUG=DETAIL every tensor of the call too). The comparison is one
gloo all_reduce(SUM) of two 8-byte words, (f, v): a rank's f (an integer below 2**40, exact in float64 too) agrees
with the group's when the sum is N f. Where the ranks' f differ, N = 2 fails on both; beyond, a rank whose f is the
mean of the others' would pass alone (a chance of ~2**-40 per mismatch, and it then waits in its collective until
the timeout, never writes a wrong value). v is a one-element collective's data (`Carrier`: a one-element
all_reduce(SUM/AVG) or broadcast, `host.py`), or 0; the layout is the same whatever the call (float64 or int64
words, the same bytes), so a mismatch cannot corrupt it, and v is used only once the fingerprints agree. A
one-element sum is thus one gloo round trip of two elements, the cheapest gloo has after a lone element (two
all_reduces, even overlapped, cost ~1.7x one). A one-element all_reduce of another op exchanges its value after
the check. Only when the fingerprints differ do the ranks all-gather their descriptions, to name each side.
Results are written only once every rank agrees. `TORCH_TPU_DIST_CHECK=0` (or `enabled = False`) turns the check
off (a carrier then travels alone); the bench measures its cost so.
"""

from __future__ import annotations

import hashlib
import os
import struct
import weakref
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, ReduceOp

# Bytes of each rank's description in the exchange that names the sides of a mismatch.
HEADER = 256
# Data bytes up to which a collective's result is computed here, in rank order, from every rank's data.
INLINE = 4096
_LAYOUT = struct.Struct(f"<q8s{HEADER - 16}s")  # call number, digest, description
_CPU = torch.device("cpu")
# Fingerprints are in [1, 2**40): a group of up to 8192 ranks sums them exactly in float64.
_FINGERPRINT_BITS = 40
enabled = os.environ.get("TORCH_TPU_DIST_CHECK", "1") != "0"


def _options(op: ReduceOp) -> AllreduceOptions:
    options = AllreduceOptions()
    options.reduceOp = op
    return options


_SUM = _options(ReduceOp.SUM)


class Carrier:
    """A one-element collective's 8 bytes, reduced by `options`: `words` is the check's (f, v) pair (float64 or
    int64), `value` its v (a view); with a SUM the value travels in the check's own exchange."""

    __slots__ = ("words", "pair", "value", "options", "fused")

    def __init__(self, dtype: torch.dtype, options: AllreduceOptions) -> None:
        self.words = torch.zeros(2, dtype=dtype)
        self.pair = self.words.numpy()  # NumPy's indexing costs a tenth of torch's
        self.value = self.words[1:]
        self.options = options
        self.fused = options.reduceOp == ReduceOp.SUM


class Group:
    """What the check keeps per process group: its gloo backend, global ranks, call count and buffers."""

    __slots__ = ("gloo", "ranks", "rank", "calls", "words", "pair", "__weakref__")

    def __init__(self, group: dist.ProcessGroup, gloo: dist.ProcessGroup) -> None:
        self.gloo = gloo
        self.ranks = tuple(dist.get_process_group_ranks(group))
        self.rank = group.rank()
        self.calls = 0
        self.words = torch.zeros(2, dtype=torch.int64)  # the check's pair when no value rides in it
        self.pair = self.words.numpy()


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


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=8).digest()


def _failed(state: Group, description: str, error: RuntimeError) -> RuntimeError:
    return RuntimeError(
        f"tpu_dist: {description} (call {state.calls} on the group) failed while waiting for the group's other "
        f"ranks {list(state.ranks)}: {error}"
    )


def agree(
    state: Group, description: str, carrier: Carrier | None = None, fill: Callable[[], None] | None = None
) -> None:
    """Check that every rank of the group is making the same call (`description` names it: "all_reduce
    float32[4] SUM"), exchanging `carrier` in the check (a SUM) or after it; raise on every rank if the calls
    differ. `fill`, if given, writes the carrier's value (before the exchange that carries it)."""
    state.calls += 1
    if len(state.ranks) == 1:
        if fill is not None:
            fill()
        return
    text = description.encode()
    digest = int.from_bytes(_digest(b"%d " % state.calls + text), "little")
    fingerprint = 1 + digest % ((1 << _FINGERPRINT_BITS) - 1)
    fused = carrier is not None and carrier.fused
    holder = carrier if fused else state
    holder.pair[0] = fingerprint
    if not fused:
        holder.pair[1] = 0  # a mismatched call's peer may have left its value there
    if fill is not None and fused:
        fill()
    try:
        check = state.gloo.allreduce([holder.words], _SUM)
        if fill is not None and not fused:
            fill()  # overlaps the check; if it fails, the peers wait as for any rank that fails before a collective
        check.wait()
    except RuntimeError as error:
        raise _failed(state, description, error) from error
    if holder.pair[0] != len(state.ranks) * fingerprint:
        raise RuntimeError(_mismatch(state, _descriptions(state, description, text)))
    if carrier is not None and not fused:
        carry(state, carrier, description)


def carry(state: Group, carrier: Carrier, description: str, fill: Callable[[], None] | None = None) -> None:
    """`carrier`'s value alone (the unchecked call's exchange, or a non-SUM value's after the check; `fill`
    first, if given)."""
    if fill is not None:
        fill()
    try:
        state.gloo.allreduce([carrier.value], carrier.options).wait()
    except RuntimeError as error:
        raise _failed(state, description, error) from error


def _descriptions(state: Group, description: str, text: bytes) -> np.ndarray:
    """Every rank's call (one fixed-size row per group rank), all-gathered once the fingerprints differ."""
    mine = torch.frombuffer(bytearray(_LAYOUT.pack(state.calls, _digest(text), text)), dtype=torch.uint8)
    gathered = torch.zeros(len(state.ranks) * HEADER, dtype=torch.uint8)
    try:
        state.gloo._allgather_base(gathered, mine).wait()
    except RuntimeError as error:
        raise _failed(state, description, error) from error
    return gathered.numpy().reshape(len(state.ranks), HEADER)


def gather(state: Group, description: str, data: np.ndarray) -> np.ndarray:
    """Every rank's `data` (bytes, the same size on every rank once `agree` has passed), one row per group rank."""
    if len(state.ranks) == 1:
        return data[None]
    rows = torch.empty(len(state.ranks) * data.size, dtype=torch.uint8)
    try:
        state.gloo._allgather_base(rows, torch.from_numpy(data)).wait()
    except RuntimeError as error:
        raise _failed(state, description, error) from error
    return rows.numpy().reshape(len(state.ranks), data.size)


def _mismatch(state: Group, headers: np.ndarray) -> str:
    """The error every rank raises: each distinct call and the ranks that made it."""
    sides = []
    for row in headers:
        calls, digest, text = _LAYOUT.unpack(row.tobytes())
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
