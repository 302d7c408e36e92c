"""The device parts of the protocol, run in device_stages.py's child process: compatibility, correctness against a
catalogue, training with checkpoint/resume. Each returns evidence (plain dicts); evaluate.py turns it into gates.

The precision policy is declared here, before any run, with the reason for each number, and copied into the
report. Tolerances are per dtype and per kind of quantity; they are never adjusted after seeing a result.
"""

from __future__ import annotations

import math
import pathlib
import time
import traceback
from typing import Any

import torch

from torch_tpu.kit import metrics as run_metrics
from torch_tpu.kit.workload import Shape, Workload, to_device

HELD_OUT_SEED = 10_000

# (rtol, atol) per dtype. Per-op tolerances of torch_tpu.testing.compare are the base; a model composes ~10 ops
# (outputs), the backward chain is twice as deep with batch reductions (gradients), and N optimizer steps let
# differences compound (loss curve). bf16 starts from its unit roundoff 2**-8 ~ 3.9e-3.
PRECISION_POLICY: dict[str, dict[str, Any]] = {
    "float32": {
        "outputs": (1e-4, 1e-5),
        "gradients": (1e-3, 1e-5),
        "loss": (1e-3, 1e-5),
        "why": "fp32 per-op rtol 1.3e-5 x ~10 composed ops; backward doubles the depth and sums over the batch; "
        "AdamW's normalised update amplifies tiny gradient differences across steps",
    },
    "bfloat16": {
        "outputs": (5e-2, 5e-2),
        "gradients": (1e-1, 1e-1),
        "loss": (5e-2, 5e-2),
        "why": "bf16 unit roundoff 3.9e-3; XLA may keep fused intermediates in fp32 (allow_excess_precision) while "
        "the CPU reference rounds after every op, so a few ulps per layer are expected",
    },
    "float16": {
        "outputs": (1e-2, 1e-2),
        "gradients": (5e-2, 5e-2),
        "loss": (1e-2, 1e-2),
        "why": "fp16 unit roundoff 4.9e-4, same composition argument as bf16",
    },
}


def policy(dtype: str) -> dict[str, Any]:
    if dtype not in PRECISION_POLICY:
        raise ValueError(f"no precision policy for dtype {dtype}; declare one in PRECISION_POLICY")
    return PRECISION_POLICY[dtype]


def _error(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
        "traceback": "".join(traceback.format_exception(exc))[-2000:],
    }


def compare(actual: Any, expected: Any, tol: tuple[float, float]) -> dict[str, Any]:
    """Max abs/rel error of tensors (or lists of tensors) and whether every one is within (rtol, atol)."""
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    pairs = list(zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected), strict=True))
    for a, e in pairs:
        a, e = a.detach().cpu().double(), e.detach().cpu().double()
        if not torch.isfinite(a).all():
            ok = False
            worst_abs = worst_rel = math.inf
            continue
        diff = (a - e).abs()
        worst_abs = max(worst_abs, float(diff.max()) if diff.numel() else 0.0)
        worst_rel = max(worst_rel, float((diff / e.abs().clamp_min(1e-12)).max()) if diff.numel() else 0.0)
        ok = ok and bool((diff <= tol[1] + tol[0] * e.abs()).all())
    return {
        "max_abs_error": worst_abs,
        "max_rel_error": worst_rel,
        "rtol": tol[0],
        "atol": tol[1],
        "tensors": len(pairs),
        "passed": ok,
    }


def forward_backward(workload: Workload, shape: Shape, device: str, compiled: bool, seed: int = 0) -> dict[str, Any]:
    """One forward and backward of a fresh model; returns output, loss and parameter gradients on CPU."""
    model = workload.make_model(seed).to(device=device, dtype=shape.torch_dtype)
    inputs, target = workload.make_batch(shape, seed + 1)
    inputs, target = to_device(inputs, device, shape.torch_dtype), to_device(target, device)
    runner = torch.compile(model, backend="tpu", dynamic=False) if compiled else model
    output = runner(inputs)
    loss = workload.loss(output, target)
    loss.backward()
    return {
        "output": output.detach().cpu(),
        "loss": loss.detach().cpu(),
        "grads": [
            p.grad.detach().cpu() if p.grad is not None else torch.zeros(p.shape, dtype=p.dtype)
            for p in model.parameters()
        ],
    }


def correctness(workload: Workload, reference: str, modes: list[str]) -> list[dict[str, Any]]:
    """Outputs and gradients, tpu vs reference, for each dtype of the catalogue (first shape with that dtype)."""
    results = []
    seen: set[str] = set()
    for shape in workload.shapes:
        if shape.dtype in seen:
            continue
        seen.add(shape.dtype)
        tol = policy(shape.dtype)
        expected = forward_backward(workload, shape, reference, compiled=False)
        for mode in modes:
            entry: dict[str, Any] = {"shape": shape.as_dict(), "mode": mode}
            try:
                actual = forward_backward(workload, shape, "tpu", compiled=mode == "compiled")
                entry["outputs"] = compare(actual["output"], expected["output"], tol["outputs"])
                entry["loss"] = compare(actual["loss"], expected["loss"], tol["outputs"])
                entry["gradients"] = compare(actual["grads"], expected["grads"], tol["gradients"])
                entry["passed"] = all(entry[k]["passed"] for k in ("outputs", "loss", "gradients"))
            except Exception as exc:  # a model that fails on tpu is evidence, not a crash of the kit
                entry.update(passed=False, error=_error(exc))
            results.append(entry)
    return results


def _step(
    model: torch.nn.Module,
    runner: Any,
    optimizer: torch.optim.Optimizer,
    workload: Workload,
    batch: tuple[Any, torch.Tensor],
) -> float:
    optimizer.zero_grad()
    loss = workload.loss(runner(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    return float(loss.detach().cpu())


def train(
    workload: Workload,
    device: str,
    mode: str,
    steps: int,
    checkpoint_dir: pathlib.Path | None = None,
    checkpoint_at: int | None = None,
) -> dict[str, Any]:
    """`steps` training steps; per-step loss, the first failed step (exception or non-finite loss), quality.

    With `checkpoint_dir`, model and optimizer state are saved after step `checkpoint_at`, then restored into a
    fresh model and optimizer which runs the next step: its loss must equal the uninterrupted run's.
    """
    shape = workload.shapes[0]
    model = workload.make_model(0).to(device=device, dtype=shape.torch_dtype)
    runner = torch.compile(model, backend="tpu", dynamic=False) if mode == "compiled" else model
    optimizer = workload.optimizer(model)
    batches = [to_device(workload.make_batch(shape, 100 + i), device, shape.torch_dtype) for i in range(steps)]
    losses: list[float] = []
    failed: dict[str, Any] | None = None
    start = time.perf_counter()
    checkpoint: pathlib.Path | None = None
    observed = device.startswith("tpu")  # the run the metrics endpoint reports (not the reference's)
    for index, batch in enumerate(batches):
        step_start = time.perf_counter()
        try:
            loss = _step(model, runner, optimizer, workload, batch)
        except Exception as exc:
            failed = {"step": index, **_error(exc)}
            break
        losses.append(loss)
        if observed:
            run_metrics.progress(time.perf_counter() - step_start, shape.batch, loss)
        if not math.isfinite(loss):
            failed = {
                "step": index,
                "type": "NonFiniteLoss",
                "message": f"loss is {loss} at step {index}",
                "traceback": "",
            }
            break
        if checkpoint_dir is not None and index + 1 == checkpoint_at:
            checkpoint = checkpoint_dir / "checkpoint.pt"
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": index + 1}, checkpoint
            )
            if observed:
                run_metrics.checkpoint()
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "device": device,
        "mode": mode,
        "shape": shape.as_dict(),
        "losses": losses,
        "failed_step": failed,
        "seconds": seconds,
    }
    if failed is None:
        with torch.no_grad():
            inputs, target = to_device(workload.make_batch(shape, HELD_OUT_SEED), device, shape.torch_dtype)
            result["quality"] = workload.metric(model(inputs), target)
        result["meets_contract"] = workload.meets_contract(result["quality"])
        if observed:
            run_metrics.quality(result["quality"], workload.quality_target, result["meets_contract"])
    else:
        result["quality"], result["meets_contract"] = None, False
    if checkpoint is not None and checkpoint_at is not None and len(losses) > checkpoint_at:
        result["resume"] = resume(workload, device, mode, checkpoint, batches[checkpoint_at], losses[checkpoint_at])
    return result


def resume(
    workload: Workload,
    device: str,
    mode: str,
    checkpoint: pathlib.Path,
    batch: tuple[Any, torch.Tensor],
    expected_loss: float,
) -> dict[str, Any]:
    """Restore from `checkpoint` into fresh objects, run one step, compare with the uninterrupted loss (exactly:
    same device, program and inputs must give the same bits, so any difference is state that was not restored)."""
    shape = workload.shapes[0]
    try:
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        model = workload.make_model(1).to(device=device, dtype=shape.torch_dtype)  # other seed: must be overwritten
        model.load_state_dict(state["model"])
        runner = torch.compile(model, backend="tpu", dynamic=False) if mode == "compiled" else model
        optimizer = workload.optimizer(model)
        optimizer.load_state_dict(state["optimizer"])
        loss = _step(model, runner, optimizer, workload, batch)
    except Exception as exc:
        return {"passed": False, "error": _error(exc), "checkpoint_bytes": _size(checkpoint)}
    return {
        "resumed_after_step": state["step"],
        "expected_loss": expected_loss,
        "resumed_loss": loss,
        "abs_difference": abs(loss - expected_loss),
        "passed": loss == expected_loss,
        "checkpoint_bytes": _size(checkpoint),
    }


def _size(path: pathlib.Path) -> int:
    return path.stat().st_size if path.exists() else 0


def shape_catalogue(workload: Workload) -> list[dict[str, Any]]:
    """Per shape: compile count and compile time on first use, and whether a repeat call recompiles.

    One compiled model per dtype sees every shape of that dtype in turn, as a real service would; dynamic=False
    makes each new shape an explicit compile, which is what the catalogue is meant to expose.
    """
    from torch._dynamo.utils import counters

    results = []
    compiled: dict[str, Any] = {}
    for shape in workload.shapes:
        entry: dict[str, Any] = {"shape": shape.as_dict(), "label": shape.label()}
        try:
            if shape.dtype not in compiled:
                model = workload.make_model(0).to(device="tpu", dtype=shape.torch_dtype).eval()
                compiled[shape.dtype] = torch.compile(model, backend="tpu", dynamic=False)
            runner = compiled[shape.dtype]
            inputs, _ = workload.make_batch(shape, 7)
            inputs = to_device(inputs, "tpu", shape.torch_dtype)
            with torch.inference_mode():
                graphs, executables = counters["stats"]["unique_graphs"], _executables()
                start = time.perf_counter()
                runner(inputs)
                torch.accelerator.synchronize()
                first = time.perf_counter() - start
                graphs_first, executables_first = counters["stats"]["unique_graphs"] - graphs, _executables()
                start = time.perf_counter()
                runner(inputs)
                torch.accelerator.synchronize()
                repeat = time.perf_counter() - start
                graphs_repeat = counters["stats"]["unique_graphs"] - graphs - graphs_first
            entry.update(
                compiles=graphs_first,
                new_executables=executables_first - executables,
                compile_seconds=max(first - repeat, 0.0),
                first_call_seconds=first,
                repeat_call_seconds=repeat,
                recompiled_on_repeat=graphs_repeat > 0,
                passed=graphs_repeat == 0,
            )
        except Exception as exc:
            entry.update(passed=False, error=_error(exc))
        results.append(entry)
    return results


def _executables() -> int:
    return int(torch.tpu._get_cache_stats()["num_inserts"])
