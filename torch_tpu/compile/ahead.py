"""A training graph's programs compiled ahead of their first calls.

AOTAutograd hands us the forward and backward graphs together, and the first call of each used to lower and
compile it then: the forward's XLA compile, then (after the forward ran) the backward's, one after the other on
a cold process's first step (on a v5e the small GPT step's 13.9 and 14.5 s). Each program is lowered as soon as
its graph arrives, from its placeholders' FakeTensor values, and XLA compiles it on a thread (XLA releases the
GIL): the backward's beside the forward's, and the forward's while AOTAutograd and Dynamo finish (the backward's
lowering, AOTAutograd's cache entry, Dynamo's guards). A first call takes its program when that call is the one
foreseen — the same precision and trace context, the same input shapes and dtypes — and else compiles its own as
before, the ahead program unused. An input that arrives as its storage's array in another shape
(`arguments.read`: a loss's `logits.view(-1, vocab)` gives the backward its gradient so) is reshaped for the ahead
program (`Reshaping`) until the program that takes it as it is, compiling from that first call, is ready.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torch_tpu import random as tpu_random
from torch_tpu.compile import tiers, warm
from torch_tpu.eager import fused
from torch_tpu.runtime import dtypes, persistent, platform, trace_context

COMPILE_AHEAD = os.environ.get("TORCH_TPU_COMPILE_AHEAD", "auto")
"""Whether a compiled training graph's programs (forward and backward) compile ahead of their first calls: "auto" on
a TPU, where a training graph's compile takes tens of seconds; "1" everywhere; "0" never. Ahead, a backward that
never runs (a training graph called for inference without `torch.no_grad`) still costs its compile on a thread,
which a process ending meanwhile waits for at exit (a compile cannot be stopped part-way)."""

counts = collections.Counter()
"""Programs compiled ahead ("started"), taken by their first call ("taken") or not ("unused")."""


def enabled() -> bool:
    """Whether training graphs compile ahead (`COMPILE_AHEAD`)."""
    if COMPILE_AHEAD == "auto":
        return platform.platform() == "tpu"
    return COMPILE_AHEAD != "0"


def _abstract(value: Any) -> jax.ShapeDtypeStruct | None:
    """A placeholder's FakeTensor as the array its first call will read (None: not a tensor of static shape)."""
    if not isinstance(value, torch.Tensor) or not all(type(size) is int for size in value.shape):
        return None
    index = (value.device.index or 0) if value.device.type == "tpu" else 0
    sharding = jax.sharding.SingleDeviceSharding(platform.device(index))
    return jax.ShapeDtypeStruct(tuple(value.shape), dtypes.to_jax(value.dtype), sharding=sharding)


@dataclasses.dataclass
class Ahead:
    """A program compiling for the inputs `avals` under the trace context `token` (`program`), `lowered_in` seconds
    of lowering before it; `reshaping`: whether it also serves a call whose inputs arrive as their storages' arrays
    in another shape (`Reshaping`)."""

    avals: list[jax.ShapeDtypeStruct]
    token: Any
    program: persistent.Soon
    lowered_in: float
    reshaping: bool = True

    def take(self, inputs: Sequence[Any], reshapes: tuple) -> tuple[Any, bool, float] | None:
        """(executable, whether it came from disk, seconds it took) when the call with `inputs` is the one it was
        compiled for, its inputs at `reshapes` (`arguments.read`'s) read in those shapes; else None (also where its
        compile failed: the caller compiles again and raises there)."""
        foreseen = (self.reshaping or not reshapes) and self._foreseen(inputs, dict(reshapes))
        ready = self._wait() if foreseen else None
        counts["taken" if ready is not None else "unused"] += 1
        return ready

    def _foreseen(self, inputs: Sequence[Any], shapes: dict[int, tuple[int, ...]]) -> bool:
        if trace_context.cache_token() != self.token or len(inputs) != len(self.avals):
            return False
        return all(
            isinstance(value, jax.Array)
            and shapes.get(position, value.shape) == aval.shape
            and value.dtype == aval.dtype
            and not value.weak_type
            for position, (value, aval) in enumerate(zip(inputs, self.avals, strict=True))
        )

    def _wait(self) -> tuple[Any, bool, float] | None:
        try:
            executable, from_disk, seconds = self.program()
        except Exception:  # compiled again at the call, which raises the error where it belongs
            return None
        return executable, from_disk, self.lowered_in + seconds


def start(
    gm: torch.fx.GraphModule,
    kept: Sequence[int],
    traced_sizes: dict[tuple, dict[int, int]],
    lowering: Callable[[Any, list[Any]], Callable[[], jax.stages.Lowered]],
    reshaping: bool = True,
) -> Ahead | None:
    """Lower `gm` for its placeholders' values (those at `kept`: the executable's inputs) and compile it on a
    thread of the eager compile pool (`fused.compiler()`), through the graph index and the persistent tier as a
    first call would (`warm.executable_soon`).
    `lowering(key, inputs)` makes the lowering function of a call with those (abstract) values. None where an
    input is not a tensor of static shape, or the lowering fails (the first call lowers again, and raises).
    `reshaping=False` (a forward's): a first call whose inputs arrive in another shape (a batch its caller viewed,
    so every call) compiles, or loads from the index, the program that takes them as they are instead of waiting
    for this one (a backward's incoming gradient is the exception, `Reshaping`; its program is ready by then)."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    avals = [_abstract(placeholders[index].meta.get("val")) for index in kept]
    if any(aval is None for aval in avals):
        return None
    start_time = time.perf_counter()
    values = [jax.ShapeDtypeStruct(tpu_random.KEY_SHAPE, tpu_random.KEY_DTYPE), *avals]
    token = trace_context.cache_token()
    try:
        with unset_fake_temporarily():  # AOTAutograd may call its compilers under its fake mode
            program = warm.executable_soon(gm, traced_sizes, values, lowering(values[0], values[1:]), fused.compiler())
    except Exception:  # the first call lowers the graph again and raises where it belongs
        return None
    counts["started"] += 1
    return Ahead(avals, token, program, time.perf_counter() - start_time, reshaping)


class Reshaping(tiers.Switching):
    """The program compiled ahead, called where some inputs arrive as their storage's arrays in another shape
    (`arguments.read`: the gradient of a model's output that the loss viewed, as `logits.view(-1, vocab)` makes
    it): it reshapes them (a copy a call) until `exact`, the program that takes them as they are and reshapes them
    inside (compiling meanwhile), is ready, then calls that one."""

    def __init__(self, call: Callable, reshapes: tuple, exact: persistent.Soon) -> None:
        super().__init__(call, exact)
        self._shapes = dict(reshapes)

    def switched(self) -> None:
        self._shapes = {}

    def __call__(self, key: Any, *inputs: Any) -> Any:
        final = self._final
        if final is not None and final.done():
            self.switch()
        if self._shapes:
            shapes = self._shapes
            inputs = tuple(value.reshape(shapes[i]) if i in shapes else value for i, value in enumerate(inputs))
        return self._serving(key, *inputs)
