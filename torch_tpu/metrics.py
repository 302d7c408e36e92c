"""Counters a user can read to see what the backend did: CPU fallbacks and decompositions, per op."""

from __future__ import annotations

from collections import Counter

cpu_fallbacks: Counter[str] = Counter()
decompositions: Counter[str] = Counter()


def summary() -> dict[str, dict[str, int]]:
    """A snapshot of every counter."""
    return {"cpu_fallbacks": dict(cpu_fallbacks), "decompositions": dict(decompositions)}


def reset() -> None:
    cpu_fallbacks.clear()
    decompositions.clear()
