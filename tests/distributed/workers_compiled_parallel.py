"""What each rank runs in tests/distributed/test_compiled_parallel.py (launched by `launch.py`); every check raises
on failure. One small MLP in float64 trains 3 SGD steps from the same initial weights on CPU in one process (the
full batch) and, on 2 ranks, under tensor parallelism, SimpleFSDP and FSDP2, in eager and under
`torch.compile(backend="tpu")`: every run's parameters and losses must equal the single process's."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from workers import _TIMEOUT, _input

_STEPS, _BATCH = 3, 4
# float64 throughout: the sharded runs sum partial products in another order than one process does.
_TOLERANCE = {"rtol": 1e-12, "atol": 1e-14}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8, dtype=torch.float64)
        self.down = nn.Linear(8, 4, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _initial() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return MLP().state_dict()


def _batches() -> list[torch.Tensor]:
    return [_input(100 + step, (_BATCH, 4)) for step in range(_STEPS)]


def _reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """The single process on CPU: its losses and final parameters."""
    model = MLP()
    model.load_state_dict(_initial())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in _batches():
        loss = model(x).pow(2).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {name: p.detach() for name, p in model.named_parameters()}


def _full(value: torch.Tensor) -> torch.Tensor:
    return (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()


def _parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters by their plain name (a parametrized one under its original's), as full tensors."""
    named = {}
    for name, p in model.named_parameters():
        plain = name.replace("_orig_mod.", "").replace("parametrizations.", "").replace(".original", "")
        named[plain] = _full(p)
    return named


def _train(
    model: nn.Module, rows: slice, compiled: bool, texts: list[str], fullgraph: bool = True, scale: int = 1
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """3 steps on this rank's `rows` of each batch; the loss summed over ranks (each rank's loss is its rows').
    `scale` multiplies the loss for the backward (FSDP2 averages the ranks' gradients: `scale` = ranks)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    forward, step = model, optimizer.step
    if compiled:
        options = {"debug_callback": lambda _, text: texts.append(text)}
        forward = torch.compile(model, backend="tpu", fullgraph=fullgraph, options=options)
        step = torch.compile(optimizer.step, backend="tpu")
    losses = []
    for x in _batches():
        loss = forward(x[rows].to("tpu")).pow(2).sum()
        (loss * scale).backward()
        step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    total = torch.stack(losses)
    if rows != slice(None):  # data parallel: the full batch's loss is the ranks' sum
        dist.all_reduce(total)
    return total.cpu().tolist(), _parameters(model)


def _check(what: str, got: tuple, expected: tuple) -> None:
    torch.testing.assert_close(got[0], expected[0], **_TOLERANCE, msg=lambda m: f"{what} losses: {m}")
    for name, value in expected[1].items():
        torch.testing.assert_close(got[1][name], value, **_TOLERANCE, msg=lambda m, n=name: f"{what} {n}: {m}")


def _graph_breaks() -> list[str]:
    """Dynamo's graph-break reasons other than the two PyTorch puts around every optimizer step on purpose
    (`torch.optim.optimizer._use_grad`: `torch._dynamo.graph_break()`)."""
    counters = torch._dynamo.utils.counters["graph_break"]
    return [reason for reason in counters if "Call to `torch._dynamo.graph_break()`" not in reason]


def _compare(name: str, build: Callable[[], nn.Module], rows: slice, collectives: dict[int, list[str]]) -> None:
    """`build()` trained in eager and compiled, each equal to the single process (and so to each other); the
    compiled model is one graph per direction with `collectives[i]` in the HLO of the i-th program lowered."""
    expected = _reference()
    eager = _train(build(), rows, False, [])
    _check(f"{name} eager", eager, expected)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    texts: list[str] = []
    compiled = _train(build(), rows, True, texts)
    _check(f"{name} compiled", compiled, expected)
    _check(f"{name} compiled against eager", compiled, eager)
    assert not _graph_breaks(), f"{name}: graph breaks {_graph_breaks()}"
    assert len(texts) == len(collectives), f"{name}: {len(texts)} programs lowered, expected {len(collectives)}"
    for index, names in collectives.items():
        missing = [op for op in names if f"stablehlo.{op}" not in texts[index]]
        assert not missing, f"{name}: program {index} lacks {missing}"
    print(f"{name}: compiled and eager equal to one process", flush=True)


def _tensor_parallel(mesh: DeviceMesh) -> nn.Module:
    model = MLP().to("tpu")
    model.load_state_dict(_initial())
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    assert all(isinstance(p, DTensor) for p in model.parameters())
    return model


class _AllGathered(nn.Module):
    """SimpleFSDP's parametrization: the Shard(0) parameter all-gathered for the forward; its gradient, Partial
    on every rank, reduce-scattered back to Shard(0) by autograd."""

    def forward(self, sharded: DTensor) -> torch.Tensor:
        return sharded.redistribute(placements=(Replicate(),)).to_local(grad_placements=(Partial(),))


def _simple_fsdp(mesh: DeviceMesh) -> nn.Module:
    model = MLP().to("tpu")
    model.load_state_dict(_initial())
    for module in (model.up, model.down):
        for name, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
            parametrize.register_parametrization(module, name, _AllGathered(), unsafe=True)
    return model


def _fsdp2(mesh: DeviceMesh, rank: int, world: int) -> None:
    """FSDP2 (`fully_shard` per layer and on the root) under torch.compile: its hooks run eager (Dynamo breaks
    the graph around them), the layers' computation compiled; trains equal to eager FSDP2 and one process."""
    from torch.distributed.fsdp import fully_shard

    def build() -> nn.Module:
        model = MLP().to("tpu")
        model.load_state_dict(_initial())
        for module in (model.up, model.down, model):
            fully_shard(module, mesh=mesh)
        return model

    half = slice(rank * _BATCH // 2, (rank + 1) * _BATCH // 2)
    expected = _reference()
    eager = _train(build(), half, False, [], scale=world)
    _check("fsdp2 eager", eager, expected)
    texts: list[str] = []
    compiled = _train(build(), half, True, texts, fullgraph=False, scale=world)
    _check("fsdp2 compiled", compiled, expected)
    _check("fsdp2 compiled against eager", compiled, eager)
    assert texts, "fsdp2: nothing was compiled"
    print("fsdp2: compiled and eager equal to one process", flush=True)


def compiled_parallel() -> None:
    """Tensor parallel (every rank the full batch), SimpleFSDP and FSDP2 (each rank its half), in one launch."""
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank = dist.get_rank()
    mesh = init_device_mesh("tpu", (dist.get_world_size(),))
    # The forward's program, then the backward's (TP's has none: the input needs no gradient).
    _compare("tensor parallel", lambda: _tensor_parallel(mesh), slice(None), {0: ["all_reduce"], 1: []})
    half = slice(rank * _BATCH // 2, (rank + 1) * _BATCH // 2)
    _compare("simple fsdp", lambda: _simple_fsdp(mesh), half, {0: ["all_gather"], 1: ["reduce_scatter"]})
    _fsdp2(mesh, rank, dist.get_world_size())
    dist.barrier()
    print("compiled parallel checks passed", os.environ["RANK"], flush=True)
    dist.destroy_process_group()
