"""What PyTorch's compile stack must know about torch_tpu whatever the backend, registered at torch_tpu's import.

1. Dynamo must never trace torch_tpu's own frames, nor JAX's: our eager kernels are Python under the dispatcher,
   and when a compiled region runs eager ops (a graph break in a module hook, `.tolist()`), Dynamo would otherwise
   try to compile the kernel's frames (and fail on the `no_dispatch` and NumPy inside them). The supported
   registration is `torch._dynamo.trace_rules.add(module)`, which appends to Dynamo's skip directories.
2. The factory functions `runtime.pinned` wraps (`torch.arange`, `torch.full_like`, ...: a Python function in
   place of the C builtin, for `pin_memory=True`) are cache-safe: the wrapper's behaviour is its arguments'. In a
   Dynamo graph PyTorch's AOTAutograd cache sees a Python function in `torch` it cannot vouch for and bypasses the
   graph ("Unsupported call_function target"), so every model with a `torch.arange` (positions) or an AdamW step
   (Dynamo's `_foreach_lerp_` uses `torch.full_like`) redid AOTAutograd in every process, under every backend.
   `torch._inductor.config.unsafe_marked_cacheable_functions`, PyTorch's registration of functions known to be
   cacheable, names them.

3. Functions of ours that Dynamo meets in user code and must trace rather than break the graph on (`_TRACED`):
   the optimizer step hooks (`eager.steps`, run by every `optimizer.step()`) do nothing under compilation, and a
   skipped frame would split every compiled optimizer step in two graphs.

Importing Dynamo or Inductor's config costs seconds, so torch_tpu imports neither: `install()` registers at once
with a module already loaded, else when it is (a one-shot post-import hook, removed once it has run).
"""

from __future__ import annotations

import hashlib
import pathlib
import types

import torch

from torch_tpu.runtime.late_imports import after_import

_SKIPPED = ("torch_tpu", "jax", "jaxlib", "ml_dtypes", "opt_einsum")
_TRACED = ("torch_tpu.eager.steps._step_begins", "torch_tpu.eager.steps._step_ends")
_TRACE_RULES = "torch._dynamo.trace_rules"
_INDUCTOR_CONFIG = "torch._inductor.config"


def _add_skips(trace_rules: types.ModuleType) -> None:
    for module in _SKIPPED:
        trace_rules.add(module)
    from torch._dynamo.variables import UserFunctionVariable

    trace_rules.manual_torch_name_rule_map.update(dict.fromkeys(_TRACED, UserFunctionVariable))
    if trace_rules.get_torch_obj_rule_map.cache_info().currsize:  # the rules were read already
        rules = trace_rules.get_torch_obj_rule_map()
        rules.update(dict.fromkeys(map(trace_rules.load_object, _TRACED), UserFunctionVariable))


def _cacheable_factories() -> dict[str, str]:
    """The names (as PyTorch's cache check spells a graph's call target: module.name) of the factories
    `runtime.pinned` wraps, each with what keys the entries it appears in: the wrappers' source, so that a changed
    wrapper never reuses an entry."""
    from torch_tpu.runtime import pinned

    source = hashlib.blake2b(pathlib.Path(pinned.__file__).read_bytes(), digest_size=8).hexdigest()
    factories = (getattr(torch, name) for name in pinned.FACTORIES)
    return {f"{factory.__module__}.{factory.__name__}": f"torch_tpu.runtime.pinned {source}" for factory in factories}


def _mark_cacheable(config: types.ModuleType) -> None:
    # Assigned, not updated in place: a config module re-hashes (for cache keys) and patches assigned values only.
    config.unsafe_marked_cacheable_functions = {**config.unsafe_marked_cacheable_functions, **_cacheable_factories()}


def install() -> None:
    """Keep Dynamo out of torch_tpu's and JAX's frames and mark the wrapped factories cacheable (once per
    process; torch_tpu's import calls it)."""
    after_import(_TRACE_RULES, _add_skips)
    after_import(_INDUCTOR_CONFIG, _mark_cacheable)
