"""Opening the device on a thread (runtime/platform.py): on a TPU host the chip opens while the process imports what
it needs next. Each case runs in a fresh process, with TORCH_TPU_OPEN_ON_THREAD=1 taking the TPU host's path on the
XLA CPU platform."""

import subprocess
import sys

import pytest

from torch_tpu.runtime import compat, platform
from torch_tpu.testing.processes import child_env

pytestmark = pytest.mark.children


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    variables = {"TORCH_TPU_PLATFORM": "cpu", "TORCH_TPU_OPEN_ON_THREAD": "1", **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(clean=True, **variables)
    )


def test_first_op_opens_on_a_thread_and_imports_dynamo_meanwhile():
    """The open takes a second here (a TPU's takes seconds): Dynamo imports on the main thread during it."""
    code = (
        "import importlib.abc, sys, threading, time, torch\n"
        "from torch_tpu.runtime import platform\n"
        "opened = platform._open\n"
        "platform._open = lambda: time.sleep(1.0) or opened()\n"
        "seen = []\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch._dynamo':\n"
        "            seen.append(f'{threading.current_thread().name}:{platform._opener.is_alive()}')\n"
        "sys.meta_path.insert(0, Watch())\n"
        "assert 'torch._dynamo' not in sys.modules and not torch.tpu.is_initialized()\n"
        "x = torch.arange(5, device='tpu') * 3\n"
        "print(platform._opener.name, seen, x.dtype, x.cpu().tolist())\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    # int64 stays int64: the thread configured JAX's x64 for the process, not for itself
    assert done.stdout.split() == [
        "torch_tpu_open_device",
        "['MainThread:True']",
        "torch.int64",
        "[0,",
        "3,",
        "6,",
        "9,",
        "12]",
    ]


def test_a_failure_on_the_thread_raises_in_the_caller(tmp_path):
    """The thread's error is the caller's, once: the device lock the thread took is not found held by the
    process itself when the caller opens again."""
    code = "import torch\ntorch.ones(1, device='tpu')\n"
    done = _run(code, TORCH_TPU_PLATFORM="gpu", TORCH_TPU_DEVICE_LOCK=str(tmp_path / "device.lock"))
    assert done.returncode == 1
    assert "RuntimeError: torch_tpu: no JAX devices for TORCH_TPU_PLATFORM='gpu'" in done.stderr
    assert "in use" not in done.stderr and "Exception in thread" not in done.stderr


def test_a_fork_waits_for_the_device_to_open():
    """A fork while the device opens waits for it: the child never inherits a runtime half brought up."""
    code = (
        "import os, time, torch\n"
        "from torch_tpu.runtime import platform\n"
        "opened = platform._open\n"
        "platform._open = lambda: time.sleep(1.0) or opened()\n"
        "platform.begin_opening()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if platform.is_open() else 3)\n"
        "print(os.waitpid(pid, 0)[1], (torch.ones(2, device='tpu') + 1).cpu().tolist())\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "[2.0,", "2.0]"]


def test_no_thread_to_be_had_opens_on_the_caller():
    """Where Python refuses a new thread (at interpreter shutdown, 3.12+), the caller opens the device itself."""
    code = (
        "import threading, torch\n"
        "from torch_tpu.runtime import platform\n"
        "start = threading.Thread.start\n"
        "def refuse(self):\n"
        "    if self.name == 'torch_tpu_open_device':\n"
        '        raise RuntimeError("can\'t create new thread at interpreter shutdown")\n'
        "    start(self)\n"
        "threading.Thread.start = refuse\n"
        "print(platform._opener, (torch.ones(2, device='tpu') * 3).cpu().tolist(), platform.is_open())\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "[3.0,", "3.0]", "True"]


def test_import_alone_opens_nothing():
    """A process that imports torch and never uses the chip must not hold it (a launcher's children need theirs)."""
    code = "import torch\nfrom torch_tpu.runtime import platform\nprint(platform._opener, platform.is_open())\n"
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False"]


def test_auto_opens_on_a_thread_only_where_a_tpu_is_attached(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_OPEN_ON_THREAD", raising=False)
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "auto")
    monkeypatch.setattr(compat, "tpu_chips_attached", lambda: 0)
    assert not platform._on_thread()
    monkeypatch.setattr(compat, "tpu_chips_attached", lambda: 4)
    assert platform._on_thread()
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "cpu")  # the CPU platform opens in milliseconds
    assert not platform._on_thread()
    monkeypatch.setenv("TORCH_TPU_OPEN_ON_THREAD", "0")
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "tpu")
    assert not platform._on_thread()
