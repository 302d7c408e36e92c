"""Lowerings: neural-network ops, one family per module."""

from torch_tpu.ops.nn import (  # noqa: F401  (imported for their registrations)
    attention,
    conv,
    dropout,
    embedding,
    grid_sample,
    loss,
    norm,
    optim,
    pool,
    rnn,
    softmax,
    upsample,
)
