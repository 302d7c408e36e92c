"""`jax_op(..., mesh=jax.sharding.Mesh)` of one device: the function runs under shard_map over the mesh's axes, so
collectives over its axis names trace (a DeviceMesh, and meshes over several ranks, are in
tests/distributed/test_kernels_mesh.py)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh

from torch_tpu.testing.compare import EAGER_MODES as MODES

_names = itertools.count()


def rms(x: jax.Array, w: jax.Array, eps: float = 0.0) -> jax.Array:
    """A sum over the "tp" axis and this device's "dp" index: both need the mesh's axes to trace."""
    total = jax.lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), "tp")
    return x * jax.lax.rsqrt(total / x.shape[-1] + eps) * w + jax.lax.axis_index("dp")


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


@pytest.fixture(scope="module")
def op():
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "tp"))
    return torch.tpu.pallas.jax_op(f"mesh_test::rms_{next(_names)}", rms, mesh=mesh)


@pytest.mark.parametrize("mode", MODES)
def test_eager_and_cpu_kernel_match_cpu(op, mode):
    x, w = torch.randn(3, 8), torch.randn(8)
    with torch.tpu.set_eager_mode(MODES[mode]):
        result = (op(x.to("tpu"), w.to("tpu"), 1e-3) + 1).cpu()
    torch.testing.assert_close(result, _rms(x, w, 1e-3) + 1)
    torch.testing.assert_close(op(x, w), _rms(x, w))


def test_compiled_and_gradients_match_cpu(op):
    x, w = torch.randn(4, 8), torch.randn(8)
    step = torch.compile(lambda a, b: op(a, b) * 2, backend="tpu", fullgraph=True)
    torch.testing.assert_close(step(x.to("tpu"), w.to("tpu")).cpu(), _rms(x, w) * 2)
    leaf, weight = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    op(leaf, weight).square().sum().backward()
    ref_x, ref_w = x.clone().requires_grad_(), w.clone().requires_grad_()
    _rms(ref_x, ref_w).square().sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), ref_x.grad)
    torch.testing.assert_close(weight.grad.cpu(), ref_w.grad)


def test_without_the_mesh_the_axis_names_do_not_trace():
    plain = torch.tpu.pallas.jax_op(f"mesh_test::plain_{next(_names)}", rms)
    with pytest.raises(Exception, match="unbound axis name"):
        plain(torch.ones(2, 8, device="tpu"), torch.ones(8, device="tpu"))
