"""Failing fast: a killed, failed or hung rank ends the whole job promptly, with errors that name the collective.

On its own the JAX runtime fails slowly and unclearly: a collective with a dead peer raises a bare "Connection
closed by peer", a rank that raises waits at JAX's shutdown barrier for peers that wait in a collective for it,
and a dead process is noticed only after the coordination service's heartbeat timeout, which aborts every process
with a C++ log line. So every process of a `tpu_dist` job keeps one TCP connection to rank 0's watchdog (a star):

- a process that ends without saying goodbye (killed, crashed) closes its connection at once: rank 0 sees the end
  of the stream and tells every rank "rank k was lost"; if rank 0 is lost, every rank sees its own stream end;
- a process whose main thread dies of an exception tells every rank "rank k failed with <error>" and exits without
  JAX's shutdown barrier, so its peers' collectives fail at once instead of at their timeout;
- each rank reports to rank 0 what collective it is in (how many it has run over each group, at most once a
  second), so a collective that times out names the ranks that never joined it;
- a clean exit (also `sys.exit(n)`, and mp.spawn's way out of an exception) says goodbye with its final counts: a
  peer waiting in a collective that the leaver never started cannot complete, and ends at once;
- `destroy_process_group()` of the job's default group says "left" with the job's number and the counts, the same
  for that job's collectives, so that a process that then ends any way (`os._exit(0)` too) is not taken for lost;
  a later `init_process_group` says "join", and the process is in the job again;
- rank 0 hosts JAX's coordination service, whose end aborts every process still connected to it: its destroy
  and its exit wait until every other rank's process has ended or started a later job (`wait_for_peers`);
- a forked child (a multiprocessing or DataLoader worker) closes its copies of the star's sockets;
- a failed collective becomes a `DistBackendError` naming the collective, its ranks and the lost or absent rank:
  the tpu kernels' (`kernels.py`), and the torch.distributed calls that go to gloo directly (`guard_api`: a
  barrier, a CPU tensor's collective), so that they count alike on every rank;
- a rank told of a peer's loss or failure says so at once and, unless its main thread has ended the process by
  then, ends it after `GRACE_S` (torch's TORCH_NCCL_ASYNC_ERROR_HANDLING: the job dies, with a readable reason).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

ADDRESS_KEY = "tpu_dist/watchdog"
# A rank told of a peer's loss gives its main thread this long to fail by itself (a collective with that peer
# fails at once), then ends the process.
GRACE_S = 3.0
# How often a rank's collective state, if it changed, is sent to rank 0.
REPORT_S = 1.0
# How long a failed collective waits for news of the peer that caused it before it raises.
DIAGNOSE_S = 2.0
# Errors of a collective's transport (XLA:CPU's gloo): worth a diagnosis even when no peer is known to be down.
_TRANSPORT = re.compile(r"gloo|connection|timed out|timeout|peer", re.IGNORECASE)

LOST = "was lost (its process ended without a clean exit: killed or crashed)"


class _Link:
    """One connection of the star: JSON lines, sent under a lock (the main and watchdog threads both send)."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            with contextlib.suppress(OSError):
                self.connection.sendall(data)

    def messages(self) -> Iterator[dict[str, Any]]:
        """Messages until the stream ends (the peer's process closed it, cleanly or not)."""
        with contextlib.suppress(OSError, ValueError), self.connection.makefile("r", encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)


def _group_key(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks))


class Watchdog:
    """This process's end of the star (rank 0 holds every link and relays news; others hold one link to it)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, job: int = 1) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.counts: dict[tuple[int, ...], int] = {}  # collectives started over each group
        self.current: tuple[str, tuple[int, ...], int] | None = None  # (name, ranks, number) in flight
        self.down: dict[int, str] = {}  # peer -> why it is gone
        self.generation = job  # the job (default group) this process is in, as process_group numbers them
        # peers that said goodbye (job None: the process exits) or left a job -> (that job, their collective counts)
        self.exited: dict[int, tuple[int | None, dict[str, int]]] = {}
        self.joined: dict[int, int] = {}  # peer -> the last job it said it joins
        self.ended: set[int] = set()  # peers whose stream has ended
        self.table: dict[int, dict[str, Any]] = {}  # rank 0: each rank's last reported state
        self.table_ready = threading.Event()
        self.links: dict[int, _Link] = {}
        self.server: socket.socket | None = None  # rank 0's listening socket
        self.pid = os.getpid()  # a forked child (a DataLoader worker) is not this process
        self.failed = False

    # -- the main thread ------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        current = self.current
        return {
            "kind": "state",
            "rank": self.rank,
            "counts": {_group_key(ranks): count for ranks, count in dict(self.counts).items()},
            "in": None if current is None else [current[0], _group_key(current[1]), current[2]],
        }

    def explain(self, name: str, ranks: tuple[int, ...], number: int, error: Exception, elapsed: float) -> Exception:
        """The error to raise for collective `name` #`number` over `ranks` that failed with `error`."""
        text = str(error)
        transport = _TRANSPORT.search(text) is not None
        timed_out = "timed out" in text.lower() or elapsed >= self.timeout_s
        peers = [rank for rank in ranks if rank != self.rank]
        deadline = time.monotonic() + DIAGNOSE_S
        while transport and not timed_out and not any(r in self.down for r in peers) and time.monotonic() < deadline:
            time.sleep(0.02)
        findings = [f"rank {rank} {self.down[rank]}" for rank in peers if rank in self.down]
        findings += self.deserted(ranks, number)
        if timed_out and not findings:
            findings = self._absent(ranks, number)
        if not findings and not transport:
            return error
        what = f"{name} (collective #{number} over ranks {list(ranks)})"
        if timed_out:
            head = f"tpu_dist: {what} timed out after {elapsed:.0f} s on rank {self.rank}"
        else:
            head = f"tpu_dist: {what} failed on rank {self.rank}"
        reason = "; ".join(findings) or "a connection to a peer failed"
        return dist.DistBackendError(f"{head}: {reason}. The transport's error: {text}")

    def _absent(self, ranks: tuple[int, ...], number: int) -> list[str]:
        """The ranks of the group that have not started collective #`number` over it, from rank 0's table."""
        if self.rank != 0:
            self.table_ready.clear()
            self.links[0].send({"kind": "ask", "rank": self.rank})
            self.table_ready.wait(DIAGNOSE_S)
        key, absent = _group_key(ranks), []
        for rank in ranks:
            if rank == self.rank:
                continue
            state = self.table.get(rank)
            if state is None:
                absent.append(f"rank {rank} has not reported its state")
                continue
            count = state["counts"].get(key, 0)
            if count < number:
                now = state["in"]
                doing = f"is in {now[0]} #{now[2]} over ranks [{now[1]}]" if now else "is not in a collective"
                started = f"it has started {count} collectives over these ranks"
                absent.append(f"rank {rank} did not join it ({started} and {doing})")
        return absent

    # -- the watchdog threads -------------------------------------------------------------------------------

    def accept(self, server: socket.socket) -> None:
        while True:
            connection, _ = server.accept()
            _thread(self.serve, _Link(connection))

    def connect(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        connection = socket.create_connection((host, int(port)), timeout=self.timeout_s)
        connection.settimeout(None)
        link = self.links[0] = _Link(connection)
        link.send({"kind": "hello", "rank": self.rank})
        _thread(self.serve, link, 0)

    def serve(self, link: _Link, peer: int | None = None) -> None:
        """Read one link; the end of its stream without a goodbye means the process behind it is gone."""
        for message in link.messages():
            kind, rank = message["kind"], message["rank"]
            if kind == "hello":
                peer, self.links[rank] = rank, link
            elif kind == "state":
                self.table[rank] = message
            elif kind in ("bye", "left"):
                self.peer_exited(rank, message["counts"], message.get("job"))
            elif kind == "join":
                self.peer_joined(rank, message["job"])
            elif kind == "down":
                self.peer_down(rank, message["why"])
            elif kind == "ask":
                link.send({"kind": "table", "rank": 0, "table": {str(r): s for r, s in dict(self.table).items()}})
            elif kind == "table":
                self.table = {int(r): state for r, state in message["table"].items()}
                self.table_ready.set()
        if peer is not None:
            self.ended.add(peer)
            if peer not in self.exited:
                self.peer_down(peer, LOST)

    def _relay(self, rank: int, message: dict) -> None:
        """Rank 0 (the hub) passes news about `rank` on to every other rank."""
        if self.rank == 0:
            for other, link in list(self.links.items()):
                if other != rank:
                    link.send(message)

    def peer_down(self, rank: int, why: str) -> None:
        """News that `rank` is gone: relayed by rank 0, said at once, and the process ended after GRACE_S."""
        if rank in self.down or rank in self.exited or rank == self.rank or self.failed:
            return
        self.down[rank] = why
        self._relay(rank, {"kind": "down", "rank": rank, "why": why})
        current = self.current
        doing = f"in {current[0]} #{current[2]} over ranks {list(current[1])}" if current else "not in a collective"
        _say(f"tpu_dist: rank {self.rank} ({doing}): rank {rank} {why}; ending this process in {GRACE_S:.0f} s")
        timer = threading.Timer(GRACE_S, self._end, (rank, why))
        timer.daemon = True
        timer.start()

    def peer_exited(self, rank: int, counts: dict[str, int], job: int | None = None) -> None:
        """A clean exit, or leaving `job` (relayed by rank 0): fatal to a collective in flight over that rank that
        it never joined."""
        self.exited[rank] = (job, counts)
        self._relay(rank, {"kind": "bye" if job is None else "left", "rank": rank, "counts": counts, "job": job})
        current = self.current
        if current is not None and (deserted := self.deserted(current[1], current[2])) and not self.failed:
            what = f"{current[0]} (collective #{current[2]} over ranks {list(current[1])})"
            _thread(self._deserted_by, rank, f"{what} can never complete on rank {self.rank}: {'; '.join(deserted)}")

    def _deserted_by(self, rank: int, why: str) -> None:
        """End this process, but after the rank that left it (told, it ends within GRACE_S): launchers (torchrun,
        mp.spawn) report the first process to fail as the job's root cause."""
        _say(f"tpu_dist: {why}; ending this process")
        self.fail(f"DistBackendError: {why}")
        deadline = time.monotonic() + GRACE_S + 1
        while rank not in self.ended and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(1)

    def peer_joined(self, rank: int, job: int) -> None:
        """`rank` starts `job` (relayed by rank 0): what it left before is no longer a goodbye."""
        self.joined[rank] = job
        left = self.exited.get(rank)
        if left is not None and left[0] is not None and left[0] < job:
            del self.exited[rank]
        self._relay(rank, {"kind": "join", "rank": rank, "job": job})

    def deserted(self, ranks: tuple[int, ...], number: int) -> list[str]:
        """The peers in `ranks` that exited, or left this job, before starting collective #`number` over them."""
        key, found = _group_key(ranks), []
        for rank, (job, counts) in list(self.exited.items()):
            if rank in ranks and job in (None, self.generation) and counts.get(key, 0) < number:
                how = "exited" if job is None else "left the job"
                found.append(f"rank {rank} {how} after {counts.get(key, 0)} collectives over these ranks")
        return found

    def _end(self, rank: int, why: str) -> None:
        _say(f"tpu_dist: rank {self.rank} ends: rank {rank} {why}")
        os._exit(1)

    def report(self) -> None:
        last = None
        while True:
            time.sleep(REPORT_S)
            state = self.state()
            if state != last and 0 in self.links:
                self.links[0].send(state)
                last = state

    # -- the end of the process -----------------------------------------------------------------------------

    def forget(self) -> None:
        """In a forked child: close its copies of the links, or a killed parent's streams would not end with it."""
        sockets = [link.connection for link in self.links.values()] + ([self.server] if self.server else [])
        for connection in sockets:
            os.close(connection.detach())  # not close(): the reader's makefile would keep the descriptor open

    def fail(self, why: str) -> None:
        """The main thread died of an exception: every rank is told (through rank 0), then the process exits."""
        message = {"kind": "down", "rank": self.rank, "why": f"failed with {why[:2000]}"}
        self.failed = True
        for link in list(self.links.values()):
            link.send(message)

    def join(self, job: int) -> None:
        """This process starts `job` (a later default group; said before its rendezvous, which may wait for rank 0
        to leave the last one)."""
        message = {"kind": "join", "rank": self.rank, "job": job}
        for link in list(self.links.values()):
            link.send(message)

    def leave(self, job: int) -> None:
        """This process leaves `job` (destroy_process_group): its peers take its end from now on as clean."""
        message = {"kind": "left", "rank": self.rank, "counts": self.state()["counts"], "job": job}
        for link in list(self.links.values()):
            link.send(message)

    def wait_for_peers(self, job: int, timeout_s: float) -> list[int]:
        """Rank 0: wait until every other rank's process has ended or started a job after `job` (JAX's service,
        which lives here, must outlive every client connected to it); the ranks still there at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            present = [
                rank
                for rank in range(1, self.world_size)
                if rank not in self.ended and rank not in self.down and self.joined.get(rank, 0) <= job
            ]
            if not present or time.monotonic() >= deadline:
                return present
            time.sleep(0.05)

    def at_exit(self) -> None:
        """Before JAX's shutdown (atexit runs handlers last-registered first): a failed process exits at once; a
        clean one says goodbye, so that its stream's end is not taken for a loss, and rank 0 keeps JAX's
        coordination service until every other rank is gone."""
        if os.getpid() != self.pid:
            return
        if self.failed:
            _say(f"tpu_dist: rank {self.rank} failed; exiting without JAX's shutdown")
            if self.rank == 0:  # JAX's coordination service lives here: its end would abort the peers unexplained
                deadline = time.monotonic() + GRACE_S + 2
                while len(self.ended) < len(self.links) and time.monotonic() < deadline:
                    time.sleep(0.05)
            os._exit(1)
        counts = self.state()["counts"]
        for link in list(self.links.values()):
            link.send({"kind": "bye", "rank": self.rank, "counts": counts})
        if self.rank == 0 and (present := self.wait_for_peers(self.generation, self.timeout_s)):
            _say(
                f"tpu_dist: rank 0 exits after waiting {self.timeout_s:.0f} s for ranks {present} to end: JAX's "
                "coordination service ends with this process, and aborts them"
            )


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        print(text, file=sys.stderr, flush=True)


def _thread(target: Callable[..., None], *args: Any) -> None:
    threading.Thread(target=target, args=args, daemon=True, name="tpu_dist-watchdog").start()


_watchdog: Watchdog | None = None


def _excepthook(previous: Callable[..., Any]) -> Callable[..., Any]:
    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        previous(kind, value, traceback)
        if _watchdog is not None:
            _watchdog.fail(f"{kind.__name__}: {value}")

    return hook


def start(store: dist.Store, rank: int, world_size: int, timeout_s: float, host: str, job: int) -> None:
    """Join this process to the star of `job` (made once per process: rank 0 listens on a free port and
    publishes it through `store`; a later job's processes keep it)."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.generation = job
    if _watchdog is not None or world_size == 1:
        return
    watchdog = Watchdog(rank, world_size, timeout_s, job)
    if rank == 0:
        server = socket.create_server((host if host != "localhost" else "127.0.0.1", 0))
        store.set(ADDRESS_KEY, f"{host}:{server.getsockname()[1]}")
        watchdog.server = server
        _thread(watchdog.accept, server)
    else:
        watchdog.connect(store.get(ADDRESS_KEY).decode())
    _thread(watchdog.report)
    atexit.register(watchdog.at_exit)
    sys.excepthook = _excepthook(sys.excepthook)
    os.register_at_fork(after_in_child=_forget_in_child)
    _watchdog = watchdog


def joining(job: int) -> None:
    """init_process_group begins `job`: tell the peers (rank 0 may be waiting for this rank to leave the last)."""
    if _watchdog is not None:
        _watchdog.join(job)


def leaving(job: int, timeout_s: float) -> list[int]:
    """destroy_process_group ends `job` here; on rank 0, wait for the peers (`Watchdog.wait_for_peers`): the
    ranks still there after `timeout_s`."""
    if _watchdog is None:
        return []
    _watchdog.leave(job)
    return _watchdog.wait_for_peers(job, timeout_s) if _watchdog.rank == 0 else []


def _forget_in_child() -> None:
    global _watchdog
    if _watchdog is not None:
        _watchdog.forget()
        _watchdog = None


class CollectiveClock:
    """Seconds spent inside tpu_dist collectives and their count (every kernel runs through `guarded`; on XLA:CPU
    a collective runs synchronously in its caller, so this is the time the caller waited for communication)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0


clock = CollectiveClock()


def guarded(name: str, ranks: tuple[int, ...], function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)`: collective `name` over global `ranks`, timed (`clock`), tracked for peers' diagnoses, its
    failure explained (a plain call, not a context manager: it is on every collective's path)."""
    start = time.monotonic()
    try:
        return _watched(name, ranks, function, *args)
    finally:
        clock.seconds += time.monotonic() - start
        clock.calls += 1


def _watched(name: str, ranks: tuple[int, ...], function: Callable[..., Any], *args: Any) -> Any:
    watchdog = _watchdog
    if watchdog is None:
        return function(*args)
    number = watchdog.counts[ranks] = watchdog.counts.get(ranks, 0) + 1
    watchdog.current = (name, ranks, number)  # before the check: a goodbye after it finds this collective
    try:
        if watchdog.exited and (deserted := watchdog.deserted(ranks, number)):
            what = f"{name} (collective #{number} over ranks {list(ranks)})"
            raise dist.DistBackendError(
                f"tpu_dist: {what} can never complete on rank {watchdog.rank}: {'; '.join(deserted)}"
            )
        start_time = time.monotonic()
        try:
            return function(*args)
        except Exception as error:
            explained = watchdog.explain(name, ranks, number, error, time.monotonic() - start_time)
            if explained is error:
                raise
            raise explained from error
    finally:
        watchdog.current = None


# The torch.distributed calls whose barrier or CPU tensors go to the group's gloo backend directly, not through the
# tpu kernels (which are guarded themselves). all_gather_into_tensor and reduce_scatter_tensor call the _single ones.
API = (
    "barrier", "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_coalesced",
    "all_gather_single", "reduce_scatter", "reduce_scatter_single", "all_to_all", "all_to_all_single", "gather",
    "scatter",
)  # fmt: skip


def _on_tpu(values: Any) -> bool:
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.device.type == "tpu":
                return True
        elif isinstance(value, (list, tuple)) and _on_tpu(value):
            return True
    return False


def _guarding(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (a torch.distributed call) guarded as one collective over its group when it waits on gloo
    itself: a barrier, or CPU tensors, called synchronously (an async call's Work is the caller's to wait on)."""
    parameters = list(inspect.signature(function).parameters)
    group_at, async_at = parameters.index("group"), parameters.index("async_op")
    name = function.__name__
    c10d = dist.distributed_c10d

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _watchdog is None or _on_tpu(args) or _on_tpu(kwargs.values()):
            return function(*args, **kwargs)
        group = args[group_at] if group_at < len(args) else kwargs.get("group")
        if (args[async_at] if async_at < len(args) else kwargs.get("async_op", False)) or c10d._rank_not_in_group(
            group
        ):
            return function(*args, **kwargs)
        ranks = tuple(dist.get_process_group_ranks(group or c10d._get_default_group()))
        return guarded(name, ranks, functools.partial(function, *args, **kwargs))

    call._tpu_dist = True
    return call


def guard_api() -> None:
    """Guard the `API` calls, in torch.distributed and its `distributed_c10d` module (once per process); a call the
    release lacks is skipped (`all_gather_single` and `reduce_scatter_single` are torch >= 2.13's names)."""
    for name in API:
        function = getattr(dist.distributed_c10d, name, None)
        if function is not None and not getattr(function, "_tpu_dist", False):
            guarding = _guarding(function)
            setattr(dist.distributed_c10d, name, guarding)
            setattr(dist, name, guarding)
