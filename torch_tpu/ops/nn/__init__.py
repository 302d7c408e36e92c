"""Lowerings: neural-network ops, one family per module."""
