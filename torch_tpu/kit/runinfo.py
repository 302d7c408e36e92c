"""Who ran what, where: run id, versions, platform, topology, compile-cache state, and JSON-lines logs.

Every number the kit prints or writes carries this context, so a result can be traced back to the exact stack
and machine that produced it (the guide asks for structured logs with run id, versions, dtype and topology).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import sys
import uuid
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TextIO

import torch


def new_run_id() -> str:
    """`TORCH_TPU_RUN_ID` if a parent process set it (so children log under its id), else a fresh one."""
    return (
        os.environ.get("TORCH_TPU_RUN_ID")
        or datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]
    )


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("torch_tpu", "jax", "jaxlib"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def platform_info() -> dict[str, Any]:
    """The PJRT platform behind the tpu device, its name, device count and topology."""
    from torch_tpu.runtime import platform

    count = torch.tpu.device_count()
    return {
        "platform": platform.platform(),
        "device_name": torch.tpu.get_device_name(),
        "device_count": count,
        # GKE sets TPU_TOPOLOGY on TPU nodes; elsewhere the topology is just the device count.
        "topology": os.environ.get("TPU_TOPOLOGY") or f"{count} device(s)",
    }


def cache_state(before: dict[str, Any] | None = None) -> dict[str, Any]:
    """Persistent compile-cache counters (since `before` when given) and whether this run found it warm."""
    persistent = dict(torch.tpu._get_cache_stats()["persistent"])
    if before is not None:
        for key in ("hits", "misses", "writes", "discarded"):
            persistent[key] -= before.get(key, 0)
    persistent["state"] = "warm" if persistent["hits"] > 0 else "cold"
    return persistent


class Log:
    """JSON lines: one object per event with the run's context, to a file and optionally to a stream."""

    def __init__(
        self, run_id: str, path: pathlib.Path | None = None, stream: TextIO | None = None, **context: Any
    ) -> None:
        self.run_id, self.context = run_id, context
        self.stream = stream
        self.file = open(path, "a") if path is not None else None  # closed by close()

    def event(self, event: str, level: str = "info", **fields: Any) -> None:
        record = {
            "ts": datetime.datetime.now(datetime.UTC).isoformat(),
            "level": level,
            "run_id": self.run_id,
            "event": event,
            **self.context,
            **fields,
        }
        line = json.dumps(record, default=str)
        for out in (self.file, self.stream):
            if out is not None:
                out.write(line + "\n")
                out.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
