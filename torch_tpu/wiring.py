"""Every change torch_tpu makes to torch, and every late-bound hook it fills, in the order `torch_tpu._register()`
applies them, once per process.

PyTorch's out-of-tree route for a device (PrivateUse1) takes three steps: name the device, register its module and
its hooks. A device that must behave as CUDA does under unmodified code needs more: kernels for every op, storage
paths, `Module.to` keeping parameter identity, DLPack, autocast, a c10d backend, profiler hooks. Each of those
changes sits in the module of its concept, as an idempotent `install()` (no module changes torch when imported);
`CHANGES` lists them all, with what each changes, so a maintainer reads here what torch_tpu does to torch.
`runtime.hooks` holds the slots of the late-bound calls that some of these steps fill.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Change:
    """One step: what it changes in torch (or which `runtime.hooks` slots it fills), and the `module:function`
    that applies it (imported when applied, so the order below is also the order of the imports)."""

    changes: str
    install: str
    helpers: tuple[str, ...] = ()  # the other modules whose code the install runs to change torch

    def apply(self) -> None:
        module, function = self.install.split(":")
        getattr(importlib.import_module(module), function)()


CHANGES: tuple[Change, ...] = (
    Change("torch.Tensor, TypedStorage, UntypedStorage: .tpu(), .is_tpu (PrivateUse1 methods)", f"{__name__}:methods"),
    Change("torch.tpu, the device module", f"{__name__}:device_module"),
    Change(
        "FakeTensor's device normalisation: tpu:LOCAL_RANK is tpu:0 in compiled code too",
        "torch_tpu.runtime.accelerator:alias_in_fake_tensors",
        ("torch_tpu.runtime.compat",),
    ),
    Change(
        "PrivateUse1 hooks and device guard (what torch.accelerator asks the device)",
        "torch_tpu.runtime.accelerator:register",
    ),
    Change(
        "Dynamo's trace rules skip torch_tpu's and JAX's frames; Inductor's cacheable factories (before anything "
        "can compile, whatever the backend)",
        "torch_tpu.compile.skips:install",
    ),
    Change(
        "Dynamo's optimizer tracing: a param group all on tpu takes the capturable path, as CUDA's does",
        "torch_tpu.compile.capturable:install",
        ("torch_tpu.runtime.late_imports",),
    ),
    Change(
        "ops.registry: Inductor's prims.fma (Dynamo's addcmul_/addcdiv_ with a value) once Inductor is imported",
        "torch_tpu.ops.elementwise:lower_inductor_prims",
        ("torch_tpu.runtime.late_imports",),
    ),
    Change(
        "torch._C's setters of the default dtype and fp32 matmul precision refresh the trace context",
        "torch_tpu.runtime.trace_context:install",
    ),
    Change(
        "aten kernels for PrivateUse1 and AutogradPrivateUse1: every registry lowering",
        "torch_tpu.eager.register:install",
    ),
    Change("hooks.eager_state, record, flush (Fused eager's recorder)", "torch_tpu.eager.fused:install"),
    Change(
        "torch.optim's global step pre/post hooks: a step is one program (Strict records it, Fused cuts around it)",
        "torch_tpu.eager.steps:install",
    ),
    Change(
        "torch.accelerator.synchronize and the calls PrivateUse1 lacks route to torch.tpu", f"{__name__}:accelerator"
    ),
    Change(
        "CPU kernels of is_pinned, _pin_memory, pin_memory; pin_memory= of torch's and Tensor's factories",
        "torch_tpu.runtime.pinned:install",
    ),
    Change("torch.UntypedStorage.resize_ for tpu storages", "torch_tpu.runtime.storage:install"),
    Change(
        "torch.Tensor.__dlpack__, __dlpack_device__; torch(.utils.dlpack).to_dlpack, from_dlpack",
        "torch_tpu.interop:install",
    ),
    Change(
        "torch.storage._to, _StorageBase.tpu, UntypedStorage.__new__ and .new (torch.save/load of tpu tensors)",
        "torch_tpu.runtime.serialization:install",
    ),
    Change("nn.Module.to, .cpu, .tpu, .to_empty keep parameter identity", "torch_tpu.runtime.modules:install"),
    Change(
        "torch.ops.torch_tpu.* prebuilt kernels; aten.scaled_dot_product_attention for tpu tensors; torch.tpu.ops",
        "torch_tpu.kernels.prebuilt:install",
    ),
    Change("AutocastPrivateUse1 kernels; bfloat16 as the tpu autocast dtype", "torch_tpu.amp:install"),
    Change(
        "c10d backends tpu_dist and tpu; init_process_group (tpu_dist by default), destroy_process_group",
        "torch_tpu.distributed.process_group:register",
    ),
    Change(
        "DDP's _DDPSink.backward, DeviceMesh's world-group setup, ProcessGroupGloo.perform_nocolor_split, "
        "torch.random.fork_rng, split_group",
        "torch_tpu.distributed.torch_patches:install",
    ),
    Change("_c10d_functional collectives' PrivateUse1 kernels", "torch_tpu.distributed.functional_eager:install"),
    Change("batch_isend_irecv orders tpu batches", "torch_tpu.distributed.point_to_point:install"),
    Change("hooks.spmd_plan, spmd_cluster, mesh_program", "torch_tpu.distributed.spmd:install"),
    Change(
        "torch.ops.torch_tpu.all_gather_dim, reduce_scatter_dim (and in torch.tpu.ops)",
        "torch_tpu.distributed.dim_collectives:install",
    ),
    Change(
        "ProfilerActivity.TPU; torch.profiler's start/stop of a trace, its events and Chrome export",
        "torch_tpu.profiler.session:install",
        ("torch_tpu.runtime.compat",),
    ),
    Change("torch.tpu.distributed, torch.tpu.pallas, torch.tpu.profiler", f"{__name__}:device_submodules"),
)


# Applied later, where they are needed, and listed here so that the list is whole.
LATER: tuple[Change, ...] = (
    Change(
        "when the first tpu_dist group is made (process_group): c10d's PrivateUse1 kernels, ProcessGroup's reducing "
        "methods, torch.distributed's calls guarded by the watchdog, all_reduce's fast path",
        "torch_tpu.distributed.kernels:install",
        ("torch_tpu.distributed.fast", "torch_tpu.distributed.watchdog"),
    ),
)


def apply() -> None:
    """Apply every change, in order (each is idempotent)."""
    for change in CHANGES:
        change.apply()


def methods() -> None:
    if not hasattr(torch.Tensor, "is_tpu"):
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)


def device_module() -> None:
    from torch_tpu import tpu

    if getattr(torch, "tpu", None) is not tpu:
        torch._register_device_module("tpu", tpu)


def accelerator() -> None:
    from torch_tpu import tpu
    from torch_tpu.runtime import accelerator

    accelerator.install(tpu.synchronize)


def device_submodules() -> None:
    """The sibling layers' public packages as `torch.tpu.*` (importable by those names too)."""
    from torch_tpu import distributed, profiler, tpu
    from torch_tpu.kernels import pallas

    for name, package in (("distributed", distributed), ("pallas", pallas), ("profiler", profiler)):
        setattr(tpu, name, package)
        sys.modules[f"torch.tpu.{name}"] = package
