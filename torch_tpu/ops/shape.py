"""Lowerings: shape."""
