"""c10d paths beyond the plain collectives (launched by `launch.py`): device meshes made without a group, a job
mixing CPU (gloo) and tpu tensors, coalesced collectives, results written into views, `split_group`, and the
per-(collective, group, shape, dtype, op) program cache. Every value is compared with a local CPU computation."""

from __future__ import annotations

import datetime
import gc
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from workers import _equal, _input

from torch_tpu import metrics
from torch_tpu.distributed import collectives

_TIMEOUT = datetime.timedelta(seconds=60)


def _total(world: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    result = _input(0, shape, dtype)
    for r in range(1, world):
        result = result + _input(r, shape, dtype)
    return result


def _cpu_mesh_without_a_group(rank: int, world: int) -> None:
    """CPU-only code on a machine with torch_tpu: a CPU mesh is a gloo job, as without an accelerator."""
    mesh = init_device_mesh("cpu", (world,))
    assert dist.get_backend() == "gloo", dist.get_backend_config()
    tensor = _input(rank, (3,))
    dist.all_reduce(tensor, group=mesh.get_group())
    _equal(tensor, _total(world, (3,)), "all_reduce on a CPU mesh")


def _tpu_mesh_without_a_group(rank: int, world: int) -> None:
    """DeviceMesh calls torch.tpu.set_device(LOCAL_RANK) on every rank before any tensor exists."""
    mesh = init_device_mesh("tpu", (world,))
    assert torch.tpu.current_device() == 0 and dist.get_backend() == "tpu_dist", dist.get_backend_config()
    tensor = _input(rank, (3,)).to("tpu")
    dist.all_reduce(tensor, group=mesh.get_group())
    _equal(tensor, _total(world, (3,)), "all_reduce on a tpu mesh")


def _destroy() -> None:
    """Nothing may keep the old group (and its store, which the next group's rendezvous would meet) alive."""
    dist.destroy_process_group()
    gc.collect()


def _cpu_goes_to_gloo(rank: int, world: int) -> None:
    before = collectives.compiles
    tensor = _input(rank, (2, 9))  # a shape no tpu collective uses: an XLA program would have to be built
    dist.all_reduce(tensor)
    _equal(tensor, _total(world, (2, 9)), "all_reduce of a CPU tensor")
    outputs = [torch.empty(4, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(outputs, _input(rank, (4,), torch.int32))
    for r in range(world):
        _equal(outputs[r], _input(r, (4,), torch.int32), f"all_gather of CPU tensors from rank {r}")
    assert collectives.compiles == before, "a CPU tensor's collective ran as an XLA program instead of on gloo"


def _coalesced(rank: int, world: int) -> None:
    tensors = [_input(rank, (3,)).to("tpu"), _input(rank + 10, (2, 2)).to("tpu")]
    dist.all_reduce_coalesced(tensors)
    _equal(tensors[0], _total(world, (3,)), "all_reduce_coalesced [0]")
    expected = sum(_input(r + 10, (2, 2)) for r in range(world))
    _equal(tensors[1], expected, "all_reduce_coalesced [1]")
    # The coalescing manager: each kind of collective, several of them, different dtypes (one reduce op: torch
    # applies the first call's to all).
    floats, ints = _input(rank, (5,)).to("tpu"), _input(rank, (3,), torch.int64).to("tpu")
    with dist._coalescing_manager(async_ops=True) as manager:
        dist.all_reduce(floats, op=dist.ReduceOp.MAX)
        dist.all_reduce(ints, op=dist.ReduceOp.MAX)
    manager.wait()
    for tensor, dtype, shape in ((floats, torch.float64, (5,)), (ints, torch.int64, (3,))):
        maximum = torch.stack([_input(r, shape, dtype) for r in range(world)]).amax(0)
        _equal(tensor, maximum, f"coalesced all_reduce {dtype} MAX")
    gathered = [torch.empty(world * 2, dtype=torch.float32, device="tpu") for _ in range(2)]
    scattered = [torch.empty(2, dtype=torch.float64, device="tpu") for _ in range(2)]
    with dist._coalescing_manager():
        for index, output in enumerate(gathered):
            dist.all_gather_into_tensor(output, _input(rank + 20 * index, (2,), torch.float32).to("tpu"))
    with dist._coalescing_manager():
        for index, output in enumerate(scattered):
            dist.reduce_scatter_tensor(output, _input(rank + 30 * index, (world * 2,)).to("tpu"))
    for index in range(2):
        expected = torch.cat([_input(r + 20 * index, (2,), torch.float32) for r in range(world)])
        _equal(gathered[index], expected, f"coalesced all_gather_into_tensor [{index}]")
        whole = sum(_input(r + 30 * index, (world * 2,)) for r in range(world))
        _equal(scattered[index], whole[rank * 2 : rank * 2 + 2], f"coalesced reduce_scatter_tensor [{index}]")


def _into_views(rank: int, world: int) -> None:
    """Results land in the view and its base; the rest of the base keeps its values."""
    base = _input(rank, (world + 2, 4))
    on_tpu = base.to("tpu")
    dist.all_gather_into_tensor(on_tpu[1 : world + 1], _input(rank + 40, (1, 4)).to("tpu"))
    expected = base.clone()
    expected[1 : world + 1] = torch.cat([_input(r + 40, (1, 4)) for r in range(world)])
    _equal(on_tpu, expected, "all_gather_into_tensor into rows of a base")
    base = _input(rank, (3, 5))
    on_tpu = base.to("tpu")
    root = world - 1
    dist.broadcast(on_tpu.t()[2], src=root)  # a strided column
    expected = base.clone()
    expected[:, 2] = _input(root, (3, 5))[:, 2]
    _equal(on_tpu, expected, "broadcast into a column")
    base = _input(rank, (4, 6))
    on_tpu = base.to("tpu")
    dist.reduce_scatter_tensor(on_tpu[1, ::2], _input(rank + 50, (world * 3,)).to("tpu"))
    expected = base.clone()
    expected[1, ::2] = sum(_input(r + 50, (world * 3,)) for r in range(world))[rank * 3 : rank * 3 + 3]
    _equal(on_tpu, expected, "reduce_scatter_tensor into a strided row")
    outputs = _input(rank, (world, 3)).to("tpu")
    view = outputs.view(-1)
    dist.all_to_all_single(view, _input(rank + 60, (world * 3,)).to("tpu"))
    expected = torch.cat([_input(r + 60, (world * 3,))[rank * 3 : rank * 3 + 3] for r in range(world)])
    _equal(outputs, expected.reshape(world, 3), "all_to_all_single into a flat view of a base")


def _into_views_of_every_collective(rank: int, world: int) -> None:
    """The collectives _into_views leaves out, each writing a strided view of a base whose other elements stay."""
    root = world - 1

    def check(what: str, base: torch.Tensor, on_tpu: torch.Tensor, index: tuple, expected_part: torch.Tensor) -> None:
        expected = base.clone()
        expected[index] = expected_part
        _equal(on_tpu, expected, f"{what} into a view of a base")

    base = _input(rank, (world, 3, 2))
    on_tpu = base.to("tpu")
    dist.all_gather([on_tpu[r, :, 1] for r in range(world)], _input(rank + 70, (3,)).to("tpu"))
    check(
        "all_gather",
        base,
        on_tpu,
        (slice(None), slice(None), 1),
        torch.stack([_input(r + 70, (3,)) for r in range(world)]),
    )
    base = _input(rank, (3, 4))
    on_tpu = base.to("tpu")
    dist.reduce_scatter(on_tpu[:, 2], [_input(rank * world + j, (3,)).to("tpu") for j in range(world)])
    check("reduce_scatter", base, on_tpu, (slice(None), 2), sum(_input(r * world + rank, (3,)) for r in range(world)))
    base = _input(rank, (3, 4))
    on_tpu = base.to("tpu")
    dist.reduce(on_tpu[1, ::2], dst=root)
    part = sum(_input(r, (3, 4))[1, ::2] for r in range(world)) if rank == root else base[1, ::2]
    check("reduce", base, on_tpu, (1, slice(None, None, 2)), part)
    base = _input(rank, (world, 2, 3))
    on_tpu = base.to("tpu")
    dist.gather(
        _input(rank + 80, (2,)).to("tpu"), [on_tpu[r, :, 0] for r in range(world)] if rank == root else None, dst=root
    )
    part = torch.stack([_input(r + 80, (2,)) for r in range(world)]) if rank == root else base[:, :, 0]
    check("gather", base, on_tpu, (slice(None), slice(None), 0), part)
    base = _input(rank, (2, 5))
    on_tpu = base.to("tpu")
    dist.scatter(
        on_tpu[:, 3], [_input(90 + r, (2,)).to("tpu") for r in range(world)] if rank == root else None, src=root
    )
    check("scatter", base, on_tpu, (slice(None), 3), _input(90 + rank, (2,)))
    base = _input(rank, (world, 4))
    on_tpu = base.to("tpu")
    dist.all_to_all(
        [on_tpu[r, 1::2] for r in range(world)], [_input(rank * world + j, (2,)).to("tpu") for j in range(world)]
    )
    check(
        "all_to_all",
        base,
        on_tpu,
        (slice(None), slice(1, None, 2)),
        torch.stack([_input(r * world + rank, (2,)) for r in range(world)]),
    )
    if world >= 2 and rank < 2:
        base = _input(rank, (3, 3))
        on_tpu = base.to("tpu")
        if rank == 0:
            dist.send(_input(99, (3,)).to("tpu"), dst=1)
        else:
            dist.recv(on_tpu[:, 0], src=0)
        check("recv", base, on_tpu, (slice(None), 0), _input(99, (3,)) if rank == 1 else base[:, 0])


def _futures_and_names(rank: int, world: int) -> None:
    """async_op=True: each collective's Work completes and its future holds its outputs as one list of tensors
    (as gloo's and NCCL's do); 2.13's renamed all_gather_single and reduce_scatter_single; all_gather_coalesced."""
    root = world - 1
    tensor = _input(rank, (2,)).to("tpu")
    outputs = [torch.empty(2, dtype=torch.float64, device="tpu") for _ in range(world)]
    whole = torch.empty(world * 2, dtype=torch.float64, device="tpu")
    part = torch.empty(2, dtype=torch.float64, device="tpu")
    # torch < 2.13 has these under their old names
    all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    calls = {
        "broadcast": (lambda: dist.broadcast(tensor, src=root, async_op=True), [tensor]),
        "all_gather": (lambda: dist.all_gather(outputs, tensor, async_op=True), outputs),
        "all_gather_single": (lambda: all_gather_single(whole, tensor, async_op=True), [whole]),
        "reduce_scatter_single": (lambda: reduce_scatter_single(part, whole, async_op=True), [part]),
        "all_to_all_single": (lambda: dist.all_to_all_single(whole, whole.clone(), async_op=True), [whole]),
        "reduce": (lambda: dist.reduce(tensor, dst=root, async_op=True), [tensor]),
    }
    for name, (call, expected) in calls.items():
        work = call()
        work.wait()
        value = work.get_future().wait()
        assert isinstance(value, list) and len(value) == len(expected), (name, value)
        assert all(got is want for got, want in zip(value, expected, strict=True)), f"{name}: the future's tensors"
    start = _input(rank, (2,))
    dist.broadcast(start_tpu := start.to("tpu"), src=root)
    all_gather_single(whole, start_tpu)
    _equal(whole, torch.cat([_input(root, (2,))] * world), "all_gather_single")
    reduce_scatter_single(part, _input(rank, (world * 2,)).to("tpu"))
    _equal(part, sum(_input(r, (world * 2,)) for r in range(world))[rank * 2 : rank * 2 + 2], "reduce_scatter_single")
    lists = [[torch.empty(2, dtype=torch.float64, device="tpu") for _ in range(world)] for _ in range(2)]
    dist.all_gather_coalesced(lists, [_input(rank, (2,)).to("tpu"), _input(rank + 5, (2,)).to("tpu")])
    for index, offset in enumerate((0, 5)):
        for r in range(world):
            _equal(lists[index][r], _input(r + offset, (2,)), f"all_gather_coalesced [{index}] from rank {r}")


def _split_groups(rank: int, world: int) -> dist.ProcessGroup:
    """`split_group` (it needs the default group bound to a device: `device_id`); returns this rank's half."""
    half = world // 2
    splits = [list(range(half)), list(range(half, world))]
    group = dist.split_group(split_ranks=splits)
    members = splits[0] if rank < half else splits[1]
    assert dist.get_process_group_ranks(group) == members, dist.get_process_group_ranks(group)
    tensor = _input(rank, (4,)).to("tpu")
    dist.all_reduce(tensor, group=group)
    _equal(tensor, sum(_input(r, (4,)) for r in members), "all_reduce on a split group")
    cpu = _input(rank, (4,))
    dist.all_reduce(cpu, group=group)
    _equal(cpu, sum(_input(r, (4,)) for r in members), "all_reduce of a CPU tensor on a split group")
    whole = dist.split_group(split_ranks=[list(range(world))])
    tensor = _input(rank, (4,)).to("tpu")
    dist.all_reduce(tensor, group=whole)
    _equal(tensor, _total(world, (4,)), "all_reduce on a split group of every rank")
    return group


def _steady_state(rank: int, world: int, half: dist.ProcessGroup) -> None:
    """A step's collectives build their programs once; a new shape, or a group of other ranks, builds its own."""

    def step(group: dist.ProcessGroup | None = None) -> None:
        tensor = _input(rank, (6,)).to("tpu")
        dist.all_reduce(tensor, group=group)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        size = dist.get_world_size(group)
        dist.all_gather_into_tensor(torch.empty(size * 6, dtype=torch.float64, device="tpu"), tensor, group=group)
        dist.reduce_scatter_tensor(torch.empty(1, dtype=torch.float64, device="tpu"), tensor[:size], group=group)
        dist.broadcast(tensor, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        dist.all_reduce_coalesced([tensor, tensor * 2], group=group)

    step()
    built = collectives.compiles
    for _ in range(3):
        step()
    assert collectives.compiles == built, f"steady state built {collectives.compiles - built} programs"
    # (all_gather: on the CPU platform all_reduce runs on gloo over host memory, building no program)
    dist.all_gather_into_tensor(torch.empty(world * 7, dtype=torch.float64, device="tpu"), _input(rank, (7,)).to("tpu"))
    assert collectives.compiles == built + 1, "a new shape must build its own program"
    step(dist.new_group(list(range(world))))  # another group of the same ranks: the same programs
    assert collectives.compiles == built + 1, "a group of the same ranks rebuilt programs"
    step(half)
    with_half = collectives.compiles
    assert with_half > built + 1, "a group of other ranks must not reuse the default group's programs"
    step(half)
    assert collectives.compiles == with_half, "the half group's steady state built programs"


def _counted_in_metrics(rank: int, world: int) -> None:
    """torch_tpu.metrics counts each collective call on tpu tensors and the bytes of this rank's input."""
    metrics.reset()
    tensor = _input(rank, (6,)).to("tpu")
    dist.all_reduce(tensor)
    dist.all_reduce(tensor)
    dist.all_gather_into_tensor(torch.empty(world * 6, dtype=torch.float64, device="tpu"), tensor)
    found = metrics.summary()["collectives"]
    assert found == {"allreduce": {"count": 2, "bytes": 96}, "allgather_base": {"count": 1, "bytes": 48}}, found


def run() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _cpu_mesh_without_a_group(rank, world)
    _destroy()
    _tpu_mesh_without_a_group(rank, world)
    _destroy()
    dist.init_process_group("cpu:gloo,tpu:tpu_dist", timeout=_TIMEOUT, device_id=torch.device("tpu", 0))
    assert dist.get_backend_config() == "cpu:gloo,tpu:tpu_dist", dist.get_backend_config()
    _cpu_goes_to_gloo(rank, world)
    _coalesced(rank, world)
    _into_views(rank, world)
    _into_views_of_every_collective(rank, world)
    _futures_and_names(rank, world)
    _split_groups(rank, world)
    _destroy()
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT, device_id=torch.device("tpu", 0))
    half = _split_groups(rank, world)
    _steady_state(rank, world, half)
    _counted_in_metrics(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    print("c10d checks passed", flush=True)
