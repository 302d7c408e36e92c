"""`jax_op(..., mesh=...)`: the kernel function runs under `jax.shard_map` over the mesh's axes.

`mesh` is a torch `DeviceMesh` (its rank tensor's shape and dimension names become the JAX mesh's shape and axis
names, as `distributed.meshes` maps a DeviceMesh's dimensions onto a compiled graph's mesh axes) or a
`jax.sharding.Mesh`. The function sees each tensor argument as this rank's block and may use the mesh's axis names
(`jax.lax.psum(x, "tp")`, `jax.lax.axis_index("dp")`), so a kernel written for a mesh runs unchanged.

A mesh of one device (a DeviceMesh of this rank alone; a JAX mesh of one device) is traced on the device the op
runs on, so the op is a registry lowering like any other: eager, the CPU kernel, compiled graphs and autograd. A
mesh over several ranks (a DeviceMesh of a tpu_dist job) makes the op collective, like a c10d call: every rank of
the mesh calls it with its block, and it runs as one SPMD program over the mesh's devices (the distributed layer's
`spmd.Program`, reached through `runtime.hooks.mesh_program`: each eager call is checked like a c10d call, and
the ranks agree on the program before its first run, so a rank calling something else raises on every rank),
compiled once per shapes and static arguments. Eager (every mode: Fused runs its pending cluster first) and
autograd serve it, and a compiled graph holding it runs as one SPMD program over the mesh
(`runtime.hooks.mesh_ops`, which `distributed.spmd.plan` reads); it has no CPU kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from torch_tpu.kernels import signature
from torch_tpu.runtime import deferred, dtypes, storage
from torch_tpu.runtime.hooks import hooks


@dataclasses.dataclass(frozen=True)
class Grid:
    """A mesh as a jax_op runs over it: its shape, axis names and, over several devices, its global ranks
    (row-major; None for one device)."""

    shape: tuple[int, ...]
    names: tuple[str, ...]
    ranks: tuple[int, ...] | None


def axes(name: str, mesh: Any) -> Grid | None:
    """`mesh` as a Grid (None for none), checked: a DeviceMesh holding this rank, or a JAX Mesh."""
    if mesh is None:
        return None
    if isinstance(mesh, Mesh):
        shape, names = tuple(mesh.devices.shape), tuple(mesh.axis_names)
        ranks = tuple(int(device.process_index) for device in mesh.devices.flat)
    elif hasattr(mesh, "mesh") and hasattr(mesh, "mesh_dim_names"):  # torch.distributed.device_mesh.DeviceMesh
        grid = mesh.mesh.cpu().numpy()
        shape, ranks = tuple(grid.shape), tuple(int(r) for r in grid.reshape(-1))
        names = tuple(mesh.mesh_dim_names or (f"dim_{i}" for i in range(grid.ndim)))
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank not in ranks:
            raise ValueError(f"torch_tpu: jax_op {name!r}: mesh= holds ranks {list(ranks)}, not this one ({rank})")
    else:
        raise TypeError(f"torch_tpu: jax_op {name!r}: mesh= must be a DeviceMesh or a jax.sharding.Mesh, not {mesh!r}")
    if len(ranks) == 1:
        return Grid(shape, names, None)
    if len(set(ranks)) != len(ranks):
        raise NotImplementedError(
            f"torch_tpu: jax_op {name!r}: mesh= over several devices of one process (ranks {list(ranks)}): each "
            "tpu_dist process owns one device; give a mesh over the job's ranks"
        )
    return Grid(shape, names, ranks)


def under(fn: Callable, shape: tuple[int, ...], names: tuple[str, ...], device: Callable[[], Any]) -> Callable:
    """`fn` under `jax.shard_map` over a mesh of `device()` (the one the trace runs on) with `names`: the array
    arguments (any nesting) are each device's block, the static ones are compiled in."""

    @functools.wraps(fn)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

        def body(*arrays: Any) -> Any:
            values = list(leaves)
            for position, array in zip(positions, arrays, strict=True):
                values[position] = array
            call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, values)
            return fn(*call_args, **call_kwargs)

        grid = Mesh(np.array([device()]).reshape(shape), names)
        specs = tuple(P() for _ in positions)
        run = jax.shard_map(body, mesh=grid, in_specs=specs, out_specs=P(), check_vma=False)
        return run(*[leaves[i] for i in positions])

    return mapped


def _program(grid: Grid) -> Any:
    return hooks.mesh_program(grid.ranks, grid.shape, grid.names)


def _parts(args: tuple, kwargs: dict) -> tuple[list[Any], Any, list[int]]:
    """The call's leaves, their structure and which of them are tensors."""
    leaves, spec = tree_flatten((args, kwargs))
    return leaves, spec, [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]


def _body(lowering: Callable, leaves: list[Any], spec: Any, positions: list[int]) -> Callable:
    """`lowering` as a function of the call's arrays alone (its static arguments compiled in)."""

    def body(*arrays: Any) -> Any:
        values = list(leaves)
        for position, array in zip(positions, arrays, strict=True):
            values[position] = array
        call_args, call_kwargs = tree_unflatten(values, spec)
        return lowering(*call_args, **call_kwargs)

    return body


def spmd_kernel(lowering: Callable, name: str, names: Sequence[str], grid: Grid) -> Callable:
    """The tpu kernel of an op over a mesh of several ranks: `lowering` as one SPMD program over the mesh's
    devices, each rank's tensors its blocks (compiled, after the ranks agree on it, once per shapes, dtypes and
    static arguments)."""
    programs: dict[tuple, Callable] = {}

    def kernel(*args: Any, **kwargs: Any) -> Any:
        leaves, spec, positions = _parts(args, kwargs)
        for position in positions:
            if leaves[position].device.type != "tpu":
                raise RuntimeError(
                    f"torch_tpu: jax_op {name!r} over a mesh of {len(grid.ranks)} devices got a tensor on "
                    f"{leaves[position].device}: its program spans the ranks' tpu devices; pass tpu tensors"
                )
        arrays = [deferred.concrete(storage.value(leaves[i].detach())) for i in positions]
        statics = tuple(leaf for i, leaf in enumerate(leaves) if i not in positions)
        program = _program(grid)
        program.check_call(f"jax_op {name}({signature.describe(args, kwargs, names)})")
        key = (spec, statics, tuple((a.shape, a.dtype) for a in arrays))
        run = programs.get(key)
        if run is None:
            run = programs[key] = program.compile(_body(lowering, leaves, spec, positions), arrays)
        return tree_map(storage.wrap, run(*arrays))

    return kernel


def spmd_fake(lowering: Callable, name: str, grid: Grid) -> Callable:
    """The fake implementation of an op over several ranks: this rank's output blocks as the SPMD program's
    abstract evaluation gives them."""

    def fake(*args: Any, **kwargs: Any) -> Any:
        leaves, spec, positions = _parts(args, kwargs)
        structs = [jax.ShapeDtypeStruct(tuple(leaves[i].shape), dtypes.to_jax(leaves[i].dtype)) for i in positions]
        device = leaves[positions[0]].device if positions else torch.device("cpu")
        avals = _program(grid).output_avals(_body(lowering, leaves, spec, positions), structs)
        return tree_map(
            lambda a: torch.empty(a.shape, dtype=dtypes.to_torch(a.dtype), device=device),
            avals,
            is_leaf=lambda a: isinstance(a, jax.ShapeDtypeStruct),
        )

    return fake


def no_cpu_kernel(name: str, grid: Grid) -> Callable:
    """The CPU kernel of an op over several ranks: none (its collectives span the ranks' tpu devices)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"torch_tpu: jax_op {name!r} runs over a mesh of {len(grid.ranks)} devices "
            f"{dict(zip(grid.names, grid.shape, strict=True))}: it has no CPU kernel; call it on tpu tensors"
        )

    return kernel
