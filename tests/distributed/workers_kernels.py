"""What each rank runs in tests/distributed/test_kernels_mesh.py (launched by `launch.py`): a `jax_op` made with
`mesh=` a DeviceMesh of one rank runs its function under shard_map over the mesh's axes (eager, compiled,
gradients) against the same computation in CPU PyTorch; a mesh over several ranks is refused, naming its size."""

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


def mesh_ops() -> None:
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world, 1), mesh_dim_names=("dp", "tp"))
    if world > 1:
        try:
            torch.tpu.pallas.jax_op("mesh_test::whole", rms, mesh=mesh)
        except NotImplementedError as error:
            assert f"over {world} devices {{'dp': {world}, 'tp': 1}}" in str(error), error
        else:
            raise AssertionError("a mesh over several ranks was accepted")
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
