"""ATen -> JAX lowerings, one module per op family, all in the registry of `ops.registry`.

Importing this package imports every family, so the registry is complete.
"""

from torch_tpu.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    core,
    creation,
    elementwise,
    foreach,
    graph,
    indexing,
    linalg,
    nn,
    random,
    reductions,
    shape,
    sorting,
    special,
    spectral,
)
