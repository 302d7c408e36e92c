"""The device run's first step: what runs where (versions, the device, where torch_tpu is imported from), and one
matmul on the device against CPU. Exits non-zero if torch_tpu is not this checkout's or the matmul is off."""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import jax
import torch

import torch_tpu

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    report = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "torch_tpu": version("torch_tpu"),
        "from": torch_tpu.__file__,
        "jax_devices": [str(d) for d in jax.devices()],
        "tpu_device": torch.tpu.get_device_name(),
        "tpu_count": torch.tpu.device_count(),
        "total_memory_gib": round(torch.tpu.get_device_properties().total_memory / 2**30, 2),
    }
    print(json.dumps(report, indent=1))
    x = torch.randn(256, 256)
    torch.testing.assert_close((x.to("tpu") @ x.to("tpu")).cpu(), x @ x, rtol=1e-4, atol=1e-4)
    print("a 256x256 float32 matmul on the device matches CPU (default precision: full fp32)")
    if not Path(torch_tpu.__file__).resolve().is_relative_to(ROOT):
        print(f"torch_tpu comes from {torch_tpu.__file__}, not this checkout ({ROOT})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
