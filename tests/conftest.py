import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after the test (`pytest.mark.usefixtures("fresh_dynamo")`): each
    torch.compile traces and compiles anew, and leaves nothing for the next test."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pytest_runtest_setup(item):
    """TORCH_TPU_TEST_DEADLINE (epoch seconds): the tests that would start after it are skipped, saying so, so a run
    with a hard time limit (bench/device_run.sh on a borrowed chip) ends by itself and writes its report; a run
    cut by a signal can lose it (the chip's runtime may hold the interrupt, then the run is killed)."""
    import os
    import time

    deadline = os.environ.get("TORCH_TPU_TEST_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip("the run's time budget is spent (TORCH_TPU_TEST_DEADLINE)")


def pytest_configure(config):
    """Tests compile cold: a private, per-run persistent cache, and PyTorch's cache directory (AOTAutograd's
    entries) too (tests of the cache set their own). A pytest-xdist worker inherits the controller's directories
    and takes a subdirectory of each: workers run at once and must not see each other's entries. The journal
    (torch_tpu/testing/journal.py) lets a run survive its process dying, where TORCH_TPU_TEST_JOURNAL asks."""
    import os
    import tempfile

    from torch_tpu.testing import journal

    config.pluginmanager.register(journal, "torch_tpu_journal")

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    for variable, prefix in (
        ("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "torch_tpu_cache_"),
        ("TORCHINDUCTOR_CACHE_DIR", "torchinductor_"),
    ):
        os.environ.setdefault(variable, tempfile.mkdtemp(prefix=prefix))
        if worker:
            os.environ[variable] = os.path.join(os.environ[variable], worker)
    if "tpu_device" in (config.option.markexpr or ""):
        _children_off_the_chip()


def _children_off_the_chip():
    """On a TPU one process at a time can hold the chip, and this one does (the device part of the suite, `-m
    tpu_device`): the processes tests start (to check environment variables, autoload) run on the XLA CPU
    platform instead. Elsewhere nothing changes, and JAX is not initialised before a test asks for it."""
    import os

    from torch_tpu.runtime import platform

    if platform.platform() == "tpu":
        os.environ["TORCH_TPU_PLATFORM"] = "cpu"
        os.environ["JAX_PLATFORMS"] = "cpu"
