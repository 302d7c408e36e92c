"""Programs holding collectives run SPMD over their groups' devices, after the ranks agree on what they run.

A compiled graph (or a Fused-mode cluster) is one jitted program on this rank's device; a collective inside it
needs the program to span the group. `Program` runs the same function under `jax.shard_map` over a mesh: for
one group its 1-D mesh (`collectives.mesh`, the eager collectives' mesh); for a graph over several groups that
are the dimensions of one DeviceMesh (`meshes.layout`: a (dp, tp) mesh's groups, say), that mesh's devices with
one axis per dimension, each collective over its group's axis. Each rank's array is its block of a global array
(dim 0 split over every mesh axis, a 0-d array as a block of one), so the body sees this rank's arrays as they
are and the collectives' HLO (all-reduce, all-gather, reduce-scatter, all-to-all) is in the program.

Before a program's first run all its ranks (its mesh's) agree on it (`agree`, TorchTPU's compile-time handshake):
each publishes its fingerprint and collective count through the c10d store under the program's sequence number,
and a rank that finds another's different raises, naming both, on every rank — rather than entering a program
the others do not run (a deadlock or garbage). A rank that never reaches the handshake fails it at the store's
timeout.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from torch_tpu import metrics
from torch_tpu.distributed import collectives, functional, handshake, meshes
from torch_tpu.runtime import compat, persistent, platform
from torch_tpu.runtime.hooks import hooks

_KEY = "tpu_dist/spmd/{ranks}/{sequence}/{rank}"
# Per group (its ranks): how many programs over it this process has agreed on; every rank counts alike.
_sequence: dict[tuple[int, ...], int] = {}
# Per mesh (its ranks): the process group whose gloo backend checks each eager call of an op over it.
_check_groups: dict[tuple[int, ...], dist.ProcessGroup] = {}


_HLO_COLLECTIVES = ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter", "stablehlo.all_to_all")


def _arrays(values: Sequence[Any]) -> list[Any]:
    """Python numbers as (weakly typed) arrays: a Fused cluster's leaves are all run-time values."""
    return [jnp.asarray(v) if isinstance(v, (bool, int, float, complex)) else v for v in values]


class MismatchError(RuntimeError):
    """Ranks about to run different SPMD programs (a different graph, or different collectives)."""


class Program:
    """How a function whose collectives are over the groups of `axes` (their ranks: their axes of `mesh`) runs as
    one SPMD program over the mesh's devices: `_lower` it for this rank's values, `_call` its executable with them
    (a Fused cluster: `compile`)."""

    def __init__(self, mesh: Mesh, axes: dict[tuple[int, ...], functional.Axis]) -> None:
        self.mesh = mesh
        self.axes = axes
        self.devices = list(mesh.devices.flat)  # the program's device assignment, in mesh order
        self.ranks = tuple(device.process_index for device in self.devices)  # every rank of the program
        self.spec = P(tuple(mesh.axis_names))  # dim 0 over every axis: each device its own block
        self.sharding = NamedSharding(mesh, self.spec)

    def _mapped(self, fn: Callable, values: Sequence[Any], scalars: list[bool]) -> tuple[Callable, list[int]]:
        """`fn(*values)` under `shard_map` as a function of the array values (which positions those are); Python
        ints are compiled in, and 0-d or weakly typed arrays reach `fn` as they were. Tracing fills `scalars`:
        which outputs are 0-d (they travel as blocks of one)."""
        positions = [i for i, v in enumerate(values) if not isinstance(v, int)]
        kinds = [(values[i].ndim == 0, getattr(values[i], "weak_type", False)) for i in positions]

        def body(*arrays: Any) -> Any:
            merged = list(values)
            for position, array, (scalar, weak) in zip(positions, arrays, kinds, strict=True):
                array = array.reshape(()) if scalar else array
                merged[position] = compat.convert_element_type(array, weak_type=True) if weak else array
            previous, functional.tracing.axes = functional.tracing.axes, self.axes
            try:
                outputs = fn(*merged)
            finally:
                functional.tracing.axes = previous
            leaves, tree = jax.tree_util.tree_flatten(outputs)
            scalars[:] = [leaf.ndim == 0 for leaf in leaves]
            return jax.tree_util.tree_unflatten(tree, [x.reshape((1,)) if x.ndim == 0 else x for x in leaves])

        specs = tuple(self.spec for _ in positions)
        mapped = jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=self.spec, check_vma=False)
        return mapped, positions

    def _lower(self, fn: Callable, values: Sequence[Any]) -> tuple[jax.stages.Lowered, list[bool]]:
        """`fn(*values)` (this rank's arrays, and Python ints compiled in) jitted under `shard_map`, lowered; and
        which of its outputs are 0-d."""
        scalars: list[bool] = []
        mapped, positions = self._mapped(fn, values, scalars)
        return jax.jit(mapped).lower(*self._global(values[i] for i in positions)), scalars

    def output_avals(self, fn: Callable, values: Sequence[Any]) -> Any:
        """The shapes and dtypes of this rank's outputs of `fn(*values)` (abstract evaluation, nothing runs)."""
        scalars: list[bool] = []
        mapped, positions = self._mapped(fn, values, scalars)
        size = len(self.ranks)
        blocks = [values[i] for i in positions]
        avals = [jax.ShapeDtypeStruct((size * (x.shape[0] if x.ndim else 1), *x.shape[1:]), x.dtype) for x in blocks]
        leaves, tree = jax.tree_util.tree_flatten(jax.eval_shape(mapped, *avals))
        local = [
            jax.ShapeDtypeStruct(() if scalar else (x.shape[0] // size, *x.shape[1:]), x.dtype)
            for x, scalar in zip(leaves, scalars, strict=True)
        ]
        return jax.tree_util.tree_unflatten(tree, local)

    def compile(self, fn: Callable, leaves: Sequence[Any]) -> Callable:
        """A Fused-mode cluster's executable: agreed on with the other ranks (by its StableHLO), compiled, and
        called with this rank's leaves (Python numbers among them travel as weakly typed arrays)."""
        lowered, scalars = self._lower(fn, _arrays(leaves))
        text = lowered.as_text()
        found = [f"{name} x{text.count(name)}" for name in _HLO_COLLECTIVES if name in text]
        agree(self.ranks, "a fused cluster", hashlib.sha256(text.encode()).hexdigest()[:16], found)
        executable, _ = persistent.compile_lowered(lowered, self.devices)
        return lambda *values: self._call(executable, _arrays(values), scalars)

    def check_call(self, description: str) -> None:
        """Before each eager run of an op over the mesh: every rank makes this call (`description`: the op, its
        shapes, dtypes and static arguments), as each c10d call is checked (`handshake`), else each raises naming
        every side. The first-run agreement alone let a rank at shapes its peers had run enter a program they
        never joined: its collectives then met the timeout instead of an error."""
        if handshake.enabled:
            handshake.agree(handshake.group(_check_group(self.ranks)), description)

    def _call(self, executable: Callable, values: Sequence[Any], scalars: list[bool]) -> Any:
        """Run `_lower`'s executable on this rank's `values`; its outputs as this rank's arrays."""
        outputs = executable(*self._global(v for v in values if not isinstance(v, int)))
        leaves, tree = jax.tree_util.tree_flatten(outputs)
        local = [leaf.addressable_data(0) for leaf in leaves]
        return jax.tree_util.tree_unflatten(
            tree, [x.reshape(()) if s else x for x, s in zip(local, scalars, strict=True)]
        )

    def _global(self, arrays: Any) -> list[jax.Array]:
        """This rank's arrays as its blocks of global arrays (dim 0 concatenated; 0-d as a block of one)."""
        size = len(self.ranks)
        result = []
        for array in arrays:
            if not isinstance(array, jax.Array):  # a host array (the RNG key)
                array = jax.device_put(array, platform.device())
            local = array.reshape((1,)) if array.ndim == 0 else array
            shape = (size * local.shape[0], *local.shape[1:])
            result.append(jax.make_array_from_single_device_arrays(shape, self.sharding, [local]))
        return result


@functools.cache
def program(ranks: tuple[int, ...]) -> Program:
    """The `Program` over one group's `ranks`, its 1-D mesh (a Fused cluster's, or a graph's over one group)."""
    return Program(collectives.mesh(ranks), {ranks: collectives.AXIS})


def _ranks(node: torch.fx.Node) -> tuple[int, ...]:
    """The ranks of the group a collective node is over."""
    return functional.group_ranks(functional.group_name(functional.group_argument(node.target, node.args)))


def _label(axes: dict[tuple[int, ...], functional.Axis], ranks: tuple[int, ...]) -> str:
    """A group as all the program's ranks agree on it: its mesh axis (a 1-D program's: its ranks, which all
    share), not its name (a (dp, tp) mesh's ranks 0 and 2 hold different tp groups)."""
    axis = axes.get(ranks, collectives.AXIS)  # a group of one rank has none
    if axis == collectives.AXIS:
        return f"ranks {list(ranks)}"
    return "+".join(axis) if isinstance(axis, tuple) else axis


def _describe(node: torch.fx.Node, group: str | None) -> str:
    """A collective as the handshake lists it: op, shape, static arguments, and its axis where there are several."""
    value = node.meta.get("val")
    shape = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}" if isinstance(value, torch.Tensor) else ""
    statics = [a for a in node.args[1:-1] if not isinstance(a, torch.fx.Node)] + ([group] if group else [])
    return f"{functional.COLLECTIVES[node.target]}({shape}{', ' if statics else ''}{', '.join(map(str, statics))})"


def _input_bytes(node: torch.fx.Node) -> int:
    """The bytes of a collective node's input (a coalesced one's inputs), as this rank sends them."""
    inputs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
    values = [getattr(n, "meta", {}).get("val") for n in inputs]
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor))


class GraphProgram(Program):
    """A compiled graph's `Program`, with what its ranks agree on: a fingerprint of the graph (every node's op,
    arguments, shapes and dtypes; a collective's group as its axis) and its collectives."""

    def __init__(
        self, mesh: Mesh, axes: dict[tuple[int, ...], functional.Axis], gm: torch.fx.GraphModule, nodes: list
    ) -> None:
        super().__init__(mesh, axes)
        labels = {node: _label(axes, _ranks(node)) for node in nodes}
        parts = []
        for node in gm.graph.nodes:
            value = node.meta.get("val")
            args = torch.fx.node.map_arg(node.args, lambda n: n.name)
            if node in labels:  # the group argument (the last) as its axis
                args = (*args[: len(node.target._schema.arguments) - 1], labels[node])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.name)
            shape = f"{getattr(value, 'shape', '')} {getattr(value, 'dtype', '')}"
            parts.append(f"{node.name} = {node.op} {node.target} {args} {kwargs} {shape}")
        self.graph = "\n".join(parts)
        several = len(mesh.axis_names) > 1
        self.collectives = [_describe(node, labels[node] if several else None) for node in nodes]
        # what each run adds to `torch_tpu.metrics.graph_collectives`: per collective, its op and input bytes
        self.counted = [(functional.COLLECTIVES[node.target], _input_bytes(node)) for node in nodes]
        self.scalar_outputs: dict[tuple, list[bool]] = {}  # per compiled-in sizes, which outputs are 0-d

    def lower(self, fn: Callable, values: Sequence[Any]) -> jax.stages.Lowered:
        """The graph's function `fn` lowered for these values (the RNG key, the inputs, compiled-in sizes)."""
        lowered, self.scalar_outputs[tuple(v for v in values if isinstance(v, int))] = self._lower(fn, values)
        return lowered

    def call(self, executable: Callable, values: Sequence[Any]) -> Any:
        """Run `lower`'s executable on this rank's values; its outputs as this rank's arrays (and count the
        collectives it ran)."""
        outputs = self._call(executable, values, self.scalar_outputs[tuple(v for v in values if isinstance(v, int))])
        for op, sent in self.counted:
            metrics.graph_collectives[op] += 1
            metrics.graph_collective_bytes[op] += sent
        return outputs

    def agree(self, what: str, inputs: Sequence[Any]) -> None:
        """The handshake before the graph's first run with these inputs (their shapes and compiled-in sizes)."""
        avals = [v if isinstance(v, int) else (tuple(v.shape), str(v.dtype)) for v in inputs]
        fingerprint = hashlib.sha256(f"{self.graph}\n{avals}".encode()).hexdigest()[:16]
        agree(self.ranks, f"graph '{what}'", fingerprint, self.collectives)


def _kernel_plan(gm: torch.fx.GraphModule, kernels: list[torch.fx.Node], nodes: list) -> GraphProgram:
    """The program of a graph holding kernels over a mesh of several ranks: that mesh's (one for the graph)."""
    grids = {hooks.mesh_ops[node.target] for node in kernels}
    if len(grids) > 1 or nodes:
        beside = f"collectives ({', '.join(sorted({str(n.target) for n in nodes}))})" if nodes else "other meshes"
        raise NotImplementedError(
            f"torch_tpu: a compiled graph holds kernels over a mesh of several ranks "
            f"({', '.join(sorted({str(n.target) for n in kernels}))}) beside {beside}: one graph runs as one SPMD "
            f"program over one mesh; split the graph between them (torch._dynamo.graph_break())"
        )
    ((ranks, shape, names),) = grids
    if dist.get_rank() not in ranks:
        raise RuntimeError(f"torch_tpu: rank {dist.get_rank()} runs a graph with kernels over ranks {list(ranks)}")
    return GraphProgram(collectives.grid_mesh(ranks, shape, names), {}, gm, [])


def plan(gm: torch.fx.GraphModule) -> GraphProgram | None:
    """The program a graph must run as: None when it holds no collective over more than one rank; over one group,
    its 1-D mesh; over several, the DeviceMesh whose dimensions they are (else a clear error); with kernels over a
    mesh of several ranks (`jax_op(..., mesh=)`), that mesh."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in functional.COLLECTIVES]
    kernels = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in hooks.mesh_ops]
    if kernels:
        return _kernel_plan(gm, kernels, nodes)
    names: dict[tuple[int, ...], str] = {}  # each group's ranks: its name, in graph order
    for node in nodes:
        names.setdefault(_ranks(node), functional.group_name(functional.group_argument(node.target, node.args)))
    spanning = [ranks for ranks in names if len(ranks) > 1]
    if not spanning:
        return None
    for node in nodes:  # before the handshake, whose fingerprints would differ first
        if node.target is functional.ops.all_to_all_single.default:
            shape = tuple(node.args[0].meta["val"].shape)
            problem = functional.uneven_splits(shape, node.args[1], node.args[2], len(_ranks(node)))
            if problem is not None:
                raise NotImplementedError(problem)
    if len(spanning) == 1:
        (ranks,) = spanning
        if dist.get_rank() not in ranks:
            raise RuntimeError(f"torch_tpu: rank {dist.get_rank()} runs a graph with collectives over ranks {ranks}")
        one = program(ranks)
        return GraphProgram(one.mesh, one.axes, gm, nodes)
    found = meshes.layout(spanning)
    if found is None:
        groups = ", ".join(f"group {names[ranks]!r} (ranks {list(ranks)})" for ranks in spanning)
        raise NotImplementedError(
            f"torch_tpu: a compiled graph with collectives over several groups that are not the dimensions of one "
            f"DeviceMesh: {groups}. One graph runs as one SPMD program over one mesh: make the groups one "
            f"DeviceMesh's dimensions (init_device_mesh('tpu', shape, mesh_dim_names=...), then mesh.get_group(dim) "
            f"or mesh[dim]), or split the graph between them (torch._dynamo.graph_break())"
        )
    mesh = collectives.grid_mesh(found.ranks, found.shape, found.names)
    return GraphProgram(mesh, {ranks: found.axes[ranks] for ranks in spanning}, gm, nodes)


def agree(ranks: tuple[int, ...], what: str, fingerprint: str, collective_list: list[str]) -> None:
    """Check that every rank of `ranks` is about to run the same program, else raise `MismatchError` on each."""
    store = dist.distributed_c10d._get_default_store()
    sequence = _sequence.get(ranks, 0)
    _sequence[ranks] = sequence + 1
    mine = {"fingerprint": fingerprint, "collectives": collective_list}
    group = ",".join(map(str, ranks))
    rank = dist.get_rank()
    store.set(_KEY.format(ranks=group, sequence=sequence, rank=rank), json.dumps(mine))
    for peer in ranks:
        if peer == rank:
            continue
        key = _KEY.format(ranks=group, sequence=sequence, rank=peer)
        try:
            theirs = json.loads(store.get(key))
        except dist.DistStoreError as error:
            raise MismatchError(
                f"torch_tpu: {what} (fingerprint {fingerprint}, {len(collective_list)} collectives) waited for rank "
                f"{peer} to agree on SPMD program #{sequence} over ranks {ranks}, and it never reached it: {error}"
            ) from error
        if theirs != mine:
            raise MismatchError(
                f"torch_tpu: ranks differ on SPMD program #{sequence} over ranks {ranks} before its first run: "
                f"rank {rank} has {what} with fingerprint {fingerprint} and {len(collective_list)} collectives "
                f"{collective_list}; rank {peer} has fingerprint {theirs['fingerprint']} and "
                f"{len(theirs['collectives'])} collectives {theirs['collectives']}"
            )


def _check_group(ranks: tuple[int, ...]) -> dist.ProcessGroup:
    """A process group of exactly `ranks` with a CPU backend: one the job has (the default group, a DeviceMesh
    dimension's), else one made for the check (`new_group` with local synchronization: only these ranks take part,
    as only they call the op)."""
    world = dist.distributed_c10d._world
    found = _check_groups.get(ranks)
    if found is not None and found in world.pg_map:
        return found
    members = set(ranks)
    for group, group_ranks in world.pg_group_ranks.items():
        if set(group_ranks) == members and "cpu:" in dist.get_backend_config(group):
            found = group
            break
    else:
        found = dist.new_group(sorted(ranks), use_local_synchronization=True)
    _check_groups[ranks] = found
    return found


@functools.cache
def mesh_program(ranks: tuple[int, ...], shape: tuple[int, ...], names: tuple[str, ...]) -> Program:
    """The `Program` over a mesh of global `ranks` (row-major) in `shape` with axes `names`: a kernel's
    (`kernels.meshed`), whose collectives name the axes themselves."""
    return Program(collectives.grid_mesh(ranks, shape, names), {})


def install() -> None:
    """Compiled graphs holding collectives run as `plan` says, Fused clusters holding collectives as `program`,
    kernels over a mesh of several ranks as `mesh_program` (`runtime.hooks`)."""
    hooks.spmd_plan, hooks.spmd_cluster, hooks.mesh_program = plan, program, mesh_program
