"""What each rank runs in the distributed tests (launched by `launch.py`); every check raises on failure.

Every rank knows every rank's input (`_input(rank, ...)` is deterministic), so each result is compared with
the same computation done locally on CPU PyTorch.
"""

from __future__ import annotations

import datetime
import os

import jax
import torch
import torch.distributed as dist
from torch import nn

# A failing rank makes its peers fail within this (torch's default is 30 minutes).
_TIMEOUT = datetime.timedelta(seconds=60)


def _input(rank: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-50, 50, shape, generator=generator, dtype=torch.int64).to(dtype)


def _equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if actual.dtype != expected.dtype or not torch.equal(actual.cpu(), expected):
        raise AssertionError(f"{what}: got {actual.cpu()} expected {expected}")


def rank_devices() -> None:
    """The three rank > 0 defects: device choice, cache keys, deserialising onto every device."""
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch_tpu.runtime import persistent as cache
    from torch_tpu.runtime import platform

    assert jax.process_count() == world and jax.process_index() == rank, (jax.process_count(), jax.process_index())
    device = platform.device()
    assert device.process_index == rank and device in jax.local_devices(), (device, jax.local_devices())
    assert len(jax.devices()) == world and platform.devices() == (device,), (jax.devices(), platform.devices())
    # Rank 0 compiles (and stores) first; rank 1 must compile its own executable, not load rank 0's.
    shape = (3, 5)
    for turn in range(world):
        if turn == rank:
            before = cache.stats.misses
            value = torch.sin(torch.arange(15, dtype=torch.float64).reshape(shape).to("tpu") + rank)
            expected = torch.sin(torch.arange(15, dtype=torch.float64).reshape(shape) + rank)
            torch.testing.assert_close(value.cpu(), expected, rtol=1e-15, atol=1e-15)
            assert cache.stats.misses > before, "rank loaded another rank's executable"
        dist.barrier()
    assert f"processes={world}" in cache.environment() and f"device_id={device.id}" in cache.environment()
    # An executable read back from disk runs on this process's device.
    local = jax.device_put(jax.numpy.arange(6.0) + rank, device)
    compiled, from_disk, key = cache.compile_keyed(jax.jit(lambda x: x * 2 + 1).lower(local))
    loaded = cache.load(key)
    assert loaded is not None, "entry not found"
    assert loaded(local).tolist() == [2.0 * (i + rank) + 1 for i in range(6)]
    dist.destroy_process_group()


def _reference(op: dist.ReduceOp, values: list[torch.Tensor]) -> torch.Tensor:
    result = values[0].clone()
    for value in values[1:]:
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            result = result | value if result.dtype == torch.bool else result + value
        elif op == dist.ReduceOp.PRODUCT:
            result = result & value if result.dtype == torch.bool else result * value
        elif op == dist.ReduceOp.MAX:
            result = torch.maximum(result, value)
        elif op == dist.ReduceOp.MIN:
            result = torch.minimum(result, value)
        elif op == dist.ReduceOp.BAND:
            result = result & value
        elif op == dist.ReduceOp.BOR:
            result = result | value
        elif op == dist.ReduceOp.BXOR:
            result = result ^ value
    return result / len(values) if op == dist.ReduceOp.AVG else result


_FLOAT_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX, dist.ReduceOp.MIN)
_INT_OPS = (*_FLOAT_OPS[:1], *_FLOAT_OPS[2:], dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)


def _all_reduce_checks(rank: int, world: int) -> None:
    shape = (2, 3)
    for dtype, ops in ((torch.float32, _FLOAT_OPS), (torch.float64, _FLOAT_OPS), (torch.int64, _INT_OPS)):
        for op in ops:
            values = [_input(r, shape, dtype) for r in range(world)]
            tensor = values[rank].to("tpu")
            dist.all_reduce(tensor, op=op)
            _equal(tensor, _reference(op, values), f"all_reduce {op} {dtype}")
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT):
        values = [_input(r, (5,), torch.bool) for r in range(world)]
        tensor = values[rank].to("tpu")
        dist.all_reduce(tensor, op=op)
        _equal(tensor, _reference(op, values), f"all_reduce {op} bool")
    # 0-d tensors.
    values = [_input(r, (), torch.float64) for r in range(world)]
    tensor = values[rank].to("tpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    _equal(tensor, _reference(dist.ReduceOp.MIN, values), "all_reduce of a 0-d tensor")
    outputs = [torch.empty((), dtype=torch.float64, device="tpu") for _ in range(world)]
    dist.all_gather(outputs, values[rank].to("tpu"))
    _equal(torch.stack(outputs), torch.stack(values), "all_gather of 0-d tensors")
    # Into a non-contiguous view: the column lands in the base, the rest of the base is untouched.
    base = _input(rank, (3, 4), torch.float32)
    on_tpu = base.to("tpu")
    dist.all_reduce(on_tpu[:, 1])
    expected = base.clone()
    expected[:, 1] = _reference(dist.ReduceOp.SUM, [_input(r, (3, 4), torch.float32)[:, 1] for r in range(world)])
    _equal(on_tpu, expected, "all_reduce into a view")
    # async_op: a completed Work and its future.
    tensor = _input(rank, (4,), torch.float64).to("tpu")
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    (result,) = work.get_future().wait()
    expected = _reference(dist.ReduceOp.SUM, [_input(r, (4,), torch.float64) for r in range(world)])
    _equal(tensor, expected, "async all_reduce")
    _equal(result, expected, "async all_reduce future")


def _no_recompiles(world: int) -> None:
    from torch_tpu.distributed import collectives

    tensor = torch.ones(7, device="tpu")
    dist.all_reduce(tensor)
    before = collectives.compiles
    for _ in range(3):
        dist.all_reduce(tensor)
    assert collectives.compiles == before, "a steady-state all_reduce built a new program"
    _equal(tensor, torch.full((7,), float(world**4)), "repeated all_reduce")


def _gather_scatter_checks(rank: int, world: int) -> None:
    for dtype in (torch.float32, torch.int32, torch.bool):
        values = [_input(r, (2, 3), dtype) for r in range(world)]
        outputs = [torch.empty((2, 3), dtype=dtype, device="tpu") for _ in range(world)]
        dist.all_gather(outputs, values[rank].to("tpu"))
        for r in range(world):
            _equal(outputs[r], values[r], f"all_gather {dtype} from rank {r}")
        into = torch.empty((world * 2, 3), dtype=dtype, device="tpu")
        dist.all_gather_into_tensor(into, values[rank].to("tpu"))
        _equal(into, torch.cat(values), f"all_gather_into_tensor {dtype}")
    # reduce_scatter: rank r's input holds a block per rank; rank r gets the reduction of block r.
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        wholes = [_input(r, (world * 2, 3), torch.float64) for r in range(world)]
        output = torch.empty((2, 3), dtype=torch.float64, device="tpu")
        dist.reduce_scatter_tensor(output, wholes[rank].to("tpu"), op=op)
        _equal(output, _reference(op, [w[rank * 2 : rank * 2 + 2] for w in wholes]), f"reduce_scatter_tensor {op}")
        output = torch.empty((2, 3), dtype=torch.float64, device="tpu")
        dist.reduce_scatter(output, list(wholes[rank].to("tpu").chunk(world)), op=op)
        _equal(output, _reference(op, [w[rank * 2 : rank * 2 + 2] for w in wholes]), f"reduce_scatter {op}")
    # broadcast is bit-exact: -0.0 and NaN payloads survive.
    special = torch.tensor([-0.0, float("nan"), float("inf"), 1e-45, -3.5], dtype=torch.float32)
    for root in range(world):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64):
            source = special if dtype == torch.float32 else _input(root, (5,), dtype)
            if dtype == torch.complex64:
                source = torch.complex(_input(root, (5,), torch.float32), _input(root + 7, (5,), torch.float32))
            tensor = (source if rank == root else torch.zeros_like(source)).to("tpu")
            dist.broadcast(tensor, src=root)
            got = tensor.cpu()
            if dtype == torch.float32:
                got, source = got.view(torch.int32), source.view(torch.int32)
            _equal(got, source, f"broadcast {dtype} from {root}")


def _splits(world: int) -> list[list[int]]:
    """Uneven all-to-all splits: rank r sends splits[r][j] rows to rank j."""
    return [[(r + j) % 3 + 1 for j in range(world)] for r in range(world)]


def _all_to_all_checks(rank: int, world: int) -> None:
    values = [_input(r, (world * 2, 3), torch.float64) for r in range(world)]
    output = torch.empty((world * 2, 3), dtype=torch.float64, device="tpu")
    dist.all_to_all_single(output, values[rank].to("tpu"))
    _equal(output, torch.cat([v[rank * 2 : rank * 2 + 2] for v in values]), "all_to_all_single")
    splits = _splits(world)
    values = [_input(r, (sum(splits[r]), 2), torch.int64) for r in range(world)]
    outs = [splits[j][rank] for j in range(world)]
    output = torch.empty((sum(outs), 2), dtype=torch.int64, device="tpu")
    dist.all_to_all_single(output, values[rank].to("tpu"), outs, splits[rank])
    expected = torch.cat([values[j].split(splits[j])[rank] for j in range(world)])
    _equal(output, expected, "all_to_all_single with uneven splits")
    inputs = [_input(rank * world + j, (j + 1, 2), torch.float32) for j in range(world)]
    outputs = [torch.empty((rank + 1, 2), dtype=torch.float32, device="tpu") for _ in range(world)]
    dist.all_to_all(outputs, [t.to("tpu") for t in inputs])
    for j in range(world):
        _equal(outputs[j], _input(j * world + rank, (rank + 1, 2), torch.float32), f"all_to_all from rank {j}")


def _rooted_checks(rank: int, world: int) -> None:
    root = world - 1
    values = [_input(r, (4,), torch.float64) for r in range(world)]
    tensor = values[rank].to("tpu")
    dist.reduce(tensor, dst=root, op=dist.ReduceOp.MAX)
    _equal(tensor, _reference(dist.ReduceOp.MAX, values) if rank == root else values[rank], "reduce")
    outputs = [torch.empty(4, dtype=torch.float64, device="tpu") for _ in range(world)] if rank == root else None
    dist.gather(values[rank].to("tpu"), outputs, dst=root)
    for r in range(world if rank == root else 0):
        _equal(outputs[r], values[r], f"gather from rank {r}")
    parts = [_input(100 + r, (2, 2), torch.int32) for r in range(world)]
    output = torch.empty((2, 2), dtype=torch.int32, device="tpu")
    dist.scatter(output, [p.to("tpu") for p in parts] if rank == root else None, src=root)
    _equal(output, parts[rank], "scatter")
    message = _input(55, (3, 2), torch.float32)
    if rank == 0:
        dist.send(message.to("tpu"), dst=1)
    elif rank == 1:
        received = torch.zeros((3, 2), dtype=torch.float32, device="tpu")
        dist.recv(received, src=0)
        _equal(received, message, "send/recv")


def _subgroup_checks(rank: int, world: int) -> None:
    values = [_input(r, (3,), torch.float32) for r in range(world)]
    everyone = dist.new_group(list(range(world)))
    tensor = values[rank].to("tpu")
    dist.all_reduce(tensor, group=everyone)
    _equal(tensor, _reference(dist.ReduceOp.SUM, values), "all_reduce on a new_group of every rank")
    last = dist.new_group([world - 1])  # every rank creates it; only its member runs collectives on it
    if rank == world - 1:
        tensor = values[rank].to("tpu")
        dist.all_reduce(tensor, group=last)
        _equal(tensor, values[rank], "all_reduce on a one-rank group")
        output = torch.empty((1, 3), dtype=torch.float32, device="tpu")
        dist.all_gather_into_tensor(output, values[rank].to("tpu"), group=last)
        _equal(output, values[rank][None], "all_gather_into_tensor on a one-rank group")


def _cpu_and_errors(rank: int, world: int) -> None:
    values = [_input(r, (3,), torch.float32) for r in range(world)]
    tensor = values[rank].clone()
    dist.all_reduce(tensor)  # a CPU tensor in a tpu job: gloo
    _equal(tensor, _reference(dist.ReduceOp.SUM, values), "all_reduce of a CPU tensor")
    for op, dtype, message in (
        (dist.ReduceOp.AVG, torch.int64, "ReduceOp.AVG needs a floating dtype"),
        (dist.ReduceOp.BAND, torch.float32, "ReduceOp.BAND needs an integer or bool dtype"),
    ):
        try:
            dist.all_reduce(torch.ones(2, dtype=dtype, device="tpu"), op=op)
        except RuntimeError as error:
            assert message in str(error), error
        else:
            raise AssertionError(f"all_reduce {op} on {dtype} did not raise")


def collectives() -> None:
    """Every collective of this slice on the alias "tpu", exact against a local computation."""
    dist.init_process_group("tpu", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    _all_reduce_checks(rank, world)
    _no_recompiles(world)
    _gather_scatter_checks(rank, world)
    _all_to_all_checks(rank, world)
    _rooted_checks(rank, world)
    _subgroup_checks(rank, world)
    _cpu_and_errors(rank, world)
    dist.barrier()
    dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def _train(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()


def ddp() -> None:
    """DDP on tpu (a group made with no backend named) trains equal to one process on the full batch."""
    dist.init_process_group(timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert "tpu:tpu_dist" in dist.get_backend_config(), dist.get_backend_config()
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(4 * world, 4, generator=generator, dtype=torch.float64)
    targets = torch.randn(4 * world, 2, generator=generator, dtype=torch.float64)
    reference = _model()
    _train(reference, inputs, targets, steps=3)
    mine = slice(4 * rank, 4 * rank + 4)
    for as_view in (False, True):
        model = nn.parallel.DistributedDataParallel(
            _model().to("tpu"), bucket_cap_mb=1e-4, gradient_as_bucket_view=as_view
        )  # several buckets
        _train(model, inputs[mine].to("tpu"), targets[mine].to("tpu"), steps=3)
        for (name, got), expected in zip(model.module.named_parameters(), reference.parameters(), strict=True):
            # The mean over the full batch against the mean of the ranks' means: float64 rounding, not exact.
            message = f"{name} (gradient_as_bucket_view={as_view})"
            torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-12, atol=1e-14, msg=message)
    print("ddp parameters match", os.environ["RANK"], flush=True)
    dist.destroy_process_group()


def init_after_a_tensor() -> None:
    """JAX's multi-process runtime cannot start once its backend exists: a clear error, not a wrong device."""
    torch.ones(2, device="tpu")
    try:
        dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    except RuntimeError as error:
        assert "init_process_group must run before the first tpu tensor" in str(error), error
        print("raised", flush=True)
    else:
        raise AssertionError("init_process_group after a tpu tensor did not raise")


def _store_server_gone() -> bool:
    """Whether MASTER_PORT is free again: no group, store or store server of the last group survives."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        except OSError:
            return False
    return True


def regroup() -> None:
    """A process makes one group after another, as in-process test fixtures and restarts do: each destroyed group
    leaves nothing behind, so the next one's rendezvous meets no stale keys; and no torch function was left holding
    a group as its default argument (torch.distributed.nn's bind `group.WORLD` when first imported, and a tpu op's
    first meta kernel imports them through Dynamo: in the shared launch, during an earlier worker's group)."""
    import gc
    import inspect

    import torch.distributed.nn.functional as functional

    default = inspect.signature(functional.broadcast).parameters["group"].default
    assert default is None, f"torch.distributed.nn.functional.broadcast holds {default} as its default group"
    for backend in ("tpu_dist", "cpu:gloo,tpu:tpu_dist", "tpu"):
        dist.init_process_group(backend, timeout=_TIMEOUT)
        rank, world = dist.get_rank(), dist.get_world_size()
        for device in ("cpu", "tpu"):
            tensor = _input(rank, (3,)).to(device)
            dist.all_reduce(tensor)
            _equal(tensor, _reference(dist.ReduceOp.SUM, [_input(r, (3,)) for r in range(world)]), backend)
        dist.destroy_process_group()
        gc.collect()
        if rank == 0:
            assert _store_server_gone(), f"the {backend} group's store still serves MASTER_PORT after its destruction"
    print("regroup checks passed", flush=True)
