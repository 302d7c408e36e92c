"""Eager execution: per-op dispatch into cached XLA executables, and the eager modes."""
