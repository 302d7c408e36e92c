"""The migration kit behind the `torch-tpu` command: smoke, evaluate, k8s (see docs/kit.md).

One small module per concern so each command can be imported and tested without a shell.
"""
