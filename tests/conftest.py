import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    """Tests compile cold: a private, per-run persistent cache, and PyTorch's cache directory (AOTAutograd's
    entries) too (tests of the cache set their own)."""
    import os
    import tempfile

    os.environ.setdefault("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", tempfile.mkdtemp(prefix="torch_tpu_cache_"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor_"))
