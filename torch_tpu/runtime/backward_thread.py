"""A backward pass of `tpu` tensors runs on the thread that calls it, not on the autograd engine's device thread.

PyTorch's engine gives each device type with a device guard a worker thread of its own and hands it every node of
that device; CUDA's nodes launch kernels there while other devices' run beside them. A `tpu` node is a Python
kernel that needs the GIL, and the caller of `backward()` waits for the pass to end, so the thread buys nothing and
costs a hand-off between two threads for every node whose neighbour ran on the other: on the CPU machine a 12-layer
tiny GPT's Strict backward took 30.1-32.0 ms on the calling thread against 34.1-40.6 on the device thread
(bench/eager_overhead.py; docs/performance.md). The engine reads the choice per thread
(`torch.autograd.set_multithreading_enabled`, how CPU tensors' passes run); the first use of the device makes it,
once, for the thread that uses it (a user's `set_multithreading_enabled(True)` block still turns it back).
TORCH_TPU_BACKWARD_ON_CALLING_THREAD=0 leaves the engine's device thread.
"""

from __future__ import annotations

import os

import torch

_done = False


def apply() -> None:
    """On the device's first use: this thread's backward passes run on it (the engine's own setting)."""
    global _done
    if _done:
        return
    _done = True
    if os.environ.get("TORCH_TPU_BACKWARD_ON_CALLING_THREAD", "1") != "0":
        torch.autograd.set_multithreading_enabled(False)
