"""Which DeviceMesh a compiled graph's groups are the dimensions of, so that the graph runs as one SPMD program
over the mesh's devices with one JAX mesh axis per dimension.

A graph names its groups only, and a rank knows the ranks of its own groups, not the whole layout; the
DeviceMesh that made them holds it (its `.mesh` rank tensor). torch keeps no registry of meshes (2.11-2.14), so
`record` (called by `DeviceMesh.__init__`, patched in `torch_patches`) keeps a weak reference to each. A group is
a dimension, or several flattened, of a mesh when its ranks, in group-rank order, are the mesh's ranks along
those dimensions through this rank's coordinate (row-major, major dimension first): so a mesh dimension's group,
a flattened one (`mesh._flatten()`) or a `new_group` with the same ranks all match. Only the meshes of the job
(default group) that is running count: torch's own caches keep a finished job's meshes alive.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any

import numpy as np
import torch.distributed as dist

from torch_tpu.distributed import process_group

# Each DeviceMesh made (weakly: one nothing uses any more is forgotten), with its rank tensor, dimension names and
# the job it was made in (`process_group.generation()`).
_meshes: list[tuple[weakref.ref, np.ndarray, tuple[str, ...], int]] = []


def record(mesh: Any) -> None:
    """Remember a DeviceMesh just made, with its layout read now (a compiled graph's backend runs under a fake
    tensor mode, where the mesh's rank tensor cannot be computed)."""
    job = process_group.generation()
    _meshes[:] = [entry for entry in _meshes if entry[0]() is not None and entry[3] == job]
    found = _grid(mesh)
    if found is not None:
        _meshes.append((weakref.ref(mesh), *found, job))


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh of ranks: `ranks` row-major in `shape`, axis `names`; `axes` maps each group's ranks (in group-rank
    order) to its axis, or axes major first."""

    ranks: tuple[int, ...]
    shape: tuple[int, ...]
    names: tuple[str, ...]
    axes: dict[tuple[int, ...], str | tuple[str, ...]]


def _grid(mesh: Any) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """A DeviceMesh's rank tensor and dimension names (None: it does not hold this rank)."""
    try:
        grid = mesh.mesh.cpu().numpy().copy()
    except RuntimeError:  # a submesh without this rank: torch cannot give its rank tensor
        return None
    names = tuple(mesh.mesh_dim_names or (f"dim_{i}" for i in range(grid.ndim)))
    return grid, names


def _along(grid: np.ndarray, coordinate: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    """The ranks along `dims` (in that order, the first major) through `coordinate`."""
    index = tuple(slice(None) if d in dims else c for d, c in enumerate(coordinate))
    kept = [d for d in range(grid.ndim) if d in dims]  # the sliced array's dimensions, ascending
    block = np.transpose(grid[index], [kept.index(d) for d in dims])
    return tuple(int(r) for r in block.reshape(-1))


def _match(grid: np.ndarray, names: tuple[str, ...], groups: list[tuple[int, ...]]) -> Layout | None:
    """`groups` as dimensions of the rank tensor `grid` (None: some group is not)."""
    found = np.argwhere(grid == dist.get_rank())
    if len(found) != 1:
        return None
    coordinate = tuple(int(c) for c in found[0])
    axes: dict[tuple[int, ...], str | tuple[str, ...]] = {}
    for ranks in groups:
        for count in range(1, grid.ndim + 1):
            dims = next(
                (d for d in itertools.permutations(range(grid.ndim), count) if _along(grid, coordinate, d) == ranks),
                None,
            )
            if dims is not None:
                axes[ranks] = names[dims[0]] if count == 1 else tuple(names[d] for d in dims)
                break
        else:
            return None
    return Layout(tuple(int(r) for r in grid.reshape(-1)), tuple(grid.shape), names, axes)


def layout(groups: list[tuple[int, ...]]) -> Layout | None:
    """The first DeviceMesh made (on every rank alike) whose dimensions `groups` are, as a `Layout`; None if none."""
    job = process_group.generation()
    for ref, grid, names, made_in in list(_meshes):
        if ref() is not None and made_in == job and (found := _match(grid, names, groups)) is not None:
            return found
    return None
