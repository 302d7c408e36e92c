"""A fast OpInfo subset for CI: PyTorch's own sample inputs for ~130 common ops, float32 forward on `tpu` against
CPU PyTorch, and the gradients of a few (~1 min). A float result that misses the fixed fp32 tolerance is judged
against a float64 CPU run (`check_op(reference64=True)`): it must be as accurate as CPU's own. The whole `op_db`
(every sample, four dtypes) runs in bench/op_coverage.py, which writes docs/op_coverage.md.
"""

import itertools

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from torch_tpu.testing.compare import check_op

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

MAX_SAMPLES = 3  # the first samples of each op: the plain cases; the sweep covers the rest

FORWARD = """
    abs acos add addcdiv addcmul addmm addmv addr all amax any argmax argsort asin atan atan2 baddbmm bmm cat
    ceil clamp clone cos cross cumprod cumsum diag diagonal digamma div.no_rounding_mode div.floor_rounding dot
    eq erf erfinv exp expm1 fft.fft fft.irfft fft.rfft flip floor fmod gather ge gt index_add index_copy
    index_fill index_put index_select isnan le lerp lgamma linalg.cholesky linalg.det linalg.inv linalg.qr
    linalg.solve linalg.svdvals linalg.vector_norm log log1p log_softmax logical_and logical_not logsumexp lt
    masked_fill masked_select matmul max.reduction_with_dim maximum mean median minimum mm mul mv nan_to_num
    nansum ne neg nn.functional.conv2d nn.functional.cross_entropy nn.functional.embedding nn.functional.gelu
    nn.functional.layer_norm nn.functional.linear nn.functional.mse_loss nn.functional.relu nn.functional.silu
    nonzero norm outer permute pow prod reciprocal remainder repeat reshape roll round rsqrt scatter scatter_add
    searchsorted select sigmoid sign sin slice softmax sort split sqrt squeeze stack std sub sum t take tan tanh
    topk trace transpose tril triu unsqueeze var where xlogy
""".split()

GRADIENT = """
    add addmm bmm cat cumsum div.no_rounding_mode exp gather index_select linalg.solve log_softmax matmul mean
    mul nn.functional.conv2d nn.functional.cross_entropy nn.functional.gelu nn.functional.layer_norm
    nn.functional.linear nn.functional.silu pow prod sigmoid softmax sqrt sum tanh var where
""".split()

_BY_NAME = {(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name): op for op in op_db}


def _params(names):
    missing = [name for name in names if name not in _BY_NAME]
    assert not missing, f"not in op_db: {missing}"
    return [pytest.param(_BY_NAME[name], id=name) for name in names]


def _samples(op, requires_grad):
    return itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad), MAX_SAMPLES)


@pytest.mark.parametrize("op", _params(FORWARD))
def test_forward_float32(op):
    for sample in _samples(op, requires_grad=False):
        check_op(op, sample.input, *sample.args, reference64=True, **sample.kwargs)


@pytest.mark.parametrize("op", _params(GRADIENT))
def test_gradients_float32(op):
    for sample in _samples(op, requires_grad=True):
        check_op(op, sample.input, *sample.args, grad=True, reference64=True, **sample.kwargs)
