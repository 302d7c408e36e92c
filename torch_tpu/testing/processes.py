"""The environment of a Python process a test starts.

A child must import what its parent imports (the parent's PYTHONPATH, which on the TPU machine holds torch itself)
and must run on the platform the parent chose for it: on a TPU one process at a time holds the chip, so the device
part of the suite sends its children to the XLA CPU platform (tests/conftest.py). A test that means to start from
a clean environment (to see one variable's effect alone) still keeps these.
"""

from __future__ import annotations

import os

# What a child needs from its parent's environment whatever the test sets: imports, and the platform choice.
_ALWAYS_KEPT = ("PYTHONPATH", "LD_LIBRARY_PATH", "TORCH_TPU_PLATFORM", "JAX_PLATFORMS")


def child_env(*, clean: bool = False, root: str | os.PathLike | None = None, **variables: str) -> dict[str, str]:
    """The parent's environment (with `clean`: only what `_ALWAYS_KEPT` names, and an empty PATH) plus
    `variables`; `root` (a source tree) goes first on PYTHONPATH, ahead of the parent's entries."""
    if clean:
        env = {name: os.environ[name] for name in _ALWAYS_KEPT if name in os.environ}
        env["PATH"] = ""
    else:
        env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env.update(variables)
    return env
