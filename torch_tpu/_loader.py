"""Entry point of the `torch.backends` group: `import torch` calls `load()`, which registers the backend."""


def load() -> None:
    import torch_tpu  # noqa: F401  (importing registers the tpu device)
