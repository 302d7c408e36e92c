"""`set_tpu_launch_env`: torch's launch variables from the TPU VM / Kubernetes environment of a multi-host job.

A TPU slice's hosts (or an indexed Kubernetes Job's pods) know the job's shape from their environment rather than
from launcher arguments: `TPU_WORKER_HOSTNAMES` lists every host (comma separated, host 0 first), and the host's
index is `JOB_COMPLETION_INDEX` (an indexed Job's pod) or `TPU_WORKER_ID` (a TPU VM). From those this fills what
`torchrun` and the `env://` rendezvous read, only where the user has not set them: the job's coordinator
(MASTER_ADDR, host 0; MASTER_PORT, torchrun's default), its shape (NNODES, NODE_RANK, NPROC_PER_NODE,
LOCAL_WORLD_SIZE, WORLD_SIZE, and torchrun's own PET_* spellings of those) and, where the process is itself a
rank (one process per host, or LOCAL_RANK already set by a launcher), RANK and LOCAL_RANK.
"""

from __future__ import annotations

import os
import random
import socket

DEFAULT_MASTER_PORT = 29500  # torchrun's
# What torchrun reads from PET_<name> when its flag is not given.
_TORCHRUN = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE")


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` nothing is bound to, for a server a process about to start will bind, below the kernel's
    ephemeral range: a port from that range, free when probed, can be taken before the server binds it, by any
    socket bound to port 0 and by a client's own connection (a launch's rendezvous once failed on a TCPStore
    "Connection reset by peer" at such a port)."""
    low = _ephemeral_low()
    for port in random.sample(range(max(1024, low - 16384), low), 64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a crowded range: the kernel's choice
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _integer(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"set_tpu_launch_env: {name}={value!r} is not an integer") from None


def _from_environment(name: str) -> int | None:
    value = os.environ.get(name)
    return None if value in (None, "") else _integer(name, value)


def _hostnames() -> list[str]:
    return [host.strip() for host in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if host.strip()]


def _node_rank(nnodes: int) -> int:
    for name in ("NODE_RANK", "JOB_COMPLETION_INDEX", "TPU_WORKER_ID"):
        rank = _from_environment(name)
        if rank is not None:
            if not 0 <= rank < nnodes:
                raise ValueError(f"set_tpu_launch_env: {name}={rank} is not a node rank of a job of {nnodes} nodes")
            return rank
    return 0


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> dict[str, str]:
    """Fill the unset launch variables of this host from its TPU/Kubernetes environment; returns those it set.

    `nnodes` defaults to NNODES, else the number of `TPU_WORKER_HOSTNAMES`, else 1; `nproc_per_node` (one process
    per chip) to NPROC_PER_NODE or LOCAL_WORLD_SIZE, else 1. A variable already set is never changed.
    """
    hosts = _hostnames()
    if nnodes is None:
        nnodes = _from_environment("NNODES") or len(hosts) or 1
    if nproc_per_node is None:
        nproc_per_node = _from_environment("NPROC_PER_NODE") or _from_environment("LOCAL_WORLD_SIZE") or 1
    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"set_tpu_launch_env: {name} must be a positive integer, got {value!r}")
    if hosts and len(hosts) != nnodes:
        raise ValueError(f"set_tpu_launch_env: nnodes={nnodes} but TPU_WORKER_HOSTNAMES lists {len(hosts)} hosts")
    node_rank = _node_rank(nnodes)
    values = {
        "MASTER_ADDR": hosts[0] if hosts else "127.0.0.1",
        "MASTER_PORT": str(DEFAULT_MASTER_PORT),
        "NNODES": str(nnodes),
        "NODE_RANK": str(node_rank),
        "NPROC_PER_NODE": str(nproc_per_node),
        "LOCAL_WORLD_SIZE": str(nproc_per_node),
        "WORLD_SIZE": str(nnodes * nproc_per_node),
    }
    values.update({f"PET_{name}": values[name] for name in _TORCHRUN})
    local_rank = _from_environment("LOCAL_RANK")
    if local_rank is None and nproc_per_node == 1:
        local_rank = 0
        values["LOCAL_RANK"] = "0"
    if local_rank is not None:
        if not 0 <= local_rank < nproc_per_node:
            raise ValueError(
                f"set_tpu_launch_env: LOCAL_RANK={local_rank} is not below nproc_per_node={nproc_per_node}"
            )
        values["RANK"] = str(node_rank * nproc_per_node + local_rank)
    written = {name: value for name, value in values.items() if os.environ.get(name, "") == ""}
    os.environ.update(written)
    return written
