"""`torch.tpu.distributed.topology_aware_mesh`: the rank layout for `DeviceMesh("tpu", mesh=...)` that puts
logical neighbours on physically neighbouring chips.

Each rank of a tpu_dist job owns one device (its process's first local JAX device; the process index is the
rank). On a TPU the devices' coordinates, cores and slice indices say where each chip is; JAX's mesh utilities
(`create_device_mesh`, `create_hybrid_device_mesh`) turn those into a device array with good collective
performance, and each device is replaced by its rank. Other platforms have no topology: ranks in process order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from jax.experimental import mesh_utils


def _shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, int) or not all(isinstance(size, int) and size > 0 for size in shape):
        raise ValueError(f"topology_aware_mesh: {name} must be a sequence of positive ints, got {shape!r}")
    return tuple(shape)


def _hybrid_in_order(world: int, mesh_shape: tuple[int, ...], dcn_mesh_shape: tuple[int, ...]) -> np.ndarray:
    """Ranks in process order, each `prod(mesh_shape)` consecutive ranks one granule (a slice or a host), the
    granules laid out as `dcn_mesh_shape`: the arrangement `create_hybrid_device_mesh` makes of its blocks."""
    dims = len(mesh_shape)
    ranks = np.arange(world).reshape(*dcn_mesh_shape, *mesh_shape)
    interleaved = ranks.transpose([axis for i in range(dims) for axis in (i, dims + i)])
    return interleaved.reshape([d * m for d, m in zip(dcn_mesh_shape, mesh_shape, strict=True)])


def rank_mesh(
    devices: Sequence[Any],
    mesh_shape: Sequence[int],
    *,
    dcn_mesh_shape: Sequence[int] | None = None,
    allow_split_physical_axes: bool = False,
    contiguous_submeshes: bool = False,
) -> torch.Tensor:
    """The rank layout for `devices`, where `devices[r]` is rank r's JAX device (or any object with the same
    attributes: `platform`, `device_kind`, `coords`, `core_on_chip`, `slice_index` on a TPU)."""
    mesh_shape = _shape("mesh_shape", mesh_shape)
    world = len(devices)
    if dcn_mesh_shape is not None:
        dcn_mesh_shape = _shape("dcn_mesh_shape", dcn_mesh_shape)
        if len(dcn_mesh_shape) != len(mesh_shape):
            raise ValueError(
                f"topology_aware_mesh: dcn_mesh_shape {dcn_mesh_shape} and mesh_shape {mesh_shape} must have the "
                "same number of dimensions"
            )
    total = math.prod(mesh_shape) * (math.prod(dcn_mesh_shape) if dcn_mesh_shape else 1)
    if total != world:
        dcn = f" times dcn_mesh_shape {dcn_mesh_shape}" if dcn_mesh_shape else ""
        raise ValueError(f"topology_aware_mesh: mesh_shape {mesh_shape}{dcn} has {total} ranks; the group has {world}")
    rank_of = {id(device): rank for rank, device in enumerate(devices)}
    if devices[0].platform != "tpu":
        if dcn_mesh_shape is None:
            ranks = np.arange(world).reshape(mesh_shape)
        else:
            ranks = _hybrid_in_order(world, mesh_shape, dcn_mesh_shape)
        return torch.from_numpy(np.ascontiguousarray(ranks, dtype=np.int64))
    if dcn_mesh_shape is None:
        arranged = mesh_utils.create_device_mesh(
            mesh_shape,
            list(devices),
            contiguous_submeshes=contiguous_submeshes,
            allow_split_physical_axes=allow_split_physical_axes,
        )
    else:
        if contiguous_submeshes:
            raise ValueError("topology_aware_mesh: contiguous_submeshes applies to one slice; not with dcn_mesh_shape")
        arranged = mesh_utils.create_hybrid_device_mesh(
            mesh_shape, dcn_mesh_shape, list(devices), allow_split_physical_axes=allow_split_physical_axes
        )
    ranks = np.vectorize(lambda device: rank_of[id(device)], otypes=[np.int64])(arranged)
    return torch.from_numpy(np.ascontiguousarray(ranks, dtype=np.int64))


def _devices_by_rank(world: int) -> list[Any]:
    """Each rank's device: the first local device of the JAX process whose index is the rank."""
    import jax

    first: dict[int, Any] = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        first.setdefault(device.process_index, device)
    missing = [rank for rank in range(world) if rank not in first]
    if missing:
        raise RuntimeError(f"topology_aware_mesh: no JAX device for ranks {missing}; is the group a tpu_dist group?")
    return [first[rank] for rank in range(world)]


def topology_aware_mesh(
    mesh_shape: Sequence[int],
    *,
    dcn_mesh_shape: Sequence[int] | None = None,
    allow_split_physical_axes: bool = False,
    contiguous_submeshes: bool = False,
) -> torch.Tensor:
    """An int64 tensor of the default group's ranks, of shape `mesh_shape` (times `dcn_mesh_shape`, elementwise,
    for a multi-slice job whose slower network spans `dcn_mesh_shape`), for `DeviceMesh("tpu", mesh=...)`.

    Dimensions are ordered by increasing communication, as in JAX: the last one gets the closest chips.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "topology_aware_mesh needs an initialised process group: call "
            'torch.distributed.init_process_group("tpu_dist") first'
        )
    world = dist.get_world_size()
    return rank_mesh(
        _devices_by_rank(world),
        mesh_shape,
        dcn_mesh_shape=dcn_mesh_shape,
        allow_split_physical_axes=allow_split_physical_axes,
        contiguous_submeshes=contiguous_submeshes,
    )
