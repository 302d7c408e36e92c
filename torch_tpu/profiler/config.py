"""`torch.tpu.profiler.TpuProfilerConfig`: TorchTPU's options of the XProf trace taken beside `torch.profiler`."""

from __future__ import annotations

import os
from typing import Any

from torch._C._profiler import _ExperimentalConfig

_LEVELS = {"host_tracer_level": (0, 3), "device_tracer_level": (0, 1), "python_tracer_level": (0, 1)}


class TpuProfilerConfig(_ExperimentalConfig):
    """What JAX's profiler records while a `torch.profiler.profile` with `ProfilerActivity.TPU` runs, and where
    its XSpace goes. Passed as `profile(experimental_config=...)`: it is a Kineto `_ExperimentalConfig` too, so
    PyTorch takes it as it is (`kineto_options` are its own keyword arguments).

    Args:
        host_tracer_level: JAX's host TraceMe level, 0 (off) to 3 (verbose); 2 records the executions' launches.
        device_tracer_level: 0 or 1; recorded in the options, but JAX's profiler ignores it (it always traces the
            device where the platform has a device tracer).
        python_tracer_level: 1 records every Python call in the XSpace (about 30 times the events); off by default.
        run_dir: the XSpace lands in `run_dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>_<rank>.xplane.pb`,
            the layout `xprof --logdir run_dir` and `tensorboard --logdir run_dir` read; None keeps it only in
            memory (merged into the PyTorch trace, then deleted).
        worker_rank: the `<rank>` of the file name; default: `$RANK`, else torch.distributed's rank, else 0.
        experimental_options: JAX `ProfileOptions.advanced_configuration` entries (str -> bool, int or str).

    Example:
        cfg = torch.tpu.profiler.TpuProfilerConfig(run_dir="runs/exp")
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.TPU],
                                    experimental_config=cfg) as prof:
            step()
    """

    def __init__(
        self,
        *,
        host_tracer_level: int = 2,
        device_tracer_level: int = 1,
        python_tracer_level: int = 0,
        run_dir: str | os.PathLike | None = None,
        worker_rank: str | int | None = None,
        experimental_options: dict[str, Any] | None = None,
        **kineto_options: Any,
    ) -> None:
        super().__init__(**kineto_options)
        levels = {
            "host_tracer_level": host_tracer_level,
            "device_tracer_level": device_tracer_level,
            "python_tracer_level": python_tracer_level,
        }
        for name, value in levels.items():
            low, high = _LEVELS[name]
            if type(value) is not int or not low <= value <= high:
                raise ValueError(f"TpuProfilerConfig: {name} must be an int in [{low}, {high}], got {value!r}")
        options = dict(experimental_options or {})
        for key, value in options.items():
            if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
                raise TypeError(
                    f"TpuProfilerConfig: experimental_options maps str to bool, int or str; got {key!r}: {value!r}"
                )
        self.host_tracer_level = host_tracer_level
        self.device_tracer_level = device_tracer_level
        self.python_tracer_level = python_tracer_level
        self.run_dir = None if run_dir is None else os.fspath(run_dir)
        self.worker_rank = None if worker_rank is None else str(worker_rank)
        self.experimental_options = options

    def __repr__(self) -> str:
        return (
            f"TpuProfilerConfig(host_tracer_level={self.host_tracer_level}, device_tracer_level="
            f"{self.device_tracer_level}, python_tracer_level={self.python_tracer_level}, run_dir={self.run_dir!r}, "
            f"worker_rank={self.worker_rank!r}, experimental_options={self.experimental_options!r})"
        )

    def rank(self) -> str:
        """The rank in the XSpace's file name."""
        if self.worker_rank is not None:
            return self.worker_rank
        if "RANK" in os.environ:
            return os.environ["RANK"]
        import torch.distributed as dist

        return str(dist.get_rank()) if dist.is_available() and dist.is_initialized() else "0"
