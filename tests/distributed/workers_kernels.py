"""What each rank runs in tests/distributed/test_kernels_mesh.py (launched by `launch.py`): a `jax_op` made with
`mesh=` a DeviceMesh of one rank runs its function under shard_map over the mesh's axes (eager, compiled,
gradients) against the same computation in CPU PyTorch; over a mesh of every rank the op is one SPMD program whose
psum spans the ranks (Strict and Fused eager, compiled graphs, gradients), against the whole computation on every
rank's data."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from workers import _TIMEOUT, _input


def rms(x: jax.Array, w: jax.Array) -> jax.Array:
    """Root-mean-square normalisation whose sum runs over the "tp" axis (one rank: its own block)."""
    total = jax.lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), "tp")
    return x * jax.lax.rsqrt(total / x.shape[-1]) * w + jax.lax.axis_index("tp")


def _rms(x: torch.Tensor, w: torch.Tensor, tp: int) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True)) * w + tp


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(actual.cpu(), expected, msg=lambda m: f"{what}: {m}")


def _sharded_rms(blocks: list[torch.Tensor], w: torch.Tensor, rank: int) -> torch.Tensor:
    """`rms` of rank `rank` over a "tp" axis of every rank: the sum of squares spans all ranks' blocks."""
    total = sum((x * x).sum(-1, keepdim=True) for x in blocks)
    return blocks[rank] * torch.rsqrt(total / blocks[rank].shape[-1]) * w + rank


def _mismatched(op: object, w: torch.Tensor, index: int, rows: tuple[int, int]) -> None:
    """`op(x, w)` where the mesh's second rank (`index` 1) passes `rows[1]` rows and the others `rows[0]` raises
    the check's error on every rank, naming both shapes."""
    try:
        op(torch.ones(rows[index == 1], 8, device="tpu"), w.to("tpu"))
    except RuntimeError as error:
        text = str(error)
        assert "jax_op mismatch" in text and all(f"float32[{n}, 8]" in text for n in rows), text
    else:
        raise AssertionError(f"ranks calling a mesh op with {rows[0]} and {rows[1]} rows were not stopped")


def _over_every_rank(rank: int, world: int) -> None:
    """The op over a 1-D mesh of every rank (eager in two modes, gradients) and over a (world, 1) mesh."""
    mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
    op = torch.tpu.pallas.jax_op("mesh_test::sharded_rms", rms, mesh=mesh)
    blocks = [_input(r, (3, 8), torch.float32) for r in range(world)]
    w = _input(100, (8,), torch.float32)
    for mode in (torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE):
        with torch.tpu.set_eager_mode(mode):
            result = op(blocks[rank].to("tpu") * 1, w.to("tpu"))
            _close(result, _sharded_rms(blocks, w, rank), f"over {world} ranks, {mode}")
    leaves = [x.clone().requires_grad_() for x in blocks]
    sum(_sharded_rms(leaves, w, r).square().sum() for r in range(world)).backward()
    step = torch.compile(lambda a, b: op(a, b).square().sum(), backend="tpu", fullgraph=True)
    for how, loss in (("eager", lambda a, b: op(a, b).square().sum()), ("compiled", step)):
        leaf = blocks[rank].to("tpu").requires_grad_()
        loss(leaf, w.to("tpu")).backward()  # every rank's loss: the psum's transpose sums their cotangents
        _close(leaf.grad, leaves[rank].grad, f"{how} gradient over {world} ranks")
    doubled = torch.compile(lambda a, b: op(a, b) * 2, backend="tpu", fullgraph=True)
    _close(doubled(blocks[rank].to("tpu"), w.to("tpu")), _sharded_rms(blocks, w, rank) * 2, "compiled")
    try:
        op(blocks[rank], w)
    except NotImplementedError as error:
        assert "has no CPU kernel" in str(error), error
    else:
        raise AssertionError("a mesh op over several ranks ran on CPU tensors")
    # rank 1's block differs, at a shape no rank has compiled, then at one rank 0 has run: each call's check
    # raises on every rank, naming both sides (the second once met the collective's timeout: rank 0 entered its
    # compiled program, rank 1 waited to agree on a new one); then the op runs on as before
    for rows in ((6, 5), (3, 4)):
        _mismatched(op, w, rank, rows)
    _close(op(blocks[rank].to("tpu"), w.to("tpu")), _sharded_rms(blocks, w, rank), "after the mismatches")
    grid = init_device_mesh("tpu", (world, 1), mesh_dim_names=("dp", "tp"))
    whole = torch.tpu.pallas.jax_op("mesh_test::whole", rms, mesh=grid)
    x = blocks[rank]
    _close(whole(x.to("tpu"), w.to("tpu")), _rms(x, w, 0), f"over a ({world}, 1) mesh")


def mesh_ops() -> None:
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world, 1), mesh_dim_names=("dp", "tp"))
    if world > 1:
        _over_every_rank(rank, world)
        mesh = mesh["tp"]  # this rank's one-rank submesh
    op = torch.tpu.pallas.jax_op("mesh_test::rms", rms, mesh=mesh)
    x, w = _input(rank, (3, 8), torch.float32), _input(100, (8,), torch.float32)
    _close(op(x.to("tpu"), w.to("tpu")), _rms(x, w, 0), "eager")
    _close(op(x, w), _rms(x, w, 0), "cpu kernel")
    step = torch.compile(lambda a, b: op(a, b) * 2, backend="tpu", fullgraph=True)
    _close(step(x.to("tpu"), w.to("tpu")), _rms(x, w, 0) * 2, "compiled")
    leaf = x.to("tpu").requires_grad_()
    op(leaf, w.to("tpu")).square().sum().backward()
    reference = x.clone().requires_grad_()
    _rms(reference, w, 0).square().sum().backward()
    _close(leaf.grad, reference.grad, "gradient")
    dist.destroy_process_group()
    print("mesh jax_op checks passed", flush=True)


def submeshes() -> None:
    """On 4 ranks: the op over a (2, 2) DeviceMesh's "tp" dimension (checked over that dimension's group) and over
    a JAX mesh of ranks 0 and 3, which no group holds (the check makes one of those two ranks alone), each against
    the computation on its ranks' data, and a mismatch at a shape already run raising on both ranks of each."""
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, world
    w = _input(100, (8,), torch.float32)
    grid = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = grid["tp"]
    members = [int(r) for r in tp.mesh.tolist()]
    meshes = [("tp", tp, members)]
    if rank in (0, 3):
        devices = {device.process_index: device for device in jax.devices()}
        meshes.append(("corners", jax.sharding.Mesh([devices[0], devices[3]], ("tp",)), [0, 3]))
    for label, mesh, ranks in meshes:
        op = torch.tpu.pallas.jax_op(f"mesh_test::rms_{label}", rms, mesh=mesh)
        blocks = [_input(r, (3, 8), torch.float32) for r in ranks]
        index = ranks.index(rank)
        for _ in range(2):  # the second call runs the compiled program
            _close(op(blocks[index].to("tpu"), w.to("tpu")), _sharded_rms(blocks, w, index), f"over {label}")
        _mismatched(op, w, index, (3, 4))
    dist.destroy_process_group()
    print("mesh jax_op submesh checks passed", flush=True)
