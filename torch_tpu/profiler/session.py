"""JAX's profiler running beside `torch.profiler` when `ProfilerActivity.TPU` is asked for.

PyTorch's device events need a C++ Kineto backend, so the device side is joined in Python (REFERENCE.md §8):
`_KinetoProfile.start_trace`/`stop_trace` also start and stop `jax.profiler` (and, while it runs, each
`record_function` range also enters a `jax.profiler.TraceAnnotation`, so the XProf trace shows it); the XSpace is
moved to `run_dir/plugins/profile/<timestamp>/<host>_<rank>.xplane.pb` and its executions are kept on the
autograd profiler, where `merge` adds them to the function events and the exported Chrome trace.

Nothing here is on the op path: the hooks act at a profile's start, stop and export, and a profile without the
TPU activity is PyTorch's own (its methods run unchanged).
"""

from __future__ import annotations

import pathlib
import shutil
import socket
import tempfile
import time
from typing import Any

import jax
import torch
from torch.autograd import profiler as autograd_profiler
from torch.profiler import ProfilerActivity
from torch.profiler import profiler as torch_profiler

from torch_tpu.eager import fused
from torch_tpu.profiler import merge, xspace
from torch_tpu.profiler.config import TpuProfilerConfig
from torch_tpu.runtime import compat

_original: dict[str, Any] = {}
_SETTLE_S = 0.05  # the pause between the last execution and stopping JAX's profiler (see Capture.stop)


class Capture:
    """One JAX profiler session under a PyTorch profiling cycle."""

    def __init__(self, config: TpuProfilerConfig) -> None:
        self.config = config
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="torch_tpu_xspace_"))
        fused.drain()  # work queued before the window (a cold Strict op's, `eager.warmup`) runs outside it
        options = jax.profiler.ProfileOptions()
        options.host_tracer_level = config.host_tracer_level
        options.python_tracer_level = config.python_tracer_level
        if config.experimental_options:
            options.advanced_configuration = dict(config.experimental_options)
        try:
            jax.profiler.start_trace(str(self.scratch), profiler_options=options)
        except RuntimeError as error:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise RuntimeError(
                f"torch_tpu: ProfilerActivity.TPU could not start JAX's profiler ({error}); is a "
                "jax.profiler trace already running?"
            ) from error
        _annotate_record_function(True)

    def stop(self) -> merge.DeviceTrace:
        """Finish the device's work, stop JAX's profiler and place and read its XSpace.

        XLA:CPU's runtime events (its thunks, threadpool launches, "wait for completion") were all missing from
        about one session in three when `stop_trace` followed the last execution at once (the first session of a
        process under torch.profiler nearly always), while the host's calls in the same session were there; a
        pause of 0.1 ms or more, with the GIL released, before stopping kept them in ~100 probe sessions, though
        the 2-cycle schedule test still lost them in 2 of 31 runs under heavy load with 10 ms: a mitigation, the
        cause unknown (docs/profiling.md, Limits). It costs 50 ms per profiling cycle, not per op."""
        try:
            torch.tpu.synchronize()
            time.sleep(_SETTLE_S)
        finally:
            _annotate_record_function(False)
            jax.profiler.stop_trace()
        try:
            written = sorted(self.scratch.glob("plugins/profile/*/*.xplane.pb"))
            if not written:
                raise RuntimeError(f"torch_tpu: JAX's profiler wrote no XSpace under {self.scratch}")
            executions = xspace.read(written[-1])
            path = self._place(written[-1]) if self.config.run_dir is not None else None
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return merge.DeviceTrace(executions, path)

    def _place(self, written: pathlib.Path) -> pathlib.Path:
        """Move the XSpace to `run_dir/plugins/profile/<JAX's timestamp>/<host>_<rank>.xplane.pb` (a new directory
        when a cycle of the same second is there already)."""
        profile = pathlib.Path(self.config.run_dir) / "plugins" / "profile"
        stamp = written.parent.name
        name = f"{socket.gethostname()}_{self.config.rank()}.xplane.pb"
        target, n = profile / stamp / name, 1
        while target.exists():
            target, n = profile / f"{stamp}_{n}" / name, n + 1
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(written), target)
        return target


def _wants_tpu(profile: torch_profiler._KinetoProfile) -> bool:
    return ProfilerActivity.PrivateUse1 in profile.activities


def _start_trace(self: torch_profiler._KinetoProfile) -> None:
    _original["start_trace"](self)
    if _wants_tpu(self):
        config = self.experimental_config
        try:
            self._tpu_capture = Capture(config if isinstance(config, TpuProfilerConfig) else TpuProfilerConfig())
        except BaseException:
            _original["stop_trace"](self)  # PyTorch's profiler does not stay enabled behind a failed start
            raise


def _stop_trace(self: torch_profiler._KinetoProfile) -> None:
    capture = self.__dict__.pop("_tpu_capture", None)
    try:
        trace = capture.stop() if capture is not None else None
    finally:
        _original["stop_trace"](self)
    if trace is not None:
        self.profiler._tpu_trace = trace  # its function events are built (lazily) with the device's


def _ensure_function_events(self: autograd_profiler.profile) -> None:
    _original["_ensure_function_events"](self)
    trace = getattr(self, "_tpu_trace", None)
    if trace is not None and self._function_events is not None:
        merge.into_function_events(self._function_events, trace, self.kineto_results.trace_start_ns())


def _export_chrome_trace(self: autograd_profiler.profile, path: str, *args: Any, **kwargs: Any) -> Any:
    # torch's own arguments pass through as given (2.13 added `metadata` and `use_python_export`; 2.12 has neither)
    result = _original["export_chrome_trace"](self, path, *args, **kwargs)
    trace = getattr(self, "_tpu_trace", None)
    if trace is not None:
        merge.into_chrome_trace(path, trace)
    return result


def _annotate_record_function(on: bool) -> None:
    """While JAX's profiler runs, `record_function` ranges are also XProf TraceAnnotations."""
    cls = autograd_profiler.record_function
    if not on:
        cls.__enter__, cls.__exit__ = _original["rf_enter"], _original["rf_exit"]
        return
    enter, leave = _original["rf_enter"], _original["rf_exit"]

    def annotated_enter(self: autograd_profiler.record_function) -> Any:
        result = enter(self)
        annotation = jax.profiler.TraceAnnotation(self.name)
        annotation.__enter__()
        self._tpu_annotation = annotation
        return result

    def annotated_exit(self: autograd_profiler.record_function, *exc: Any) -> Any:
        annotation = self.__dict__.pop("_tpu_annotation", None)
        if annotation is not None:
            annotation.__exit__(None, None, None)
        return leave(self, *exc)

    cls.__enter__, cls.__exit__ = annotated_enter, annotated_exit


def install() -> None:
    """Name ProfilerActivity.TPU and hook PyTorch's profiler (once per process)."""
    if _original:
        return
    compat.name_profiler_activity("tpu")
    kineto, autograd = torch_profiler._KinetoProfile, autograd_profiler.profile
    _original.update(
        start_trace=kineto.start_trace,
        stop_trace=kineto.stop_trace,
        _ensure_function_events=autograd._ensure_function_events,
        export_chrome_trace=autograd.export_chrome_trace,
        rf_enter=autograd_profiler.record_function.__enter__,
        rf_exit=autograd_profiler.record_function.__exit__,
    )
    kineto.start_trace, kineto.stop_trace = _start_trace, _stop_trace
    autograd._ensure_function_events = _ensure_function_events
    autograd.export_chrome_trace = _export_chrome_trace


def uninstall() -> None:
    """PyTorch's profiler as it was (for tests comparing with an untouched profiler)."""
    if not _original:
        return
    kineto, autograd = torch_profiler._KinetoProfile, autograd_profiler.profile
    kineto.start_trace, kineto.stop_trace = _original["start_trace"], _original["stop_trace"]
    autograd._ensure_function_events = _original["_ensure_function_events"]
    autograd.export_chrome_trace = _original["export_chrome_trace"]
    _original.clear()
