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
