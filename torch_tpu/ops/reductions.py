"""Lowerings: reductions."""
