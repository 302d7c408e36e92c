"""Dynamo must never trace torch_tpu's own frames, nor JAX's: our eager kernels are Python under the dispatcher,
and when a compiled region runs eager ops (a graph break in a module hook, `.tolist()`), Dynamo would otherwise
try to compile the kernel's frames (and fail on the `no_dispatch` and NumPy inside them), whatever the backend.

The supported registration is `torch._dynamo.trace_rules.add(module)`, which appends to Dynamo's skip
directories. Importing Dynamo costs a second or more, so torch_tpu does not import it: `install()` registers at
once when Dynamo is already loaded, else when it is (a one-shot post-import hook, removed once it has run).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

_SKIPPED = ("torch_tpu", "jax", "jaxlib", "ml_dtypes", "opt_einsum")
_TRACE_RULES = "torch._dynamo.trace_rules"


def _add_skips(trace_rules: types.ModuleType) -> None:
    for module in _SKIPPED:
        trace_rules.add(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when Dynamo's trace rules are first imported, it wraps their loader so that the
    skips are added once the module has executed, and takes itself off `sys.meta_path`."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TRACE_RULES:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            _add_skips(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Keep Dynamo out of torch_tpu's and JAX's frames (once per process; torch_tpu's import calls it)."""
    if _TRACE_RULES in sys.modules:
        _add_skips(sys.modules[_TRACE_RULES])
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
