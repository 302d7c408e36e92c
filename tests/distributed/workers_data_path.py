"""What each rank runs in test_data_path.py: the eager data path (gloo on host memory on the CPU platform), the
mismatch check and PREMUL_SUM. Every rank knows every rank's input, so each result is compared with the same
computation done locally on CPU PyTorch, in rank order; every check raises on failure.
"""

from __future__ import annotations

import datetime
import os
import warnings

import torch
import torch.distributed as dist
from workers import _equal, _input, _reference

from torch_tpu.distributed import handshake, host

_TIMEOUT = datetime.timedelta(seconds=60)
# Above handshake.INLINE: the data goes through gloo's own collective, not the check's message.
_LARGE = (3, 700)


def _integral(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Small integers: any summation order gives the same floats (gloo's ring order is not rank order)."""
    return _input(rank, shape, torch.int64).to(dtype) if dtype != torch.bool else _input(rank, shape, dtype)


def _all_reduce_values(rank: int, world: int) -> None:
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT)
    # One element rides in the check's carrier: on 2 ranks one rounding, bit-exact for any values; beyond, gloo's
    # order of float additions (small integers: any order gives the same floats).
    one = _input if world == 2 else _integral
    for shape, make in (((1,), one), ((), one), ((2, 3), _input), (_LARGE, _integral)):
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
            for op in ops:
                if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                    continue
                if op == dist.ReduceOp.PRODUCT and shape == _LARGE and dtype.is_floating_point:
                    continue  # a product of 4 ranks' values rounds by association order
                values = [make(r, shape, dtype) for r in range(world)]
                tensor = values[rank].to("tpu")
                dist.all_reduce(tensor, op=op)
                _equal(tensor, _reference(op, values), f"all_reduce {op} {dtype}{list(shape)}")
        for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            values = [make(r, shape, torch.int32) for r in range(world)]
            tensor = values[rank].to("tpu")
            dist.all_reduce(tensor, op=op)
            _equal(tensor, _reference(op, values), f"all_reduce {op} int32{list(shape)}")


def _overflow_is_silent(rank: int, world: int) -> None:
    """A float32 sum past its range is inf, as PyTorch's, without a NumPy RuntimeWarning (carrier and rows)."""
    for shape in ((1,), (2,)):
        values = [torch.full(shape, 3e38) for _ in range(world)]
        tensor = values[rank].to("tpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dist.all_reduce(tensor)
        _equal(tensor, _reference(dist.ReduceOp.SUM, values), f"all_reduce past float32's range {list(shape)}")


def _in_place_is_safe(rank: int, world: int) -> None:
    """gloo writes the device memory in place only where no other tensor or computation still reads it."""
    for shape in ((1,), (4,), _LARGE):  # one element: a new array, however the old one is shared
        values = [_integral(r, shape, torch.float32) for r in range(world)]
        expected = _reference(dist.ReduceOp.SUM, values)
        tensor = values[rank].to("tpu")
        dist.all_reduce(tensor)  # the tensor's array is now its own
        dist.all_reduce(tensor)  # in place
        _equal(tensor, expected * world, f"in-place all_reduce {list(shape)}")
        shared = torch.empty_like(tensor)
        shared.copy_(tensor)  # may share the array
        doubled = tensor * 2  # may still be running
        dist.all_reduce(tensor)
        _equal(tensor, expected * world * world, f"all_reduce after a copy {list(shape)}")
        _equal(shared, expected * world, f"the copy of an all_reduce's input {list(shape)}")
        _equal(doubled, expected * world * 2, f"a computation on an all_reduce's input {list(shape)}")
    # Views (a column in the check's message, rows beside it): gloo works on a copy, which lands in the base.
    for shape, index in (((3, 4), (slice(None), 1)), ((3, 800), slice(1, None))):
        base = _integral(rank, shape, torch.float64)
        on_tpu = base.to("tpu")
        dist.all_reduce(on_tpu[index], op=dist.ReduceOp.MAX)
        expected = base.clone()
        expected[index] = _reference(
            dist.ReduceOp.MAX, [_integral(r, shape, torch.float64)[index] for r in range(world)]
        )
        _equal(on_tpu, expected, f"all_reduce into a view of {list(shape)}")


def _rooted_values(rank: int, world: int) -> None:
    special = torch.tensor([-0.0, float("nan"), float("inf"), 1e-45, -3.5], dtype=torch.float32)
    for root in range(world):
        for source in (special, special.repeat(300), torch.complex(special, -special), *special.split(1)):
            tensor = (source if rank == root else torch.zeros_like(source)).to("tpu")
            dist.broadcast(tensor, src=root)
            got = torch.view_as_real(tensor.cpu()) if source.is_complex() else tensor.cpu()
            want = torch.view_as_real(source) if source.is_complex() else source
            _equal(
                got.view(torch.int32), want.view(torch.int32), f"broadcast {source.dtype} {source.numel()} from {root}"
            )
        values = [_input(r, (5,), torch.bool) for r in range(world)]
        tensor = values[rank].to("tpu")
        dist.broadcast(tensor, src=root)
        _equal(tensor, values[root], f"broadcast bool from {root}")
    root = world - 1
    for shape in ((1,), (4,), _LARGE):
        values = [_integral(r, shape, torch.float64) for r in range(world)]
        tensor = values[rank].to("tpu")
        dist.reduce(tensor, dst=root, op=dist.ReduceOp.SUM)
        expected = _reference(dist.ReduceOp.SUM, values) if rank == root else values[rank]
        _equal(tensor, expected, f"reduce {list(shape)} to {root}")


def _premul_sum(rank: int, world: int) -> None:
    """PREMUL_SUM: each rank's input times the factor, then summed (as NCCL does), in rank order."""
    if not hasattr(dist.ReduceOp, "factor"):  # torch 2.11: the factor cannot be read, refused naming the release
        try:
            dist.all_reduce(torch.ones(2, device="tpu"), op=dist._make_nccl_premul_sum(0.5))
        except NotImplementedError as error:
            assert "PREMUL_SUM needs torch >= 2.12" in str(error), error
        else:
            raise AssertionError("PREMUL_SUM without a readable factor did not raise")
        return
    for factor in (0.1, torch.tensor(0.3, dtype=torch.float64), torch.tensor([2.5], dtype=torch.float32)):
        scale = factor if isinstance(factor, float) else factor.item()
        for shape, make in (((1,), _input if world == 2 else _integral), ((2, 3), _input), (_LARGE, _integral)):
            # Beyond 2 ranks gloo's ring adds in another order than rank order: its sums equal the local one's
            # only where every partial sum is exact (float32 and float64, a factor of 2.5 on small integers); else
            # float32 and float64 agree to rounding, and bfloat16's rounding at each addition is too coarse.
            in_ring = shape in (_LARGE, (1,)) and world > 2
            in_order = not in_ring or scale == 2.5
            for dtype in (torch.float32, torch.float64) if in_ring else (torch.float32, torch.float64, torch.bfloat16):
                values = [make(r, shape, dtype) for r in range(world)]
                tensor = values[rank].to("tpu")
                dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(factor))
                expected = _reference(dist.ReduceOp.SUM, [v * scale for v in values])
                if in_order:
                    _equal(tensor, expected, f"premul_sum {factor} {dtype}{list(shape)}")
                else:
                    torch.testing.assert_close(tensor.cpu(), expected, msg=f"premul_sum {factor} {dtype} (gloo order)")
    # The XLA programs' route: complex (gloo's host route does not take it) and reduce_scatter.
    values = [
        torch.complex(_integral(r, (3,), torch.float32), _integral(r + 9, (3,), torch.float32)) for r in range(world)
    ]
    tensor = values[rank].to("tpu")
    dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(0.5))
    _equal(tensor, _reference(dist.ReduceOp.SUM, [v * 0.5 for v in values]), "premul_sum complex64")
    wholes = [_integral(r, (world * 2, 3), torch.float32) for r in range(world)]
    output = torch.empty((2, 3), dtype=torch.float32, device="tpu")
    dist.reduce_scatter_tensor(output, wholes[rank].to("tpu"), op=dist._make_nccl_premul_sum(0.25))
    expected = _reference(dist.ReduceOp.SUM, [w[rank * 2 : rank * 2 + 2] * 0.25 for w in wholes])
    _equal(output, expected, "reduce_scatter_tensor premul_sum")
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32, device="tpu"), op=dist._make_nccl_premul_sum(2.0))
    except RuntimeError as error:
        assert "ReduceOp.PREMUL_SUM needs a floating dtype, got torch.int32" in str(error), error
    else:
        raise AssertionError("premul_sum on int32 did not raise")


def _torch_calls(call) -> int:
    """How many times `call()` reaches `ProcessGroup.allreduce` (torch.distributed's call into the c10d kernels)."""
    calls = []
    method = dist.ProcessGroup.allreduce

    def counted(self, *args, **kwargs):
        calls.append(1)
        return method(self, *args, **kwargs)

    dist.ProcessGroup.allreduce = counted
    try:
        call()
    finally:
        dist.ProcessGroup.allreduce = method
    return len(calls)


def _fast_and_torch_paths(rank: int, world: int) -> None:
    """A one-element dist.all_reduce skips torch's call into the c10d kernel (`distributed/fast.py`) unless torch
    must see it (async, a dispatch mode, the profiler); ranks on either path agree and get the same values."""
    values = [torch.tensor([r + 0.25]) for r in range(world)]
    expected = _reference(dist.ReduceOp.SUM, values)
    ways = {
        "plain": lambda t: dist.all_reduce(t),
        "async": lambda t: dist.all_reduce(t, async_op=True).wait(),
        "mixed": lambda t: _wait(dist.all_reduce(t, async_op=rank == 1)),
        "profiled": lambda t: _profiled(lambda: dist.all_reduce(t)),
    }
    through_torch = {"plain": 0, "async": 1, "mixed": int(rank == 1), "profiled": 1}
    for way, call in ways.items():
        tensor = values[rank].to("tpu")
        calls = _torch_calls(lambda: call(tensor))  # noqa: B023
        assert calls == through_torch[way], f"{way}: {calls} calls into torch's c10d kernel"
        _equal(tensor, expected, f"one-element all_reduce, {way}")
    from torch.distributed.tensor.debug import CommDebugMode

    tensor = values[rank].to("tpu")
    with CommDebugMode() as comms:
        dist.all_reduce(tensor)
    assert comms.get_total_counts() == 1, comms.get_comm_counts()
    _equal(tensor, expected, "one-element all_reduce under CommDebugMode")


def _wait(work) -> None:
    if work is not None:
        work.wait()


def _profiled(call) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        call()


def _unchecked(rank: int, world: int) -> None:
    handshake.enabled = False
    try:
        for shape in ((1,), (4,), _LARGE):  # the carrier alone, gloo in place
            values = [_integral(r, shape, torch.float32) for r in range(world)]
            tensor = values[rank].to("tpu")
            dist.all_reduce(tensor)
            _equal(tensor, _reference(dist.ReduceOp.SUM, values), f"unchecked all_reduce {list(shape)}")
        tensor = torch.tensor([rank - 0.5], device="tpu")
        dist.broadcast(tensor, src=world - 1)
        _equal(tensor, torch.tensor([world - 1.5]), "unchecked broadcast of one element")
    finally:
        handshake.enabled = True


def exact() -> None:
    """Every value of the host route exact against a local computation; PREMUL_SUM; the check turned off."""
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert host.available(), "the CPU platform's host route is off"
    _all_reduce_values(rank, world)
    _overflow_is_silent(rank, world)
    _in_place_is_safe(rank, world)
    _rooted_values(rank, world)
    _premul_sum(rank, world)
    _unchecked(rank, world)
    _fast_and_torch_paths(rank, world)
    dist.barrier()
    dist.destroy_process_group()


def _expect_mismatch(what: str, message: str, outputs: list[torch.Tensor], call) -> None:
    """`call()` raises on this rank with `message` in its error, and writes none of `outputs`."""
    before = [output.cpu().clone() for output in outputs]
    try:
        call()
    except RuntimeError as error:
        assert message in str(error), f"{what}: {error}"
    else:
        raise AssertionError(f"{what}: no error")
    for output, was in zip(outputs, before, strict=True):
        _equal(output, was, f"{what}: output after the error")


def mismatches() -> None:
    """Each kind of mismatch raises on every rank, naming each side, and leaves the outputs as they were."""
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    odd = rank == 1
    others = ", ".join(str(r) for r in range(world) if r != 1)
    ranks = f"rank{'s' if world > 2 else ''} {others}"
    tensor = torch.arange(4, dtype=torch.int32 if odd else torch.float32, device="tpu")
    _expect_mismatch(
        "dtype",
        f"tpu_dist: all_reduce mismatch: {ranks} float32[4] SUM, rank 1 int32[4] SUM",
        [tensor],
        lambda: dist.all_reduce(tensor),
    )
    tensor = torch.ones(1, dtype=torch.int32 if odd else torch.float32, device="tpu")
    _expect_mismatch(  # both in the check's carrier, as float64 and as int64
        "dtype of one element",
        f"tpu_dist: all_reduce mismatch: {ranks} float32[1] SUM, rank 1 int32[1] SUM",
        [tensor],
        lambda: dist.all_reduce(tensor),
    )
    tensor = torch.ones(1, dtype=torch.int32 if odd else torch.float32, device="tpu")
    _expect_mismatch(  # rank 1 through torch's call into the c10d kernel, the others not (`fast.py`)
        "dtype of one element, one rank through torch's c10d kernel",
        f"tpu_dist: all_reduce mismatch: {ranks} float32[1] SUM, rank 1 int32[1] SUM",
        [tensor],
        lambda: dist.all_reduce(tensor, async_op=odd),
    )
    tensor = torch.ones(1, dtype=torch.int64 if odd else torch.float32, device="tpu")
    op = dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM
    _expect_mismatch(  # a value in the check's exchange on one side, a value that follows the check on the other
        "op of one element",
        f"tpu_dist: all_reduce mismatch: {ranks} float32[1] SUM, rank 1 int64[1] MAX",
        [tensor],
        lambda: dist.all_reduce(tensor, op=op),
    )
    for length in (1, 4, 1500):  # in the check's carrier, gathered after the check, reduced by gloo
        tensor = torch.ones(length + odd, device="tpu")
        _expect_mismatch(
            f"shape {length}",
            f"all_reduce mismatch: {ranks} float32[{length}] SUM, rank 1 float32[{length + 1}] SUM",
            [tensor],
            lambda tensor=tensor: dist.all_reduce(tensor),
        )
    tensor = torch.ones(4, device="tpu")
    op = dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM
    _expect_mismatch(
        "op",
        f"all_reduce mismatch: {ranks} float32[4] SUM, rank 1 float32[4] MAX",
        [tensor],
        lambda: dist.all_reduce(tensor, op=op),
    )
    factor = 0.5 if odd else 0.25
    if hasattr(dist.ReduceOp, "factor"):  # torch 2.11 refuses PREMUL_SUM on every rank alike (`_premul_sum`)
        _expect_mismatch(
            "premul factor",
            f"all_reduce mismatch: {ranks} float32[4] PREMUL_SUM(0.25), rank 1 float32[4] PREMUL_SUM(0.5)",
            [tensor],
            lambda: dist.all_reduce(tensor, op=dist._make_nccl_premul_sum(factor)),
        )
    tensor = torch.ones(4, device="tpu")
    gathered = torch.zeros(4 * world, device="tpu")
    _expect_mismatch(
        "kind",
        f"tpu_dist: collective mismatch: {ranks} all_reduce float32[4] SUM, rank 1 all_gather_into_tensor float32[4] "
        f"into float32[{4 * world}]",
        [tensor, gathered],
        lambda: dist.all_gather_into_tensor(gathered, tensor) if odd else dist.all_reduce(tensor),
    )
    scalar, gathered = torch.ones(1, device="tpu"), torch.zeros(world, device="tpu")
    _expect_mismatch(  # a value in the carrier on one side, an XLA program's check on the other
        "kind of one element",
        f"tpu_dist: collective mismatch: {ranks} broadcast float32[1] from rank 0, rank 1 all_gather_into_tensor "
        f"float32[1] into float32[{world}]",
        [scalar, gathered],
        lambda: dist.all_gather_into_tensor(gathered, scalar) if odd else dist.broadcast(scalar, src=0),
    )
    _expect_mismatch(
        "root",
        f"broadcast mismatch: {ranks} float32[4] from rank 0, rank 1 float32[4] from rank 1",
        [tensor],
        lambda: dist.broadcast(tensor, src=1 if odd else 0),
    )
    # The group still works after them.
    values = [_input(r, (3,), torch.float32) for r in range(world)]
    tensor = values[rank].to("tpu")
    dist.all_reduce(tensor)
    _equal(tensor, _reference(dist.ReduceOp.SUM, values), "all_reduce after the mismatches")
    dist.barrier()
    dist.destroy_process_group()


def detail() -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL also compares every tensor of the call: all_gather's outputs here."""
    assert os.environ["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = (2, 3) if rank == 1 else (6,)
    outputs = [torch.zeros(shape, device="tpu") for _ in range(world)]
    tensor = torch.ones(6, device="tpu")
    _expect_mismatch(
        "all_gather outputs",
        f"float32[6] into {world} tensors | tensors float32[6], {', '.join(['float32[2, 3]'] * world)}",
        outputs,
        lambda: dist.all_gather(outputs, tensor),
    )
    values = [_input(r, (3,), torch.float32) for r in range(world)]
    tensor = values[rank].to("tpu")
    dist.all_reduce(tensor)
    _equal(tensor, _reference(dist.ReduceOp.SUM, values), "all_reduce after the mismatch")
    dist.destroy_process_group()
