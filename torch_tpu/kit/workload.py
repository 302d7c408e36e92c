"""What the kit evaluates: a user's workload, declared once and loaded from a `module:callable` spec.

The kit never guesses at a project's structure. A workload is a callable returning a `Workload`: a model factory
(a factory, not a model, because the protocol needs identical fresh copies for the reference device, the tpu
run, cold and warm processes and the checkpoint-resume check), a batch generator keyed by shape and seed (so
every process sees the same data), a loss, a quality metric with its contract, and the catalogue of shapes
the project will really run. Loading errors become `WorkloadError`s with a message a user can act on.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

Batch = tuple[Any, torch.Tensor]  # (model input, target)


class WorkloadError(Exception):
    """The workload spec could not be imported or did not return a valid Workload."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One entry of the shape catalogue: batch size, sequence length (None for non-sequence inputs), dtype."""

    batch: int
    seq: int | None = None
    dtype: str = "float32"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def label(self) -> str:
        return f"b{self.batch}" + (f"-s{self.seq}" if self.seq is not None else "") + f"-{self.dtype}"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Workload:
    """A model, its data, its loss and its quality contract.

    make_model(seed) builds the model on CPU in float32; make_batch(shape, seed) returns (inputs, targets) on CPU;
    loss(output, target) is the training loss; metric(output, target) -> float is the quality metric, and a run
    meets the contract when metric >= quality_target (or <= it when higher_is_better is False). The performance
    contract is optional: a p99 latency SLO per inference batch and a minimum throughput in samples per second.
    """

    name: str
    make_model: Callable[[int], torch.nn.Module]
    make_batch: Callable[[Shape, int], Batch]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    metric: Callable[[Any, torch.Tensor], float]
    quality_target: float
    shapes: list[Shape]
    higher_is_better: bool = True
    metric_name: str = "metric"
    learning_rate: float = 1e-2
    train_steps: int = 20
    latency_slo_ms: float | None = None
    min_samples_per_second: float | None = None
    description: str = ""
    # Tensor parallelism (`--strategy tp`): module path -> "colwise" | "rowwise", as torch's parallelize_module
    # takes it; None: the workload does not declare how to split itself, and tp is refused.
    tp_plan: dict[str, str] | None = None
    warmup_steps: int = 4

    def meets_contract(self, value: float) -> bool:
        if value != value:  # NaN never meets a contract
            return False
        return value >= self.quality_target if self.higher_is_better else value <= self.quality_target

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW with foreach off: the same update on every device, so curves are comparable step by step."""
        return torch.optim.AdamW(model.parameters(), lr=self.learning_rate, foreach=False)

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        """Linear warm-up over `warmup_steps`, then constant: state a resumed run must restore to match."""
        warmup = max(self.warmup_steps, 1)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "metric": self.metric_name,
            "quality_target": self.quality_target,
            "higher_is_better": self.higher_is_better,
            "train_steps": self.train_steps,
            "learning_rate": self.learning_rate,
            "latency_slo_ms": self.latency_slo_ms,
            "min_samples_per_second": self.min_samples_per_second,
            "shapes": [s.as_dict() for s in self.shapes],
        }


def load(spec: str, **overrides: Any) -> Workload:
    """Import `module:callable` (or `path/to/file.py:callable`), call it, check the result is a Workload."""
    if ":" not in spec:
        raise WorkloadError(f"workload spec {spec!r} must look like 'package.module:build'")
    module_name, attr = spec.rsplit(":", 1)
    try:
        if module_name.endswith(".py"):
            module = _import_file(module_name)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's to fix, with the cause shown
        raise WorkloadError(
            f"cannot import workload module {module_name!r}: {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception_only(exc)).strip()
        ) from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise WorkloadError(f"module {module_name!r} has no callable {attr!r}")
    try:
        workload = factory(**overrides)
    except Exception as exc:
        raise WorkloadError(f"workload factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(workload, Workload):
        raise WorkloadError(f"{spec!r} returned {type(workload).__name__}, expected torch_tpu.kit.workload.Workload")
    if not workload.shapes:
        raise WorkloadError(f"{spec!r} declares no shapes; the catalogue needs at least one (batch, seq, dtype)")
    return workload


def _import_file(path: str) -> Any:
    import importlib.util
    import pathlib

    file = pathlib.Path(path)
    if not file.exists():
        raise FileNotFoundError(f"no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def to_device(value: Any, device: str | torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move a batch (tensor or pytree) to `device`; floating tensors are cast to `dtype` when given."""

    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            if dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=dtype)
            return t.to(device)
        return t

    return torch.utils._pytree.tree_map(move, value)
