"""`torch.profiler` with the device's timeline: `ProfilerActivity.TPU` runs JAX's profiler alongside.

    cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir="runs/exp")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.TPU],
                                experimental_config=cfg) as prof:
        step()
    prof.key_averages().table(sort_by="self_device_time_total")  # Self TPU columns
    prof.export_chrome_trace("trace.json")  # PyTorch's ops and the XLA executions on one clock, linked

The XSpace for XProf/TensorBoard lands in `run_dir/plugins/profile/<timestamp>/<host>_<rank>.xplane.pb`
(docs/profiling.md). This package is also `torch.tpu.profiler`, whose public names are `__all__`.
"""

from __future__ import annotations

from torch_tpu.profiler.config import TpuProfilerConfig as TpuProfilerConfig

__all__ = ["TpuProfilerConfig"]
