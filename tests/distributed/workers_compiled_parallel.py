"""What each rank runs in tests/distributed/test_compiled_parallel.py (launched by `launch.py`); every check raises
on failure. One small MLP in float64 trains 3 SGD steps from the same initial weights on CPU in one process (the
full batch) and, on 2 ranks, under tensor parallelism, SimpleFSDP and FSDP2, in eager and under
`torch.compile(backend="tpu")`: every run's parameters and losses must equal the single process's."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

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
    model: nn.Module,
    rows: slice,
    compiled: bool,
    texts: list[str],
    fullgraph: bool = True,
    scale: int = 1,
    data_group: dist.ProcessGroup | None = None,
    parameters: Callable[[nn.Module], dict[str, torch.Tensor]] = _parameters,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """3 steps on this rank's `rows` of each batch; the loss summed over `data_group`'s ranks (each rank's loss is
    its rows'). `scale` multiplies the loss for the backward (FSDP2 averages the ranks' gradients: `scale` =
    ranks); `parameters` gives the trained model's as full tensors."""
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
        dist.all_reduce(total, group=data_group)
    return total.cpu().tolist(), parameters(model)


def _check(what: str, got: tuple, expected: tuple) -> None:
    torch.testing.assert_close(got[0], expected[0], **_TOLERANCE, msg=lambda m: f"{what} losses: {m}")
    for name, value in expected[1].items():
        torch.testing.assert_close(got[1][name], value, **_TOLERANCE, msg=lambda m, n=name: f"{what} {n}: {m}")


def _graph_breaks() -> list[str]:
    """Dynamo's graph-break reasons other than the two PyTorch puts around every optimizer step on purpose
    (`torch.optim.optimizer._use_grad`: `torch._dynamo.graph_break()`)."""
    counters = torch._dynamo.utils.counters["graph_break"]
    return [reason for reason in counters if "Call to `torch._dynamo.graph_break()`" not in reason]


def _compare(
    name: str, build: Callable[[], nn.Module], rows: slice, collectives: dict[int, list[str]], **train: Any
) -> None:
    """`build()` trained in eager and compiled (`_train` with `train`), each equal to the single process (and so
    to each other); the compiled model is one graph per direction with `collectives[i]` in the HLO of the i-th
    program lowered."""
    expected = _reference()
    eager = _train(build(), rows, False, [], **train)
    _check(f"{name} eager", eager, expected)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    texts: list[str] = []
    compiled = _train(build(), rows, True, texts, **train)
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


class _TensorParallelAllGathered(nn.Module):
    """SimpleFSDP over dp of a tensor-parallel parameter: its tp shard, Shard(0) over dp, all-gathered over dp
    (its gradient reduce-scattered back) and seen by the TP module as the DTensor on the tp mesh it was."""

    def __init__(self, tp_mesh: DeviceMesh, placements: tuple) -> None:
        super().__init__()
        self.tp_mesh, self.placements = tp_mesh, placements

    def forward(self, sharded: DTensor) -> DTensor:
        local = sharded.redistribute(placements=(Replicate(),)).to_local(grad_placements=(Partial(),))
        return DTensor.from_local(local, self.tp_mesh, self.placements, run_check=False)


def _tp_in_simple_fsdp(mesh: DeviceMesh) -> nn.Module:
    """The MLP tensor parallel over mesh["tp"] (colwise, rowwise) and SimpleFSDP over mesh["dp"]."""
    model = _tensor_parallel(mesh["tp"])
    for module in (model.up, model.down):
        for name, p in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(p.to_local().detach(), mesh["dp"], [Shard(0)])
            module.register_parameter(name, nn.Parameter(sharded))
            gathered = _TensorParallelAllGathered(mesh["tp"], p.placements)
            parametrize.register_parametrization(module, name, gathered, unsafe=True)
    return model


def _tp_in_simple_fsdp_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's dp shards gathered to its tp shard, and those gathered to the full parameter."""
    named = {}
    for prefix, module in (("up", model.up), ("down", model.down)):
        for name, (gathered,) in module.parametrizations.items():
            tp_shard = getattr(module.parametrizations, name).original.full_tensor()
            whole = DTensor.from_local(tp_shard, gathered.tp_mesh, gathered.placements, run_check=False)
            named[f"{prefix}.{name}"] = whole.full_tensor().detach().cpu()
    return named


def _funcol_2d(mesh: DeviceMesh, rank: int) -> None:
    """A compiled graph with collectives over tp, dp and both (the world) of a 2x2 (dp, tp) mesh, equal to the
    same computation done locally on every rank's input, with every collective in its one program."""
    import torch.distributed._functional_collectives as funcol

    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")

    def step(t: torch.Tensor) -> torch.Tensor:
        summed = funcol.all_reduce(t, "sum", tp)
        gathered = funcol.all_gather_tensor(summed, 0, dp) * torch.cat([t, t])
        scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, tp)
        exchanged = funcol.all_to_all_single(scattered, None, None, dp)
        return funcol.all_gather_tensor(exchanged[:1] + 1, 0, dist.group.WORLD)

    texts: list[str] = []
    compiled = torch.compile(
        step, backend="tpu", fullgraph=True, options={"debug_callback": lambda _, t: texts.append(t)}
    )
    xs = [_input(r, (4, 3)) for r in range(4)]
    tp_of = lambda r: (r - r % 2, r - r % 2 + 1)  # mesh [[0, 1], [2, 3]]: rows dp, columns tp
    dp_of = lambda r: (r % 2, r % 2 + 2)
    summed = [xs[a] + xs[b] for a, b in map(tp_of, range(4))]
    gathered = [
        torch.cat([summed[a], summed[b]]) * torch.cat([xs[r], xs[r]]) for r, (a, b) in enumerate(map(dp_of, range(4)))
    ]
    scattered = [(gathered[a] + gathered[b]).chunk(2)[r % 2] for r, (a, b) in enumerate(map(tp_of, range(4)))]
    exchanged = [torch.cat([scattered[q].chunk(2)[r // 2] for q in dp_of(r)]) for r in range(4)]
    expected = torch.cat([exchanged[r][:1] + 1 for r in range(4)])
    for _ in range(2):  # the second run reuses the executable
        torch.testing.assert_close(compiled(xs[rank].to("tpu")).cpu(), expected, rtol=1e-15, atol=1e-15)
    (text,) = texts
    missing = [
        op for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") if f"stablehlo.{op}" not in text
    ]
    assert not missing, f"the 2-D program lacks {missing}"
    print("2-D funcol: one program over dp, tp and both, equal to a local computation", flush=True)


def _mismatch_2d(mesh: DeviceMesh, rank: int) -> None:
    """Rank 3 compiles another graph over the 2x2 mesh: every rank raises before running it, rank 0 too, though
    rank 3 is in neither of its groups (the program's ranks, the mesh's, all agree)."""
    import torch.distributed._functional_collectives as funcol

    from torch_tpu.distributed.spmd import MismatchError

    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    factor = 3.0 if rank == 3 else 2.0
    differs = torch.compile(
        lambda t: funcol.all_reduce(funcol.all_reduce(t, "sum", tp) * factor, "sum", dp), backend="tpu", fullgraph=True
    )
    try:
        differs(torch.ones(2, device="tpu"))
    except Exception as error:  # Dynamo may wrap the backend's error
        assert isinstance(error, MismatchError) or "MismatchError" in repr(error), repr(error)
        assert "over ranks (0, 1, 2, 3)" in str(error) and "all_reduce(float32[2], sum, tp)" in str(error), error
    else:
        raise AssertionError(f"rank {rank}: a graph that differs on rank 3 ran")
    print("2-D handshake: a graph differing on one rank fails on every rank", flush=True)


def _not_one_mesh(mesh: DeviceMesh, rank: int) -> None:
    """Collectives over a mesh dimension and over a group that is not one of its dimensions: a clear error."""
    import torch.distributed._functional_collectives as funcol

    diagonal = [dist.new_group([0, 3]), dist.new_group([1, 2])][rank in (1, 2)]  # every rank creates both
    tp = mesh.get_group("tp")
    mixed = torch.compile(
        lambda t: funcol.all_reduce(t, "sum", tp) + funcol.all_reduce(t, "sum", diagonal), backend="tpu", fullgraph=True
    )
    try:
        mixed(torch.ones(2, device="tpu"))
    except Exception as error:  # Dynamo wraps the backend's error
        message = str(error)
        assert "not the dimensions of one DeviceMesh" in message, message
        assert str(dist.get_process_group_ranks(diagonal)) in message, message
    else:
        raise AssertionError("a graph over a mesh dimension and a diagonal group did not raise")
    print("groups that are not one mesh's dimensions: a clear error", flush=True)


def mesh_2d() -> None:
    """4 ranks on a (dp=2, tp=2) mesh: compiled graphs whose collectives span both dimensions run as one program."""
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank = dist.get_rank()
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    _funcol_2d(mesh, rank)
    _mismatch_2d(mesh, rank)
    half = slice(rank // 2 * _BATCH // 2, (rank // 2 + 1) * _BATCH // 2)  # each dp rank its half of the batch
    _compare(
        "tp in simple fsdp",
        lambda: _tp_in_simple_fsdp(mesh),
        half,
        {0: ["all_gather", "all_reduce"], 1: ["reduce_scatter"]},
        data_group=mesh.get_group("dp"),
        parameters=_tp_in_simple_fsdp_parameters,
    )
    _not_one_mesh(mesh, rank)
    dist.barrier()
    print("2-D mesh checks passed", os.environ["RANK"], flush=True)
    dist.destroy_process_group()
