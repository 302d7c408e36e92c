"""float32 lowerings compute in float32: no float64 array may appear in the jaxpr of a lowering traced for float32
inputs (a numpy float64 constant or a strong-typed 64-bit cast promotes the whole computation, under x64, to float64:
several times slower, and not what PyTorch computes), except for the ops listed in ALLOWED_FLOAT64 with the reason.

The dispatcher's traced function is captured on each compile (`Runner._compile`) and its jaxpr walked, sub-jaxprs
included. One OpInfo sample per op keeps it fast.
"""

import jax
import numpy as np
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from tests.helpers import jaxpr_equations
from torch_tpu.eager import dispatch, warmup
from torch_tpu.eager.cache import executables
from torch_tpu.testing.compare import to_tpu

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

FORWARD = """
    add addcdiv addcmul cumprod cumsum div.floor_rounding erf erfinv exp fmod i0 lerp lgamma log1p logit mean mul
    norm prod round std sum xlogy special.i0e special.i1 special.erfcx
    nn.functional.celu nn.functional.selu nn.functional.softplus nn.functional.hardswish nn.functional.hardtanh
    nn.functional.rms_norm nn.functional.poisson_nll_loss nn.functional.adaptive_avg_pool2d nn.functional.normalize
    nn.functional.interpolate.nearest nn.functional.scaled_dot_product_attention nn.functional.cosine_similarity
""".split()
# Forward and backward lowerings.
GRADIENT = """
    atan2 div.no_rounding_mode pow sigmoid softmax log_softmax tanh logsumexp var nn.functional.gelu
    nn.functional.elu nn.functional.silu nn.functional.mish nn.functional.hardsigmoid nn.functional.leaky_relu
    nn.functional.logsigmoid nn.functional.glu nn.functional.softshrink nn.functional.hardshrink
    nn.functional.prelu nn.functional.layer_norm nn.functional.group_norm nn.functional.batch_norm
    nn.functional.mse_loss nn.functional.smooth_l1_loss nn.functional.huber_loss
    nn.functional.binary_cross_entropy nn.functional.binary_cross_entropy_with_logits nn.functional.kl_div
    nn.functional.cross_entropy nn.functional.nll_loss nn.functional.avg_pool2d nn.functional.max_pool2d
    nn.functional.interpolate.bilinear nn.functional.interpolate.bicubic nn.functional.conv2d
""".split()

# The lowerings whose contract is float64 arithmetic internally.
ALLOWED_FLOAT64 = {
    "aten.digamma.default": "ops/special.py evaluates in float64 by design, for ~1 ulp at float32 as on CPU",
    "aten.lgamma.default": "XLA's float32 lgamma is 1e-3 off near its roots (1381 ulp; 1.6e-3 on a TPU): float64",
}

_BY_NAME = {(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name): op for op in op_db}
_WIDE = (np.dtype(np.float64), np.dtype(np.complex128))


def _wide_arrays(jaxpr):
    """The primitives of `jaxpr` (sub-jaxprs included) that produce float64/complex128 arrays (scalars aside: a
    Python number's arithmetic is scalar)."""
    return {
        str(eqn.primitive)
        for eqn in jaxpr_equations(jaxpr)
        for var in eqn.outvars
        if getattr(var.aval, "dtype", None) in _WIDE and var.aval.shape != ()
    }


@pytest.fixture
def traced_ops(monkeypatch):
    """Every lowering compiled while the fixture is active: a list of (op name, float64 primitives)."""
    seen = []
    original = dispatch.Runner._compile

    def recording(self, meta_op, key, args, kwargs, leaves, template):
        if self.lowering.jit:
            traced, _ = self._trace(meta_op, args, kwargs, template)
            seen.append((str(meta_op), _wide_arrays(jax.make_jaxpr(traced)(*leaves).jaxpr)))
        return original(self, meta_op, key, args, kwargs, leaves, template)

    monkeypatch.setattr(dispatch.Runner, "_compile", recording)
    monkeypatch.setattr(warmup, "ASYNC_COMPILE", False)  # every cold op compiles where it is called, here
    executables.clear()
    yield seen
    executables.clear()


def _check(name, traced_ops, grad):
    op = _BY_NAME[name]
    sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=grad)))
    result = op(to_tpu(sample.input), *to_tpu(sample.args), **to_tpu(sample.kwargs))
    if grad:
        first = result if isinstance(result, torch.Tensor) else result[0]
        first.sum().backward()
    assert traced_ops, f"{name}: no lowering was compiled"
    leaks = {op_name: prims for op_name, prims in traced_ops if prims and op_name not in ALLOWED_FLOAT64}
    assert not leaks, f"{name}: float64 arrays in the float32 lowerings {leaks}"


@pytest.mark.parametrize("name", FORWARD)
def test_forward_has_no_float64(name, traced_ops):
    _check(name, traced_ops, grad=False)


@pytest.mark.parametrize("name", GRADIENT)
def test_forward_and_backward_have_no_float64(name, traced_ops):
    _check(name, traced_ops, grad=True)


def test_allowed_ops_do_use_float64(traced_ops):
    """The allowlist holds only ops that need it (and the check sees float64 where it is)."""
    for name, op in (("digamma", torch.digamma), ("lgamma", torch.lgamma)):
        sample = next(iter(_BY_NAME[name].sample_inputs("cpu", torch.float32)))
        op(to_tpu(sample.input))
    assert set(ALLOWED_FLOAT64) <= {op_name for op_name, prims in traced_ops if prims}
