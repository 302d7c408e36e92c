"""The seed article's smoke.py, unmodified, against torch_tpu."""

import pytest
import torch

from tests.helpers import needs_smoke, run_smoke

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


@pytest.mark.children
@needs_smoke
def test_seed_smoke_eager():
    report = run_smoke("eager")
    assert report["torch_tpu"] == "0.2.0" and report["torch"] == torch.__version__
    assert report["mean_batch_seconds"] > 0 and report["samples_per_second"] > 0
