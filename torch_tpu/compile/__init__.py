"""Compilation: the `torch.compile` backend "tpu" (`compile.backend`, loaded by Dynamo through the
`torch_dynamo_backends` entry point), its warm-start layers (`compile.warm`) and StableHLO export
(`compile.export`). Nothing here is imported until used (Dynamo is slow to import), except `compile.skips`,
which torch_tpu's import runs without importing Dynamo.
"""
