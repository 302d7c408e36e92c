"""A compiled graph that falls into independent computations runs its parts while its whole program compiles.

An optimizer step's graph (a whole-step `torch.compile`'s last graph: one chain of updates per parameter) is the
last graph of a cold first step, traced only once the backward has run, and XLA compiles it on one thread at its
own effort: on a v5e the large GPT step's AdamW graph took 17.8 s, on the first call's critical path. Where
clusters compile in two tiers (a TPU, `persistent.tiering`), such a graph is split as eager's clusters are
(`eager.parts`: up to 12 programs, compiled side by side at the quickest effort, ~1.1 s for the same AdamW as an
eager cluster), the parts run its first calls while the whole compiles on the eager compile pool, and the calls
after the whole is ready run it (`torch.tpu.finish_compiles()` waits for it). A graph that does not split, or whose
whole program is on disk, compiles as before.
"""

from __future__ import annotations

import collections
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch

from torch_tpu.compile import warm
from torch_tpu.eager import fused, parts, programs
from torch_tpu.runtime import persistent

counts = collections.Counter()
"""Graphs that ran their parts first ("split"); whole programs that failed to compile ("whole failed")."""


class Switching:
    """A program that serves a graph's calls until `final`, compiling meanwhile, is ready; then calls that one."""

    def __init__(self, call: Callable, final: persistent.Soon) -> None:
        self._serving, self._final = call, final
        self.__name__ = type(self).__name__.lower()
        _switching.add(self)

    def switch(self) -> None:
        """Call the final program from now on, waiting for its compile (`torch.tpu.finish_compiles()`). Should it
        have failed, the program that served the calls, which computes the same, stays."""
        final, self._final = self._final, None
        if final is None:
            return
        try:
            self._serving = persistent.fast_call(final()[0])
        except Exception as error:
            counts["whole failed"] += 1
            warnings.warn(f"torch_tpu: a compiled graph keeps its first program ({error})", stacklevel=2)
            return
        self.switched()

    def switched(self) -> None:
        """What a subclass drops once the final program serves the calls."""

    def __call__(self, *inputs: Any) -> Any:
        final = self._final
        if final is not None and final.done():
            self.switch()
        return self._serving(*inputs)


_switching: weakref.WeakSet[Switching] = weakref.WeakSet()


def finish_compiles() -> None:
    """Switch every graph still running a first program to its final one, waiting for the compiles."""
    for switching in list(_switching):
        switching.switch()


programs.also_finish(finish_compiles)


def compile_graph(
    gm: torch.fx.GraphModule,
    traced_sizes: dict[tuple, dict[int, int]],
    values: Sequence[Any],
    trace: Callable[[], jax.stages.Traced],
    donated: tuple[int, ...],
    name: str,
) -> tuple[Any, bool]:
    """(executable, whether it came from disk) of `gm` called with `values` (the RNG key, then the inputs; those at
    `donated` consumed), as `warm.executable` gives it, but for a graph that splits when it is not on disk: its
    parts (`name`d after it), compiled now at the quickest effort, in a `Switching` to its whole program, which
    compiles on the eager compile pool. `trace()` traces the graph: only after a miss in the graph index."""
    key, static, compiled = warm.from_index(gm, traced_sizes, values)
    if compiled is not None:
        return compiled, True
    traced = trace()
    pieces = parts.split(traced, donated, values, parts.MAX_PARTS, name)
    if not pieces:
        return warm.compile_indexed(key, static, traced_sizes, traced.lower)
    pool = fused.compiler()
    whole = warm.compile_indexed_soon(key, static, traced_sizes, traced.lower, pool)  # queued before the parts
    if whole.done():  # from the persistent tier
        executable, from_disk, _ = whole()
        return executable, from_disk
    stand_in, _, _ = parts.Compiling(pieces, pool, quick=True)()
    counts["split"] += 1
    return Switching(stand_in, whole), False
