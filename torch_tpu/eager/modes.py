"""Eager modes: Strict (async, default), Debug (each op completes before the next, NaNs surface) and Fused
(ops deferred and run as compiled clusters, see `eager.fused`)."""

from __future__ import annotations

import enum
import os

import torch

from torch_tpu.runtime.hooks import hooks


class EagerMode(enum.Enum):
    """How eager ops run on the `tpu` device (names as in TorchTPU)."""

    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_AND_FUSE = "fused"


def from_environment() -> EagerMode:
    """The mode the environment asks for (TORCH_TPU_LAUNCH_BLOCKING, TORCH_TPU_DEFER_AND_FUSE), else Strict."""
    if os.environ.get("TORCH_TPU_LAUNCH_BLOCKING") == "1":
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if os.environ.get("TORCH_TPU_DEFER_AND_FUSE") == "1":
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


class _State:
    """The current mode; `blocking` (Debug mode or NaN checks on) and `fused` are kept precomputed for the
    dispatch path."""

    def __init__(self) -> None:
        self._mode = from_environment()
        self._debug_nans = os.environ.get("TORCH_TPU_DEBUG_NANS") == "1"
        self._recording_step = False
        self.blocking = self._is_blocking()
        self.fused = self._is_fused()

    def _is_fused(self) -> bool:
        return self._mode is EagerMode.DEFER_AND_FUSE or self._recording_step

    def _is_blocking(self) -> bool:
        return self._mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING or self._debug_nans

    @property
    def mode(self) -> EagerMode:
        return self._mode

    @mode.setter
    def mode(self, mode: EagerMode) -> None:
        if self.fused and mode is not EagerMode.DEFER_AND_FUSE:
            hooks.flush([])  # eager.fused's: the cluster recorded so far runs
        self._mode = mode
        self.blocking = self._is_blocking()
        self.fused = self._is_fused()

    def record_step(self, recording: bool) -> None:
        """Record ops (True) whatever the mode, or go back to the mode's way: Strict eager's optimizer step as one
        cluster (`eager.steps`); the mode stays what the user set."""
        self._recording_step = recording
        self.fused = self._is_fused()

    @property
    def debug_nans(self) -> bool:
        return self._debug_nans

    @debug_nans.setter
    def debug_nans(self, enabled: bool) -> None:
        self._debug_nans = enabled
        self.blocking = self._is_blocking()


state = _State()


def get_mode() -> EagerMode:
    return state.mode


def set_mode(mode: EagerMode) -> None:
    if not isinstance(mode, EagerMode):
        raise TypeError(f"torch_tpu: eager mode must be a torch.tpu.EagerMode, got {mode!r}")
    if torch.compiler.is_compiling():
        raise RuntimeError("torch_tpu: the eager mode cannot change inside a torch.compile region")
    state.mode = mode


class set_eager_mode:
    """Set the eager mode: as a call, from now on; as a `with` block, for the block, restoring the previous mode
    afterwards (as `torch.set_grad_enabled` does)."""

    def __init__(self, mode: EagerMode) -> None:
        self.previous = state.mode
        set_mode(mode)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        set_mode(self.previous)


def launch_blocking() -> bool:
    return state.blocking
