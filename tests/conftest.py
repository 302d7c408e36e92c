import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    """Tests compile cold: a private, per-run persistent cache, and PyTorch's cache directory (AOTAutograd's
    entries) too (tests of the cache set their own). A pytest-xdist worker inherits the controller's directories
    and takes a subdirectory of each: workers run at once and must not see each other's entries."""
    import os
    import tempfile

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
