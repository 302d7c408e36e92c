"""Entry point of the `torch.backends` group: `import torch` calls `load()`, which registers the backend."""

import sys


def load() -> None:
    import torch_tpu

    if not torch_tpu._SUPPORTED:
        # An unsupported torch or JAX (torch_tpu warned): forget the half-imported package so that an explicit
        # `import torch_tpu` runs its check again and raises, instead of handing out a module without a device.
        for name in [name for name in sys.modules if name == "torch_tpu" or name.startswith("torch_tpu.")]:
            del sys.modules[name]
