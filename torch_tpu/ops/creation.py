"""Lowerings: creation."""
