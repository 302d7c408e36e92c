"""The `tpu_dist` c10d backend: torch's rendezvous starts JAX's multi-controller runtime, one device per process.

The creator torch calls for every group returns a real C++ gloo Backend (CPU tensors and barriers go to it, and
every DTensor/FSDP2/funcol path finds a C++ backend on the group); the `c10d::*` ops get PrivateUse1 kernels
(`distributed.kernels`) that run collectives on tpu tensors as XLA programs. The first (default) group also
initialises JAX: rank 0 publishes a coordinator address on a free port through the c10d store, every rank calls
`jax.distributed.initialize` with torch's world size and rank before JAX's backend exists, with fail-fast
settings (no preemption service, a short heartbeat, XLA:CPU collectives timing out at the group's timeout), and
joins the job's watchdog (`distributed.watchdog`: a lost, failed or hung rank ends the job with a clear error).

Leaving is orderly whatever the way out, as with NCCL or gloo: JAX's service is recoverable (a process that ends
without JAX's shutdown, `os._exit(0)` included, aborts no other), and `destroy_process_group()` of the default
group is where ranks agree to leave: rank 0, whose process hosts the service, waits there (and at its exit) until
every other rank's process has ended or begun a later group, since the service's end aborts every process still
connected to it.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
from typing import Any

import jax
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from torch_tpu.distributed import launch_env
from torch_tpu.runtime import compat

NAME = "tpu_dist"
ALIAS = "tpu"
_COORDINATOR_KEY = "tpu_dist/jax_coordinator"
# How many default groups this process has made. After `destroy_process_group()` torch names the next job's groups
# as it named the last one's, so their gloo rendezvous would read the old keys from the same store, and a rank
# would connect to a peer's previous gloo context (alive while anything, a compiled graph's guards, holds its
# group) and wait there. Every rank makes the same sequence of default groups, so the count is a common prefix.
_generation = 0
# Seconds without a heartbeat before JAX's coordination service declares a process dead (JAX's default: 100).
HEARTBEAT_TIMEOUT_S = 10
# The running default group's timeout in seconds; None when this process is in no tpu_dist job.
_job_timeout_s: float | None = None


def register() -> None:
    """Register `tpu_dist` and its alias `tpu` with torch.distributed (no JAX state is touched)."""
    for name in (NAME, ALIAS):
        if name.upper() not in dist.Backend._plugins:
            # CPU as well: one gloo backend serves the group's CPU tensors, so a CPU tensor in a tpu job works.
            dist.Backend.register_backend(name, _create_backend, devices=["cpu", "tpu"])
    c10d = dist.distributed_c10d
    if not getattr(c10d.init_process_group, "_tpu_dist", False):
        dist.init_process_group = c10d.init_process_group = _default_to_tpu_dist(c10d.init_process_group)
    if not getattr(c10d.destroy_process_group, "_tpu_dist", False):
        dist.destroy_process_group = c10d.destroy_process_group = _leave_at_destroy(c10d.destroy_process_group)


def _default_to_tpu_dist(init_process_group: Any) -> Any:
    """`init_process_group()` with no backend means `tpu_dist` on a tpu job. torch would make an "undefined"
    group: its accelerator's backend alone (no CPU tensors) under a default backend type (gloo) that a
    third-party backend is never registered as, which DDP's logger then fails to find."""

    @functools.wraps(init_process_group)
    def init(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        from torch_tpu.distributed import watchdog

        watchdog.joining(_generation + 1)  # before the rendezvous: rank 0 may wait for it to leave the last job
        device_id = kwargs.get("device_id")
        on_tpu = device_id is None or torch.device(device_id).type == "tpu"
        if backend is None and not args and on_tpu and torch._C._get_accelerator().type == "tpu":
            backend = NAME
        return init_process_group(backend, *args, **kwargs)

    init._tpu_dist = True
    return init


def _leave_at_destroy(destroy_process_group: Any) -> Any:
    """`destroy_process_group()` of a tpu_dist job's default group: the job is left (`_leave`) once torch has
    destroyed its groups."""

    @functools.wraps(destroy_process_group)
    def destroy(group: dist.ProcessGroup | None = None) -> None:
        ending = _job_timeout_s is not None and (group is None or group is dist.GroupMember.WORLD)
        destroy_process_group(group)
        if ending:
            _leave()

    destroy._tpu_dist = True
    return destroy


def _leave() -> None:
    """Tell the peers this rank left the job; on rank 0, keep JAX's service until they are gone too."""
    from torch_tpu.distributed import watchdog

    global _job_timeout_s
    timeout_s, _job_timeout_s = _job_timeout_s, None
    present = watchdog.leaving(_generation, timeout_s)
    if present:
        raise dist.DistBackendError(
            f"tpu_dist: rank 0 waited {timeout_s:.0f} s in destroy_process_group for ranks {present} to end or begin "
            "a new group; JAX's coordination service lives in rank 0's process, and its end aborts theirs"
        )


def generation() -> int:
    """How many default groups (jobs) this process has made: the running job's number while one runs."""
    return _generation


def _backend_initialized() -> bool:
    return compat.jax_backends_initialized()


def _host() -> str:
    return os.environ.get("MASTER_ADDR") or socket.gethostname()


def _coordinator(store: dist.Store, rank: int) -> str:
    """Rank 0 picks the address (MASTER_PORT is torch's store; JAX needs a port of its own) and publishes it."""
    if rank == 0:
        host = _host()
        address = f"{host}:{launch_env.free_port(host if host != 'localhost' else '127.0.0.1')}"
        store.set(_COORDINATOR_KEY, address)
        return address
    return store.get(_COORDINATOR_KEY).decode()


def _set_collective_timeout(seconds: int) -> None:
    """XLA:CPU waits for a peer's collective `--xla_cpu_collective_timeout_seconds` (read at backend start)."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "xla_cpu_collective_timeout" not in flag]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_cpu_collective_timeout_seconds={seconds}"])


def initialize_jax(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """`jax.distributed.initialize` from torch's rendezvous, once per process, before JAX's backend starts."""
    if compat.jax_distributed_client() is not None:
        if jax.process_count() != world_size or jax.process_index() != rank:
            raise RuntimeError(
                f"tpu_dist: JAX is already initialised as process {jax.process_index()} of {jax.process_count()}, "
                f"but torch.distributed has rank {rank} of {world_size}"
            )
        return
    if _backend_initialized():
        raise RuntimeError(
            "tpu_dist: init_process_group must run before the first tpu tensor or JAX computation in the "
            "process (JAX's multi-process runtime cannot start once its backend exists)"
        )
    address = _coordinator(store, rank)
    seconds = max(1, int(timeout.total_seconds()))
    _set_collective_timeout(seconds)
    # Under torchrun, JAX's preemption service would swallow SIGTERM (a 30 s teardown instead of 1 s).
    jax.config.update("jax_enable_preemption_service", False)
    # A process that ends without JAX's shutdown must not abort the others (its peers' watchdogs judge whether its
    # end was a loss); nor does a recoverable process wait at exit in JAX's shutdown barrier for the others.
    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(
        address,
        num_processes=world_size,
        process_id=rank,
        initialization_timeout=seconds,
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
    )


def _create_backend(
    store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta
) -> torch._C._distributed_c10d.Backend:
    """torch's creator for a group: JAX started (the default group), tpu kernels installed, a gloo backend."""
    from torch_tpu.distributed import kernels, watchdog

    global _generation, _job_timeout_s
    if not dist.is_initialized():  # the default group is being made: rank and world size are global
        # torch.distributed.nn's functions bind `group.WORLD` as a default argument when first imported. Imported
        # while a group exists (Dynamo imports them, and the first meta kernel of a tpu op imports Dynamo), they
        # would hold that group, its store and the store's server for good: the next group on the same MASTER_PORT
        # would meet the old one's keys. Imported now, before the default group exists, they bind None.
        import torch.distributed.nn.functional  # noqa: F401

        _generation += 1
        initialize_jax(store, rank, world_size, timeout)
        watchdog.start(store, rank, world_size, timeout.total_seconds(), _host(), _generation)
        _job_timeout_s = timeout.total_seconds()
    kernels.install()
    return ProcessGroupGloo(dist.PrefixStore(f"tpu_dist/job{_generation}", store), rank, world_size, timeout)
