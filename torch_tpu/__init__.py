"""torch_tpu: `torch.device("tpu")` as an ordinary PyTorch device, running through JAX/PJRT and XLA.

Importing registers PrivateUse1 as `tpu`, the `torch.tpu` device module and every op kernel. PyTorch imports
this package itself through the `torch.backends` entry point, so `import torch` is enough.
"""

import torch

from torch_tpu.runtime import compat as _compat

__version__ = "0.2.0"
# The public names (tests/test_public_api.py holds them); `torch.tpu` (this package's `tpu`) has its own.
__all__ = [
    "cpu_fallback_enabled",
    "export_stablehlo",
    "from_jax",
    "index_checks",
    "metrics",
    "set_cpu_fallback",
    "set_index_checks",
    "to_jax",
    "tpu",
]


def export_stablehlo(model, example_inputs):  # documented in compile.export
    """The StableHLO text of `model(*example_inputs)`; see `torch_tpu.compile.export.export_stablehlo`."""
    from torch_tpu.compile.export import export_stablehlo as export

    return export(model, example_inputs)


def _register() -> None:
    """Every change to torch (`torch_tpu.wiring` lists them), once per process."""
    if hasattr(torch, "tpu"):
        return
    from torch_tpu import wiring

    wiring.apply()


# The supported torch and JAX releases, checked before anything touches their private APIs (runtime/compat.py);
# an unsupported one found while torch autoloads us registers nothing, and _loader.load() forgets this module.
_SUPPORTED = _compat.supported()
if _SUPPORTED:
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")

    # The device must be named before these import.
    from torch_tpu import metrics as metrics
    from torch_tpu import tpu as tpu
    from torch_tpu.eager.fallback import cpu_fallback_enabled as cpu_fallback_enabled
    from torch_tpu.eager.fallback import set_cpu_fallback as set_cpu_fallback
    from torch_tpu.interop import from_jax as from_jax
    from torch_tpu.interop import to_jax as to_jax
    from torch_tpu.runtime.checks import index_checks as index_checks
    from torch_tpu.runtime.checks import set_index_checks as set_index_checks

    _register()
