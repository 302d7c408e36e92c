"""Work to do when a module is first imported, without importing it: Dynamo and Inductor cost seconds to import,
so torch_tpu never imports them itself, yet must register with them (trace rules, cacheable factories, lowerings
of the ops they write) once a user's code does."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `name` is first imported, it wraps its loader so that `then(module)` runs once
    the module has executed, and takes itself off `sys.meta_path`."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, then: Callable[[types.ModuleType], None]) -> None:
    """`then(module)` once `name` is imported: at once if it is, else after its first import (Dynamo and Inductor
    cost seconds to import, so torch_tpu never imports them itself)."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(
        isinstance(finder, _AfterImport) and (finder.name, finder.then) == (name, then) for finder in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterImport(name, then))
