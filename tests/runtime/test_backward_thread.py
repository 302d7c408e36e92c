"""A backward pass of `tpu` tensors runs on the thread that calls it (runtime/backward_thread.py), with the same
gradients as on CPU; TORCH_TPU_BACKWARD_ON_CALLING_THREAD=0 leaves it to the autograd engine's device thread."""

import subprocess
import sys
import threading

import pytest
import torch

from torch_tpu.testing.processes import child_env

CODE = """
import threading, torch
w = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
x = torch.arange(8.0).reshape(2, 4)
grads = {}
for device in ("cpu", "tpu"):
    wd = w.to(device, copy=True).requires_grad_()
    threads = []
    wd.register_hook(lambda g: threads.append(threading.current_thread() is threading.main_thread()) or g)
    (torch.tanh(x.to(device) @ wd.T) ** 2).sum().backward()
    grads[device] = (wd.grad.cpu(), threads)
torch.testing.assert_close(grads["tpu"][0], grads["cpu"][0], rtol=1.3e-6, atol=1e-5)
print(torch.autograd.is_multithreading_enabled(), grads["cpu"][1], grads["tpu"][1])
"""


def _run(**env: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CODE],
        capture_output=True,
        text=True,
        env=child_env(clean=True, TORCH_TPU_PLATFORM="cpu", **env),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.children
def test_backward_runs_on_the_calling_thread():
    assert _run() == ["False", "[True]", "[True]"]


@pytest.mark.children
def test_switched_off_the_engine_runs_it_on_its_device_thread():
    assert _run(TORCH_TPU_BACKWARD_ON_CALLING_THREAD="0") == ["True", "[True]", "[False]"]


def test_this_process_runs_its_backward_passes_itself():
    """The suite's own process used the device first on its main thread: its passes run there."""
    w = torch.ones(3, device="tpu", requires_grad=True)
    seen = []
    w.register_hook(lambda g: seen.append(threading.current_thread() is threading.main_thread()) or g)
    (w * 2).sum().backward()
    assert seen == [threading.current_thread() is threading.main_thread()]
    torch.testing.assert_close(w.grad.cpu(), torch.full((3,), 2.0))
