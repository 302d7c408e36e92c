"""One kit step in a child Python process, its result read back as the last JSON line it prints.

On a TPU host one process at a time can hold a chip (libtpu locks it, and JAX cannot hand it back), so a command
that runs several device steps runs each in a process of its own, one after the other, and never initialises
the backend itself: a parent that had touched the device would leave its children with no device at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def environment(**extra: str) -> dict[str, str]:
    """This process's environment for a child, with the working directory importable (workload specs)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]), **extra}


def run_json(
    module: str, arguments: list[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """`python -m module ARGUMENTS` to its end: the last JSON object it printed, else `error` saying why not."""
    return run_json_command([sys.executable, "-m", module, *arguments], env, timeout)


def run_json_command(
    command: list[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """`command` to its end: the last JSON object it printed, else `error` saying why not (and `returncode`).

    The child's stderr goes to ours on a terminal (progress bars); otherwise it is captured and its last line,
    usually the exception, becomes the `error`."""
    try:
        child = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=None if sys.stderr.isatty() else subprocess.PIPE,
            text=True,
            env=environment() if env is None else env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = (child.stderr or "").strip().splitlines()[-1:] or [f"exit status {child.returncode}"]
        return {"error": tail[0], "returncode": child.returncode}
    return json.loads(lines[-1])
