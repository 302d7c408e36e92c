"""Entry point for torchrun: `torchrun ... run_worker.py NAME` runs `workers.NAME()` on each rank."""

import sys

import workers

getattr(workers, sys.argv[1])()
