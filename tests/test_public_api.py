"""The public API: `torch_tpu.__all__` and `torch.tpu.__all__` name exactly the public names, each resolves, and
nothing public is defined outside them."""

import types

import torch

import torch_tpu
import torch_tpu.tpu

# TorchTPU 0.2.0's `torch.tpu` names that exist here (not yet: compiler) ...
TORCHTPU_TPU = {
    "device_count",
    "distributed",
    "ops",
    "pallas",
    "profiler",
    "current_device",
    "set_device",
    "is_available",
    "is_initialized",
    "synchronize",
    "get_device_name",
    "get_device_properties",
    "manual_seed",
    "manual_seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_amp_supported_dtype",
    "Stream",
    "Event",
    "stream",
    "current_stream",
    "default_stream",
    "EagerMode",
    "eager_mode",
    "set_eager_mode",
    "Precision",
    "precision",
    "allow_excess_precision",
}
# ... and ours, as torch.cuda names them.
OURS_TPU = {
    "DeviceProperties",
    "device",
    "is_bf16_supported",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "memory_reserved",
    "max_memory_reserved",
    "mem_get_info",
    "empty_cache",
    "finish_compiles",
    "reset_accumulated_memory_stats",
    "memory_snapshot",
    "seed",
    "seed_all",
}
# TorchTPU 0.2.0's `torch.tpu.distributed` names.
TORCHTPU_DISTRIBUTED = {"set_tpu_launch_env", "spmd_safe", "topology_aware_mesh"}
# TorchTPU 0.2.0's `torch.tpu.pallas` names, and ours (register_lowering, KernelError).
TORCHTPU_PALLAS = {"jax_op"}
OURS_PALLAS = {"KernelError", "register_lowering"}

# TorchTPU 0.2.0's `torch.tpu.ops` names (the prebuilt kernels).
TORCHTPU_OPS = {
    "all_gather_dim",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "optimization_barrier",
    "ragged_dot",
    "reduce_scatter_dim",
    "splash_sdpa",
}

# TorchTPU 0.2.0's `torch.tpu.profiler` names.
TORCHTPU_PROFILER = {"TpuProfilerConfig"}
TORCH_TPU = {
    "cpu_fallback_enabled",
    "export_stablehlo",
    "from_jax",
    "index_checks",
    "metrics",
    "set_cpu_fallback",
    "set_index_checks",
    "to_jax",
    "tpu",
}


def _defined_public(module):
    """Public (non-underscore) functions and classes the module itself defines."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and isinstance(value, type | types.FunctionType)
        and value.__module__ == module.__name__
    }


def test_torch_tpu_all():
    assert sorted(torch_tpu.__all__) == sorted(TORCH_TPU)
    assert all(hasattr(torch_tpu, name) for name in torch_tpu.__all__)
    assert _defined_public(torch_tpu) <= set(torch_tpu.__all__)
    assert torch_tpu.tpu is torch.tpu and torch_tpu.__version__ == "0.2.0"


def test_torch_tpu_device_module_all():
    assert sorted(torch.tpu.__all__) == sorted(TORCHTPU_TPU | OURS_TPU)
    assert all(hasattr(torch.tpu, name) for name in torch.tpu.__all__)
    assert _defined_public(torch_tpu.tpu) <= set(torch.tpu.__all__)


def test_torch_tpu_distributed_all():
    import torch.tpu.distributed as tpu_distributed
    from torch.tpu.distributed import spmd_safe

    assert tpu_distributed is torch.tpu.distributed and spmd_safe is torch.tpu.distributed.spmd_safe
    assert sorted(torch.tpu.distributed.__all__) == sorted(TORCHTPU_DISTRIBUTED)
    assert all(hasattr(torch.tpu.distributed, name) for name in torch.tpu.distributed.__all__)
    assert _defined_public(torch.tpu.distributed) <= set(torch.tpu.distributed.__all__)


def test_torch_tpu_pallas_all():
    import torch.tpu.pallas as tpu_pallas
    from torch.tpu.pallas import jax_op

    assert tpu_pallas is torch.tpu.pallas and jax_op is torch.tpu.pallas.jax_op
    assert sorted(torch.tpu.pallas.__all__) == sorted(TORCHTPU_PALLAS | OURS_PALLAS)
    assert all(hasattr(torch.tpu.pallas, name) for name in torch.tpu.pallas.__all__)


def test_torch_tpu_ops_all():
    import torch.tpu.ops as tpu_ops

    assert tpu_ops is torch.tpu.ops
    assert sorted(torch.tpu.ops.__all__) == sorted(TORCHTPU_OPS)
    assert all(isinstance(getattr(torch.tpu.ops, name), torch._ops.OpOverloadPacket) for name in TORCHTPU_OPS)


def test_torch_tpu_profiler_all():
    import torch.tpu.profiler as tpu_profiler
    from torch.tpu.profiler import TpuProfilerConfig

    assert tpu_profiler is torch.tpu.profiler and TpuProfilerConfig is torch.tpu.profiler.TpuProfilerConfig
    assert sorted(torch.tpu.profiler.__all__) == sorted(TORCHTPU_PROFILER)
    assert _defined_public(torch.tpu.profiler) <= set(torch.tpu.profiler.__all__)


def test_star_import_binds_every_name():
    names = {}
    exec("from torch.tpu import *", names)  # the statement under test
    assert set(torch.tpu.__all__) <= set(names)
    exec("from torch_tpu import *", names)
    assert set(torch_tpu.__all__) <= set(names)
