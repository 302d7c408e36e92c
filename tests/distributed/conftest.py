import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # launch.py, workers.py

import launch  # noqa: E402  (from the directory just put on the path)


@pytest.fixture(scope="session", autouse=True)
def shared_compile_cache(tmp_path_factory: pytest.TempPathFactory):
    """One persistent compile cache for every job the session launches (removed with pytest's temporary
    directories); a test that must start cold passes its own TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT."""
    os.environ[launch.SHARED_CACHE] = str(tmp_path_factory.mktemp("tpu_dist_cache"))
    yield
    os.environ.pop(launch.SHARED_CACHE, None)
