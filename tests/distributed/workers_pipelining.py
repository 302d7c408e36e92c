"""What each rank runs in tests/distributed/test_pipelining.py (launched by `launch.py`); every check raises on
failure. Ranks run different programs (MPMD): each is one stage of a 2-stage pipeline
(`torch.distributed.pipelining`) over tpu send/recv, equal to the whole model in one CPU process; and ranks whose
calls diverge fail at once on both ranks with an error naming each side."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from workers import _TIMEOUT, _input

_MICROBATCHES, _STEPS = 4, 2
_TOLERANCE = {"rtol": 1e-12, "atol": 1e-14}  # float64; the microbatches' gradients add in another order


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).double()


def _stages(model: nn.Sequential) -> list[nn.Sequential]:
    return [model[:2], model[2:]]


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).pow(2).sum()


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _input(200 + step, (2 * _MICROBATCHES, 4)), _input(300 + step, (2 * _MICROBATCHES, 4))


def _reference() -> tuple[list[list[float]], list[nn.Sequential]]:
    """One process: each step's microbatch losses and the stages' parameters after the SGD steps."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(_STEPS):
        x, y = _data(step)
        parts = [_loss(model(xs), ys) for xs, ys in zip(x.chunk(_MICROBATCHES), y.chunk(_MICROBATCHES), strict=True)]
        sum(parts).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([part.item() for part in parts])
    return losses, _stages(model)


def _pipeline(schedule_class: type, compiled: bool) -> None:
    """This rank's stage trained `_STEPS` steps under `schedule_class`, equal to the one process."""
    rank = dist.get_rank()
    module = copy.deepcopy(_stages(_model())[rank]).to("tpu")
    run = torch.compile(module, backend="tpu") if compiled else module  # each rank compiles its own graphs
    stage = PipelineStage(run, rank, 2, torch.device("tpu"))
    schedule = schedule_class(stage, n_microbatches=_MICROBATCHES, loss_fn=_loss, scale_grads=False)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    expected_losses, expected_stages = _reference()
    name = f"{schedule_class.__name__}{' compiled' if compiled else ''}"
    for step in range(_STEPS):
        x, y = _data(step)
        if rank == 0:
            schedule.step(x.to("tpu"))
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y.to("tpu"), losses=losses)
            got = torch.tensor([loss.item() for loss in losses], dtype=torch.float64)
            want = torch.tensor(expected_losses[step], dtype=torch.float64)
            torch.testing.assert_close(got, want, **_TOLERANCE, msg=lambda m, s=step: f"{name} losses {s}: {m}")
        optimizer.step()
        optimizer.zero_grad()
    for (key, got), want in zip(module.state_dict().items(), expected_stages[rank].state_dict().values(), strict=True):
        torch.testing.assert_close(got.cpu(), want, **_TOLERANCE, msg=lambda m, k=key: f"{name} {k}: {m}")
    print(f"pipeline {name}: equal to one process", flush=True)


def _raises(what: str, fn, *needles: str) -> None:
    try:
        fn()
    except Exception as error:  # the class differs per check; the message is what is checked
        message = str(error)
    else:
        raise AssertionError(f"{what}: no error")
    missing = [needle for needle in needles if needle not in message]
    assert not missing, f"{what}: {missing} not in {message}"
    print(f"divergence {what}: {message[:160]}", flush=True)


def _divergence_checks() -> None:
    """Mismatched calls across the two ranks: each raises on both at once, naming both sides; the ranks then
    keep working."""
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    tensor = torch.arange(3.0, dtype=torch.float64, device="tpu")
    _raises(
        "both send",
        lambda: dist.send(tensor, peer),
        "send/recv mismatch",
        f"rank {rank} makes send float64[3] from rank {rank} to rank {peer}",
        f"its peer rank {peer} makes send float64[3] from rank {peer} to rank {rank}",
    )
    received = torch.zeros(3 + rank, dtype=torch.float64, device="tpu")
    _raises(
        "shapes",
        lambda: dist.send(tensor, 1) if rank == 0 else dist.recv(received, 0),
        "send/recv mismatch",
        "send float64[3] from rank 0 to rank 1",
        "recv float64[4] from rank 0 to rank 1",
    )
    assert not received.cpu().any(), "a mismatched recv wrote its tensor"
    # the same dtype and count in another shape is no mismatch: a send moves its elements (as gloo's and NCCL's)
    scalar = torch.tensor(2.5, dtype=torch.float64, device="tpu")
    flat = torch.zeros(1, dtype=torch.float64, device="tpu")
    if rank == 0:
        dist.send(scalar, 1)
    else:
        dist.recv(flat, 0)
        assert flat.cpu().tolist() == [2.5], flat
    # stage 0 all-reduces where stage 1 all-gathers (c10d, then functional collectives in compiled graphs)
    values = torch.ones(4, device="tpu")
    _raises(
        "collectives",
        lambda: dist.all_reduce(values) if rank == 0 else dist.all_gather_into_tensor(torch.zeros(8).to("tpu"), values),
        "collective mismatch",
        "rank 0 all_reduce",
        "rank 1 all_gather",
    )
    compiled = torch.compile(
        (lambda t: funcol.all_reduce(t, "sum", dist.group.WORLD) * 2)
        if rank == 0
        else (lambda t: funcol.all_gather_tensor(t, 0, dist.group.WORLD) * 2),
        backend="tpu",
        fullgraph=True,
    )
    _raises("compiled graphs", lambda: compiled(values), "ranks differ on SPMD program", "all_reduce(", "all_gather")
    # what pairs up still works afterwards
    received = torch.zeros(3, dtype=torch.float64, device="tpu")
    if rank == 0:
        dist.send(tensor, 1)
    else:
        dist.recv(received, 0)
        assert torch.equal(received.cpu(), torch.arange(3.0, dtype=torch.float64)), received


def pipelining() -> None:
    """GPipe, then 1F1B with each rank's stage compiled, then the divergence checks, in one launch."""
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    _pipeline(ScheduleGPipe, compiled=False)
    _pipeline(Schedule1F1B, compiled=True)  # its batches list sends first on both ranks (point_to_point.py)
    _divergence_checks()
    dist.barrier()
    print("pipelining checks passed", os.environ["RANK"], flush=True)
    dist.destroy_process_group()
