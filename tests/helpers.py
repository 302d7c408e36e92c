"""What several test files share: the checkout's path, random and meta tensors of a shape, the seed's smoke test,
the equations of a traced program.

Imported as `from tests.helpers import ...` (the checkout is on the path: pyproject.toml's pytest `pythonpath`).
Fixtures live in tests/conftest.py instead (`fresh_dynamo`)."""

import json
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax.extend.core
import pytest
import torch

from torch_tpu.testing.compare import float32_tolerance

ROOT = pathlib.Path(__file__).resolve().parents[1]  # the checkout
SMOKE = ROOT.parent / "shared" / "seeds" / "smoke.py"  # the seed article's smoke test, beside the checkout
needs_smoke = pytest.mark.skipif(not SMOKE.exists(), reason="../shared/seeds/smoke.py is not beside this checkout")


def cache_requests() -> int:
    """The executable cache's requests so far: how many eager programs (ops, clusters) have been called."""
    return torch.tpu._get_cache_stats()["num_cache_reqs"]


def small_mlp(width: int) -> tuple[torch.nn.Module, list]:
    """A 2-layer MLP (13 -> `width` -> 7) and 4 batches of 11: a width no other test uses makes every program of
    its training step compile in the test that picks it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, width), torch.nn.Tanh(), torch.nn.Linear(width, 7))
    data = [(torch.randn(11, 13), torch.randint(0, 7, (11,))) for _ in range(4)]
    return model, data


def train_steps(model: torch.nn.Module, data: list, device: str) -> tuple[list[float], list[int]]:
    """AdamW steps of `model` on `device`, a batch each: the losses, and after each step the executable cache's
    insert count (what the step compiled)."""
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses, inserts = [], []
    for inputs, target in data:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs.to(device)), target.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        inserts.append(torch.tpu._get_cache_stats()["num_inserts"])
    return losses, inserts


def tanh_mlp() -> torch.nn.Module:
    """A two-layer MLP (8 -> 16 -> 3), the same weights every call: an optimizer step's four parameters."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def adamw_losses(device: str, steps: int) -> list[float]:
    """The losses of `steps` AdamW steps of `tanh_mlp` on `device`, a fixed batch."""
    model = tanh_mlp().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)).to(device)
    losses = []
    for _ in range(steps):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def mse_backward(model: torch.nn.Module, device: str, step: int) -> None:
    """`model`'s gradients for the mean squared error on step `step`'s batch (the same on every device)."""
    generator = torch.Generator().manual_seed(step)
    x, y = torch.randn(5, 8, generator=generator), torch.randn(5, 3, generator=generator)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()


class HeldBack:
    """A program compiling, as its `persistent.Soon`, but not done until `release` is set: the stand-in before it
    serves the calls until then."""

    def __init__(self, soon: Any, release: threading.Event) -> None:
        self._soon, self._release = soon, release

    def done(self) -> bool:
        return self._release.is_set() and self._soon.done()

    def __call__(self) -> Any:
        assert self._release.wait(60)
        return self._soon()


def assert_steps_agree(
    tpu_model: torch.nn.Module,
    cpu_model: torch.nn.Module,
    tpu_opt: torch.optim.Optimizer,
    cpu_opt: torch.optim.Optimizer,
) -> None:
    """The parameters and optimizer state after the same steps on tpu and on CPU agree (float32 rounding)."""
    rtol, atol = float32_tolerance(1e-5, 1e-6)
    for ours, theirs in zip(tpu_model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), rtol=rtol, atol=atol)
    for ours, theirs in zip(tpu_opt.state.values(), cpu_opt.state.values(), strict=True):
        for key, value in theirs.items():
            torch.testing.assert_close(ours[key].cpu(), value, rtol=rtol, atol=atol)


def cross_entropy_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable:
    """A training step as users write it, `step(x, y) -> loss`: zero_grad, a cross-entropy forward, backward and
    `optimizer.step()` (the function the tests compile whole, or run eagerly as the reference)."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def jaxpr_equations(jaxpr: jax.extend.core.Jaxpr) -> Iterator[jax.extend.core.JaxprEqn]:
    """Every equation of `jaxpr`, those of its sub-programs (loop bodies, branches, ...) included."""
    for equation in jaxpr.eqns:
        yield equation
        for inner in jax.extend.core.jaxprs_in_params(equation.params):
            yield from jaxpr_equations(inner)


def random_tensor(
    *shape: int,
    dtype: torch.dtype = torch.float32,
    grad: bool = False,
    seed: int | None = None,
    low: float = -5,
    high: float = 5,
    uniform: bool = False,
) -> torch.Tensor:
    """A random CPU tensor of `shape` and `dtype`, the input of a test comparing an op on `tpu` with CPU.

    bool: fair coin flips. Integers: uniform in [low, high] (low raised to the dtype's minimum). Floating and
    complex: standard normal floats (with `uniform`: uniform in [low, high)) cast to `dtype`, requiring grad with
    `grad`. Drawn from PyTorch's global generator (seeded per test by tests/conftest.py), or with `seed` from a
    generator of its own, so that a call makes the same tensor whatever ran before it."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        low = max(int(low), torch.iinfo(dtype).min)
        return torch.randint(low, int(high) + 1, shape, generator=generator, dtype=dtype)
    if uniform:
        x = torch.rand(shape, generator=generator) * (high - low) + low
    else:
        x = torch.randn(shape, generator=generator)
    return x.to(dtype).requires_grad_(grad)


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An empty tensor on the meta device: shape and dtype only (what a routing decision reads)."""
    return torch.empty(shape, dtype=dtype, device="meta")


def run_smoke(mode: str) -> dict:
    """Run the seed's smoke.py with EXECUTION_MODE=`mode` in a fresh process; its report (the last line's JSON)."""
    env = dict(os.environ, EXECUTION_MODE=mode)
    out = subprocess.run([sys.executable, str(SMOKE)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["finite"] is True and report["mode"] == mode
    return report
