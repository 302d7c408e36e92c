"""The device RNG: a (seed, offset) counter turned into a fresh threefry key for each random op.

The key is a run-time input of the op's executable, so random ops never recompile, and
`torch.manual_seed(s)` makes every stream reproducible.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

DEFAULT_SEED = 67280421310721


class _State:
    def __init__(self) -> None:
        self.seed = DEFAULT_SEED
        self.offset = 0
        self.lock = threading.Lock()


_state = _State()


KEY_SHAPE, KEY_DTYPE = (2,), np.uint32
"""A key's shape and dtype, as an executable's RNG input (`next_key`)."""


def _key(seed: int, offset: int) -> np.ndarray:
    mixed = (seed ^ (seed >> 32) ^ ((offset >> 32) * 0x9E3779B9)) & 0xFFFFFFFF
    return np.array([mixed, offset & 0xFFFFFFFF], dtype=KEY_DTYPE)


def next_key(generator: torch.Generator | None = None) -> np.ndarray:
    """A fresh PRNG key: from the device stream, or drawn from a (CPU) generator the user passed."""
    if generator is not None:
        return _key(int(torch.randint(0, 2**62, (1,), generator=generator).item()), 0)
    with _state.lock:
        offset = _state.offset
        _state.offset += 1
    return _key(_state.seed, offset)


def manual_seed(seed: int) -> None:
    """Seed the device stream (called by `torch.manual_seed`)."""
    with _state.lock:
        _state.seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        _state.offset = 0


manual_seed_all = manual_seed


def seed() -> None:
    """Seed the device stream from a non-deterministic source."""
    manual_seed(int.from_bytes(np.random.default_rng().bytes(8), "little"))


seed_all = seed


def initial_seed() -> int:
    return _state.seed


def get_rng_state(device: object = "tpu") -> torch.Tensor:
    """The stream's state as a CPU uint8 tensor (seed and offset, 8 bytes each)."""
    with _state.lock:
        packed = np.array([_state.seed, _state.offset], dtype=np.uint64)
    return torch.from_numpy(packed.view(np.uint8).copy())


def set_rng_state(new_state: torch.Tensor, device: object = "tpu") -> None:
    """Restore a state returned by `get_rng_state`."""
    if new_state.dtype != torch.uint8 or new_state.numel() != 16:
        raise ValueError("torch_tpu: set_rng_state expects the 16-byte uint8 tensor returned by get_rng_state")
    seed, offset = new_state.cpu().numpy().view(np.uint64).tolist()
    with _state.lock:
        _state.seed, _state.offset = int(seed), int(offset)
