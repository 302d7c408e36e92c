"""Helpers for testing `tpu` results against CPU PyTorch."""
