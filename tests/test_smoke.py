"""The seed article's smoke.py, unmodified, against torch_tpu."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

SMOKE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "seeds" / "smoke.py"


@pytest.mark.skipif(not SMOKE.exists(), reason="../shared/seeds/smoke.py is not beside this checkout")
def test_seed_smoke_eager():
    env = dict(os.environ, EXECUTION_MODE="eager")
    out = subprocess.run([sys.executable, str(SMOKE)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["finite"] is True and report["mode"] == "eager"
    assert report["torch_tpu"] == "0.2.0" and report["torch"] == torch.__version__
    assert report["mean_batch_seconds"] > 0 and report["samples_per_second"] > 0
