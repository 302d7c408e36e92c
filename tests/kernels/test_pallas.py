"""Pallas kernels through `jax_op`: interpreted on the CPU platform (the HLO interpreter by default, JAX's TPU
interpret mode on request), against CPU PyTorch, and each shipped kernel's TPU and GPU lowering exported from this
host (what interpret mode does not check: Mosaic's block-shape rules, 32-bit types)."""

import itertools
import re
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
from jax import export
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from torch_tpu.kernels import examples, jax_op
from torch_tpu.runtime import platform
from torch_tpu.testing.export import exported

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

MODES = [torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE]
_names = itertools.count()
# Triton's custom call carries no compatibility guarantee, so jax.export refuses it unless told.
_TRITON = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
_CUSTOM_CALL = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}


@pytest.mark.parametrize("mode", MODES, ids=["strict", "fused"])
def test_shipped_kernels_interpreted_match_cpu(mode):
    x, y = torch.randn(16, 256), torch.randn(16, 256)
    with torch.tpu.set_eager_mode(mode):
        added = examples.tiled_add_op(x.to("tpu"), y.to("tpu")).cpu()
        soft = examples.row_softmax_op(x.to("tpu")).cpu()
    torch.testing.assert_close(added, x + y)
    torch.testing.assert_close(soft, x.softmax(-1))


def test_shipped_kernels_compiled_with_gradients():
    x, y, w = torch.randn(8, 128), torch.randn(8, 128), torch.randn(8, 128)

    def loss(add, softmax, a, b, weight):
        return (softmax(add(a, b)) * weight).sum()

    leaves = [t.clone().requires_grad_() for t in (x, y)]
    loss(torch.add, lambda t: t.softmax(-1), *leaves, w).backward()
    expected = [t.grad for t in leaves]
    compiled = torch.compile(loss, backend="tpu", fullgraph=True)
    leaves = [t.to("tpu").requires_grad_() for t in (x, y)]
    compiled(examples.tiled_add_op, examples.row_softmax_op, *leaves, w.to("tpu")).backward()
    for got, want in zip(leaves, expected, strict=True):
        torch.testing.assert_close(got.grad.cpu(), want)


def _dma_kernel(x_hbm, o_ref, buffer, semaphore):
    copy = pltpu.make_async_copy(x_hbm, buffer, semaphore)
    copy.start()
    copy.wait()
    o_ref[...] = buffer[...] * 2.0


def doubled(x: jax.Array) -> jax.Array:
    """An unmodified TPU kernel: a DMA from HBM into a VMEM scratch buffer, waited on a semaphore."""
    return pl.pallas_call(
        _dma_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
    )(x)


def test_unmodified_tpu_kernel_runs_interpreted():
    x = torch.randn(8, 128)
    auto = jax_op.jax_op(f"pallas_test::doubled_{next(_names)}", doubled)
    torch.testing.assert_close(auto(x.to("tpu")).cpu(), x * 2)
    simulated = jax_op.jax_op(f"pallas_test::doubled_{next(_names)}", doubled, interpret=pltpu.InterpretParams())
    with warnings.catch_warnings():  # its host callbacks cannot be written to the persistent tier
        warnings.simplefilter("ignore")
        torch.testing.assert_close(simulated(x.to("tpu")).cpu(), x * 2)


def _exported(fn, args, platform):
    return exported(fn, args, platform, [_TRITON])


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
@pytest.mark.parametrize("name", sorted(examples.KERNELS))
def test_shipped_kernel_lowers_for_tpu_and_gpu(name, platform):
    fn, args = examples.KERNELS[name]
    module = _exported(fn, args, platform).mlir_module()
    targets = set(re.findall(r"custom_call @([\w$.]+)", module))
    assert any(t.startswith(_CUSTOM_CALL[platform]) for t in targets), targets
    signature = module[module.index("func.func public @main") :].split("{", 1)[0]
    assert not re.search(r"\b[if]64\b", signature), signature  # 32-bit in and out


def test_export_catches_a_block_shape_interpret_mode_accepts():
    def bad_blocks(x: jax.Array) -> jax.Array:
        spec = pl.BlockSpec((4, 50), lambda i: (i, 0))
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(3,),
            in_specs=[spec],
            out_specs=spec,
        )(x)

    x = torch.randn(12, 50)
    op = jax_op.jax_op(f"pallas_test::bad_blocks_{next(_names)}", bad_blocks)
    if platform.platform() == "tpu":  # Mosaic compiles it there, and refuses the blocks as the export does
        with pytest.raises(Exception, match="divisible by 8 and 128"):
            op(x.to("tpu")).cpu()
    else:  # interpreted: any block shape runs
        torch.testing.assert_close(op(x.to("tpu")).cpu(), x + 1)
    with pytest.raises(Exception, match="divisible by 8 and 128"):
        _exported(bad_blocks, (jax.ShapeDtypeStruct((12, 50), jnp.float32),), "tpu")
