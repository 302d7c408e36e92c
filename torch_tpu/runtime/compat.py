"""The one place that knows which torch and JAX releases torch_tpu runs on, and where their private APIs live.

torch_tpu leans on private PyTorch and JAX APIs: a storage made from a fake data pointer, the PrivateUse1 hook
and guard classes, AOTAutograd's cache hooks, JAX's weak-typed cast and its backend and multi-process state.
Each is found here by feature (where the running release keeps it), not by version string, and call sites take
it from this module; a release that moves one is handled here alone. `supported()` is the import-time check of
the releases themselves (docs/compatibility.md lists what was tested).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any

import jax
import numpy as np
import torch

# (lowest supported, first unsupported), the ranges pyproject.toml declares (tests/test_compat.py checks they agree).
SUPPORTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "torch": ((2, 11), (2, 15)),
    "jax": ((0, 10, 2), (0, 12)),
    "jaxlib": ((0, 10, 2), (0, 12)),
}
SKIP_CHECK_ENV = "TORCH_TPU_SKIP_VERSION_CHECK"


def _release(version: str) -> tuple[int, ...]:
    """`2.11.0+cu130` -> (2, 11, 0): the numeric release, local build and pre-release tags dropped."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def _spell(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def in_range(name: str, version: str) -> bool:
    """Whether `version` of `name` (torch, jax or jaxlib) is inside the supported range."""
    low, high = SUPPORTED[name]
    return low <= _release(version) < high


def supported_range(name: str) -> str:
    """The supported range of `name` as a requirement's specifier: `>=2.11,<2.15`."""
    low, high = SUPPORTED[name]
    return f">={_spell(low)},<{_spell(high)}"


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def version_problem() -> str | None:
    """What is outside the supported ranges among the installed torch, jax and jaxlib, with the ranges; None when
    all are inside (or TORCH_TPU_SKIP_VERSION_CHECK=1 asks to try anyway)."""
    if os.environ.get(SKIP_CHECK_ENV) == "1":
        return None
    wrong = []
    for name in SUPPORTED:
        found = _installed(name)
        if found is not None and not in_range(name, found):
            wrong.append(f"{name} {found}")
    if not wrong:
        return None
    ranges = ", ".join(f"{name}{supported_range(name)}" for name in SUPPORTED)
    return (
        f"torch_tpu supports {ranges}; found {', '.join(wrong)}. Install a supported release, or set "
        f"{SKIP_CHECK_ENV}=1 to try this one unsupported."
    )


def _torch_is_importing() -> bool:
    """Whether `import torch` is still running: torch imports torch_tpu itself (its `torch.backends` entry point)
    before its own import has finished."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(getattr(getattr(torch, "__spec__", None), "_initializing", False))


def supported() -> bool:
    """True when the installed releases are supported. Otherwise an explicit `import torch_tpu` raises
    ImportError naming them; torch's autoload of us gets a warning and False instead, so that `import torch`
    still works (without the `tpu` device) for whatever else the environment runs."""
    problem = version_problem()
    if problem is None:
        return True
    if _torch_is_importing():
        warnings.warn(f"{problem} The tpu device is not registered.", RuntimeWarning, stacklevel=2)
        return False
    raise ImportError(problem)


def _first(where: str, *finders: Callable[[], Any]) -> Any:
    """The first of `finders` that finds its API in the running release; else a stand-in that raises naming
    `where` when used (so an unsupported release fails at the feature, not at import)."""
    for finder in finders:
        try:
            return finder()
        except (ImportError, AttributeError):
            continue

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"torch_tpu: this release has no {where} (torch {torch.__version__}, jax {jax.__version__})")

    return missing


# --- torch: Dynamo's frame evaluation -------------------------------------------------------------------------------


def _dynamo_frame_switch() -> Callable[[Any], Any] | None:
    try:
        return torch._C._dynamo.eval_frame.set_eval_frame
    except AttributeError:
        return None


_set_eval_frame = _dynamo_frame_switch()


def without_dynamo_frames(fn: Callable) -> Callable:
    """`fn` run with Dynamo's frame callback cleared, as `torch._dynamo.disable` runs a function, without importing
    Dynamo. An eager op compiled in a compiled region's eager stretch (a fill in `loss.backward()`) lowers through
    JAX, which calls the standard library (`inspect`, `logging`): Dynamo skips our and JAX's frames but would
    compile those, in every process. Where this torch has no such switch, `fn` itself."""
    switch = _set_eval_frame
    if switch is None:
        return fn

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        prior = switch(None)
        try:
            return fn(*args, **kwargs)
        finally:
            switch(prior)

    return run


# --- torch: PrivateUse1 device and storage -------------------------------------------------------------------------

PrivateUse1Hooks = _first("torch._C._acc.PrivateUse1Hooks", lambda: torch._C._acc.PrivateUse1Hooks)
DeviceGuard = _first("torch._C._acc.DeviceGuard", lambda: torch._C._acc.DeviceGuard)
register_hooks = _first(
    "torch._C._acc.register_python_privateuseone_hook", lambda: torch._C._acc.register_python_privateuseone_hook
)
register_device_guard = _first(
    "torch._C._acc.register_python_privateuseone_device_guard",
    lambda: torch._C._acc.register_python_privateuseone_device_guard,
)
PRIVATEUSE1_DEVICE_TYPE = _first(
    "torch._C._autograd.DeviceType.PrivateUse1", lambda: torch._C._autograd.DeviceType.PrivateUse1
)
create_empty_tensor: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] = _first(
    "torch._C._acc.create_empty_tensor", lambda: torch._C._acc.create_empty_tensor
)
"""A `tpu` tensor of `shape` and `dtype` with no storage of its own yet (set_ gives it one)."""
storage_from_data_pointer: Callable[[int, torch.device, int], torch.UntypedStorage] = _first(
    "torch._C._construct_storage_from_data_pointer", lambda: torch._C._construct_storage_from_data_pointer
)
"""`(address, device, nbytes)` -> an untyped storage over that (here fake, never dereferenced) address."""
STORAGE_SWAPS_DATA_POINTER = hasattr(torch._C.StorageBase, "_swap_data_ptr_")
"""Whether a storage can take another's data pointer in place (`_swap_data_ptr_`, torch >= 2.12): the fast way to
give a fresh tensor its storage; without it, `set_`."""
new_storage = torch._C.StorageBase.__new__
new_storage_like = torch._C.StorageBase.new
create_work_from_future = _first(
    "torch._C._distributed_c10d._create_work_from_future",
    lambda: __import__("torch._C._distributed_c10d", fromlist=["_"])._create_work_from_future,
)


class AbsentOp:
    """An ATen op, or an overload of one, that the running torch does not have (torch 2.14 dropped
    `aten.cholesky`): registering a lowering or kernel for it registers nothing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, overload: str) -> AbsentOp:
        if overload.startswith("__"):
            raise AttributeError(overload)
        return AbsentOp(f"{self.name}.{overload}")

    def __repr__(self) -> str:
        return f"<{self.name}: not in torch {torch.__version__}>"


class _Aten:
    """`torch.ops.aten`, except that an op this torch lacks is an `AbsentOp` instead of an AttributeError, so
    that the op tables import on every supported release. Each op is looked up once, then cached here."""

    def __getattr__(self, name: str) -> Any:
        try:
            found = getattr(torch.ops.aten, name)  # aten has dunder-named ops too (`__lshift__`)
        except AttributeError:
            if name.startswith("__"):
                raise
            found = AbsentOp(f"aten.{name}")
        setattr(self, name, found)
        return found


aten = _Aten()


def present(ops: tuple) -> tuple:
    """`ops` without those the running torch lacks."""
    return tuple(op for op in ops if not isinstance(op, AbsentOp))


# torch's state that decides whether a collective may skip torch.distributed's own call (`distributed/fast.py`);
# where a release lacks one, every call goes through torch.
dispatch_mode_depth: Callable[[], int] = _first(
    "torch._C._len_torch_dispatch_stack", lambda: torch._C._len_torch_dispatch_stack, lambda: lambda: 1
)
functorch_transforming: Callable[[], bool] = _first(
    "torch._C._functorch.peek_interpreter_stack",
    lambda: (lambda peek: lambda: peek() is not None)(torch._C._functorch.peek_interpreter_stack),
    lambda: lambda: True,
)
"""Whether a torch.func transform (grad, vmap, jvp) is running: its wrapped tensors are plain `torch.Tensor`s to
Python, and an op of ours with autograd must then leave the call to PyTorch's composite."""


def cpp_composite(op: torch._ops.OpOverload) -> Callable:
    """`op`'s C++ composite kernel (CompositeImplicitAutograd), also where PyTorch registers a Python decomposition
    over it for tracing (`aten::matmul` has one, which `op.decompose` runs): in eager the Python one ran the same
    shape logic ~60 µs a call slower on the CPU machine. Where this torch has no such call, `op.decompose`."""
    call = getattr(op, "_op_dk", None)
    if call is None:
        return op.decompose
    return functools.partial(call, torch._C.DispatchKey.CompositeImplicitAutograd)


profiler_enabled: Callable[[], bool] = _first(
    "torch._C._autograd._profiler_enabled", lambda: torch._C._autograd._profiler_enabled, lambda: lambda: True
)


def _meta_refuses_inplace_casts() -> bool:
    try:
        torch.empty(1, dtype=torch.int64, device="meta").div_(2)
    except RuntimeError:
        return True
    return False


META_REFUSES_INPLACE_CASTS = _meta_refuses_inplace_casts()
"""Whether an in-place op's meta kernel refuses a result dtype its tensor cannot take (`int_tensor.div_(2)`,
torch >= 2.13); where not, eager checks the functional result's dtype itself (`validation.check_inplace_dtype`)."""


def name_profiler_activity(backend: str) -> None:
    """`ProfilerActivity.<BACKEND>` as PrivateUse1's alias: torch >= 2.13 adds it when the backend is renamed,
    older releases only have `ProfilerActivity.PrivateUse1`."""
    from torch._C._profiler import ProfilerActivity

    if not hasattr(ProfilerActivity, backend.upper()):
        setattr(ProfilerActivity, backend.upper(), ProfilerActivity.PrivateUse1)


def wrap_fake_device_normalizer(wrap: Callable[[Callable], Callable]) -> bool:
    """Replaces FakeTensor's device normalisation with `wrap(original)`; False where the release inlines it in
    `FakeTensor.__new__` (torch 2.11) and nothing can be wrapped."""
    from torch._subclasses.fake_tensor import FakeTensor

    original = getattr(FakeTensor, "_normalize_fake_device", None)
    if original is None:
        return False
    if not getattr(original, "_torch_tpu_wrapped", False):
        wrapped = wrap(original)
        wrapped._torch_tpu_wrapped = True
        FakeTensor._normalize_fake_device = staticmethod(wrapped)
    return True


def c10d_group_now(group: Any) -> Any:
    """`group` (None: the default group) if torch.distributed would issue a collective on it now; None before
    init_process_group, in a coalescing context (`_coalescing_manager`), or on a release that keeps these elsewhere."""
    try:
        world = sys.modules["torch.distributed.distributed_c10d"]._world
        group = group if group is not None else world.default_pg
        return None if group is None or group in world.pg_coalesce_state else group
    except (KeyError, AttributeError):
        return None


# --- jax ---------------------------------------------------------------------------------------------------------


def _jax_private(module: str, name: str) -> Callable[[], Any]:
    return lambda: getattr(importlib.import_module(module), name)


convert_element_type = _first(
    "jax._src.lax.lax._convert_element_type", _jax_private("jax._src.lax.lax", "_convert_element_type")
)
"""`convert_element_type(x, new_dtype=None, weak_type=False)`: jax.lax's cast that can also set weak typing (how a
Python scalar traces), which the public `jax.lax.convert_element_type` cannot."""
_backends_are_initialized = _first(
    "jax._src.xla_bridge.backends_are_initialized", _jax_private("jax._src.xla_bridge", "backends_are_initialized")
)
_distributed_state = _first("jax._src.distributed.global_state", _jax_private("jax._src.distributed", "global_state"))


_batched_device_put = _first(
    "jax._src.lib.xla_client.batched_device_put",
    lambda: importlib.import_module("jax._src.lib").xla_client.batched_device_put,
)
_shaped_array = _first("jax._src.core.ShapedArray", _jax_private("jax._src.core", "ShapedArray"))


@functools.lru_cache(maxsize=4096)  # a loader's batches may take many shapes
def _placement(shape: tuple[int, ...], dtype: Any, device: Any) -> tuple[Any, Any]:
    return _shaped_array(shape, dtype), jax.sharding.SingleDeviceSharding(device)


def put_copy(value: Any, device: Any) -> jax.Array:
    """`jax.device_put(numpy.array(value, copy=True), device)` without device_put's Python, which costs ~10x the
    transfer of a scalar: the array is a private copy, so the transfer may alias it or read it later, as
    device_put's may (an immutable-during-the-call transfer waits for a worker thread, 10x dearer again)."""
    private = np.array(value, copy=True, order="C")
    try:
        aval, sharding = _placement(private.shape, private.dtype, device)
        return _batched_device_put(aval, sharding, [private], [device])
    except jax.errors.JaxRuntimeError:  # the transfer's own failure (out of memory, a type the device lacks)
        raise
    except (RuntimeError, TypeError):  # an API this release lacks or spells otherwise
        return jax.device_put(private, device)


def jax_backends_initialized() -> bool:
    """Whether JAX has started its backends (after which jax.distributed.initialize cannot run)."""
    return bool(_backends_are_initialized())


_tpu_chips_and_version = _first(
    "jax._src.hardware_utils.num_available_tpu_chips_and_device_id",
    _jax_private("jax._src.hardware_utils", "num_available_tpu_chips_and_device_id"),
)


def tpu_chips_attached() -> int:
    """The TPU chips on this host's PCI bus, as JAX counts them before libtpu starts (0 where it cannot say)."""
    try:
        return int(_tpu_chips_and_version()[0])
    except (RuntimeError, OSError, ValueError):
        return 0


def jax_distributed_client() -> Any:
    """JAX's multi-process client, None before jax.distributed.initialize."""
    return getattr(_distributed_state, "client", None)


def serialize_executable(compiled: Any) -> tuple:
    """`jax.experimental.serialize_executable.serialize`: (bytes, in tree, out tree) of a compiled executable."""
    from jax.experimental import serialize_executable as serialization

    return serialization.serialize(compiled)


def deserialize_executable(payload: tuple, devices: list) -> Any:
    from jax.experimental import serialize_executable as serialization

    return serialization.deserialize_and_load(*payload, execution_devices=devices)
