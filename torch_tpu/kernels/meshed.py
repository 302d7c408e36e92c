"""`jax_op(..., mesh=...)`: the kernel function runs under `jax.shard_map` over the mesh's axes.

`mesh` is a torch `DeviceMesh` (its rank tensor's shape and dimension names become the JAX mesh's shape and axis
names, as `distributed.meshes` maps a DeviceMesh's dimensions onto a compiled graph's mesh axes) or a
`jax.sharding.Mesh`. The function sees each tensor argument as this rank's block and may use the mesh's axis names
(`jax.lax.psum(x, "tp")`, `jax.lax.axis_index("dp")`), so a kernel written for a mesh runs unchanged.

Supported: a mesh of one device (a DeviceMesh of one rank, this process's; a JAX mesh of one device), in eager, the
CPU kernel, compiled graphs and autograd: the shard_map is traced on the device the op runs on. A mesh over several
ranks raises `NotImplementedError` when the op is made: every eager op here is one program on this rank's device,
and a program spanning the mesh's devices (what the distributed layer builds for collectives, `distributed.spmd`)
is not built for jax_ops; run such a kernel's collectives with torch.distributed around the op instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P


def axes(name: str, mesh: Any) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """The shape and axis names of `mesh` (None for none), checked: one device, a DeviceMesh or a JAX Mesh."""
    if mesh is None:
        return None
    if isinstance(mesh, Mesh):
        shape, names, size = tuple(mesh.devices.shape), tuple(mesh.axis_names), mesh.devices.size
    elif hasattr(mesh, "mesh") and hasattr(mesh, "mesh_dim_names"):  # torch.distributed.device_mesh.DeviceMesh
        grid = mesh.mesh.cpu().numpy()
        shape, size = tuple(grid.shape), grid.size
        names = tuple(mesh.mesh_dim_names or (f"dim_{i}" for i in range(grid.ndim)))
        import torch.distributed as dist

        if size == 1 and dist.is_initialized() and int(grid.reshape(-1)[0]) != dist.get_rank():
            raise ValueError(f"torch_tpu: jax_op {name!r}: mesh= holds rank {int(grid.reshape(-1)[0])}, not this one")
    else:
        raise TypeError(f"torch_tpu: jax_op {name!r}: mesh= must be a DeviceMesh or a jax.sharding.Mesh, not {mesh!r}")
    if size != 1:
        raise NotImplementedError(
            f"torch_tpu: jax_op {name!r}: mesh= over {size} devices {dict(zip(names, shape, strict=True))} is not "
            f"supported: each eager op runs on this rank's device alone, and no program spanning the mesh is built "
            f"for jax_ops; give a mesh of one device, or run the collectives with torch.distributed around the op"
        )
    return shape, names


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
