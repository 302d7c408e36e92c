"""`torch.tpu.distributed.topology_aware_mesh`: rank layouts from the devices' physical positions.

Unit tests give `rank_mesh` fake TPU devices (the attributes JAX's mesh utilities read) for a v5e 2x4 slice and
a job of two v5e 2x2 slices, with ranks assigned to chips in a scrambled order so that the device-to-rank mapping
is exercised; the real 4-rank group on the CPU platform is `workers_parallel.four_ranks` (test_tensor_parallel).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import torch_tpu.distributed  # noqa: F401  (torch.tpu.distributed)
from torch_tpu.distributed.topology import rank_mesh


@dataclasses.dataclass(eq=False)
class FakeTpu:
    id: int
    coords: tuple[int, int, int]
    slice_index: int = 0
    process_index: int = 0
    core_on_chip: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v5 lite"


def _slice(width: int, height: int, slice_index: int = 0, first_id: int = 0) -> list[FakeTpu]:
    chips = [(x, y, 0) for y in range(height) for x in range(width)]
    return [FakeTpu(first_id + i, coords, slice_index) for i, coords in enumerate(chips)]


def _scrambled(devices: list[FakeTpu], seed: int) -> list[FakeTpu]:
    """The devices in rank order, ranks given to chips in a random order (as a scheduler may)."""
    order = list(devices)
    random.Random(seed).shuffle(order)
    for rank, device in enumerate(order):
        device.process_index = rank
    return order


def _neighbours(a: FakeTpu, b: FakeTpu) -> bool:
    return a.slice_index == b.slice_index and sum(abs(p - q) for p, q in zip(a.coords, b.coords, strict=True)) == 1


def test_v5e_2x4_ring_puts_consecutive_ranks_on_neighbouring_chips():
    by_rank = _scrambled(_slice(4, 2), seed=0)
    ring = rank_mesh(by_rank, (8,))
    assert ring.dtype == torch.int64 and ring.shape == (8,) and sorted(ring.tolist()) == list(range(8))
    chips = [by_rank[r] for r in ring.tolist()]
    assert all(_neighbours(chips[i], chips[(i + 1) % 8]) for i in range(8)), [c.coords for c in chips]
    # The ring around the 4x2 tray: along y=0, back along y=1.
    assert [c.coords[:2] for c in chips] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (0, 1)]


def test_v5e_2x4_as_dp_by_tp_gives_the_last_axis_neighbouring_chips():
    """The last dimension communicates most (JAX's convention): each tp group is a line of chips."""
    by_rank = _scrambled(_slice(4, 2), seed=1)
    mesh = rank_mesh(by_rank, (2, 4))
    chips = [[by_rank[r] for r in row] for row in mesh.tolist()]
    assert all(_neighbours(row[i], row[i + 1]) for row in chips for i in range(3)), mesh
    assert torch.equal(mesh.flatten(), rank_mesh(by_rank, (8,)))  # the tray's ring, cut in two


def test_in_process_order_the_same_v5e_mesh_is_not_physical():
    """What the ordering buys: `arange(8).reshape(2, 4)` pairs ranks that are chips apart."""
    by_rank = _scrambled(_slice(4, 2), seed=1)
    naive = torch.arange(8).reshape(2, 4).tolist()
    assert not all(_neighbours(by_rank[row[i]], by_rank[row[i + 1]]) for row in naive for i in range(3))


def test_two_slices_split_over_dcn_each_slice_a_ring():
    devices = _slice(2, 2, slice_index=0) + _slice(2, 2, slice_index=1, first_id=4)
    by_rank = _scrambled(devices, seed=2)
    mesh = rank_mesh(by_rank, (1, 4), dcn_mesh_shape=(2, 1))
    assert mesh.shape == (2, 4) and sorted(mesh.flatten().tolist()) == list(range(8))
    for slice_index, row in enumerate(mesh.tolist()):
        chips = [by_rank[r] for r in row]
        assert {c.slice_index for c in chips} == {slice_index}  # the dcn axis crosses slices, ICI stays inside
        assert all(_neighbours(chips[i], chips[(i + 1) % 4]) for i in range(4)), [c.coords for c in chips]


def test_dcn_axis_is_the_outer_one():
    devices = _slice(2, 2, slice_index=0) + _slice(2, 2, slice_index=1, first_id=4)
    by_rank = _scrambled(devices, seed=3)
    mesh = rank_mesh(by_rank, (4, 1), dcn_mesh_shape=(1, 2))  # slices side by side along dim 1
    assert mesh.shape == (4, 2)
    assert [{by_rank[r].slice_index for r in column} for column in mesh.T.tolist()] == [{0}, {1}]


@dataclasses.dataclass(eq=False)
class FakeCpu:
    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


def test_without_a_topology_ranks_are_in_process_order():
    devices = [FakeCpu(i, i) for i in range(8)]
    assert torch.equal(rank_mesh(devices, (2, 4)), torch.arange(8).reshape(2, 4))
    hybrid = rank_mesh(devices, (2, 2), dcn_mesh_shape=(1, 2))  # two "slices" of 4 consecutive ranks, side by side
    assert torch.equal(hybrid, torch.tensor([[0, 1, 4, 5], [2, 3, 6, 7]]))
    assert torch.equal(rank_mesh(devices, (1, 4), dcn_mesh_shape=(2, 1)), torch.arange(8).reshape(2, 4))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"mesh_shape": (3, 2)}, r"mesh_shape \(3, 2\) has 6 ranks; the group has 8"),
        ({"mesh_shape": (2, 2), "dcn_mesh_shape": (3, 1)}, r"times dcn_mesh_shape \(3, 1\) has 12 ranks"),
        ({"mesh_shape": (8,), "dcn_mesh_shape": (1, 1)}, "same number of dimensions"),
        ({"mesh_shape": (0, 8)}, "sequence of positive ints"),
        ({"mesh_shape": 8}, "sequence of positive ints"),
    ],
)
def test_bad_shapes_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        rank_mesh([FakeCpu(i, i) for i in range(8)], **arguments)


def test_needs_an_initialised_group():
    with pytest.raises(RuntimeError, match=r"needs an initialised process group: call .*init_process_group"):
        torch.tpu.distributed.topology_aware_mesh((1,))
