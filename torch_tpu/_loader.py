"""Entry point of the `torch.backends` group: `import torch` calls `load()`, which registers the backend."""

import sys


def load() -> None:
    import torch_tpu

    # `import torch_tpu` before torch: torch's autoload runs while torch_tpu is still importing torch, before its
    # version check; that import goes on to check and register, so there is nothing to do here.
    if not getattr(torch_tpu, "_SUPPORTED", True):
        # An unsupported torch or JAX (torch_tpu warned): forget the half-imported package so that an explicit
        # `import torch_tpu` runs its check again and raises, instead of handing out a module without a device.
        for name in [name for name in sys.modules if name == "torch_tpu" or name.startswith("torch_tpu.")]:
            del sys.modules[name]
