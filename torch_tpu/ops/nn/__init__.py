"""Lowerings: neural-network ops, one family per module."""

from torch_tpu.ops.nn import (  # noqa: F401  (imported for their registrations)
    attention,
    conv,
    dropout,
    embedding,
    loss,
    norm,
    optim,
    pool,
    rnn,
    softmax,
    upsample,
)
