"""Entry point for torchrun: `torchrun ... run_worker.py NAME` runs `workers.NAME()` (or `module.NAME()`) per rank."""

import importlib
import sys

module, _, function = sys.argv[1].rpartition(".")
getattr(importlib.import_module(module or "workers"), function)()
