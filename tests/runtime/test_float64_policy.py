"""float64 on a TPU (torch_tpu/runtime/float64.py, torch_tpu/ops/emulated.py): complex128 is refused naming the op,
XLA's own refusals are named, `pow`, `atan2` and `prod` run written out from float64-accurate ops, everything else
runs as XLA lowers it; other platforms are untouched. The platform is made to answer "tpu" here, so the decisions
are checked on any machine, and the written-out formulations are plain JAX, checked here against CPU PyTorch's
float64; on a TPU tests/test_on_chip.py checks the values."""

import itertools
import math
import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch_tpu.eager import encoding
from torch_tpu.ops import emulated, registry
from torch_tpu.runtime import float64, persistent, platform, storage

F64, C128, F32 = np.dtype(np.float64), np.dtype(np.complex128), np.dtype(np.float32)
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 2.5, -2.5, 1 / 3, 0.9, -0.9, 1e-3, 7.0, -7.0]
SPECIAL += [63.0, -63.0, 64.0, -64.0, 100.0, math.inf, -math.inf, math.nan]


@pytest.fixture
def on_a_tpu(monkeypatch):
    tpu = types.SimpleNamespace(platform=lambda: "tpu", devices=platform.devices)
    monkeypatch.setattr(float64, "platform", tpu)
    monkeypatch.setattr(emulated, "platform", tpu)
    monkeypatch.setattr(encoding, "platform", tpu)


def _jax(fn, *tensors):
    platform.devices()  # x64 is configured
    return torch.from_numpy(np.array(jax.jit(fn)(*(jnp.asarray(t.numpy()) for t in tensors))))


def _assert_matches(got, want, rtol):
    """Same value (nan where nan, the sign of zeros and infinities), or within `rtol` (a tensor: per element)."""
    same = (got == want) & (torch.signbit(got) == torch.signbit(want)) | got.isnan() & want.isnan()
    close = (got - want).abs() <= rtol * want.abs()
    assert bool((same | close & want.isfinite()).all()), torch.stack([got, want], 1)[~(same | close)]


def _grid():
    x, y = zip(*itertools.product(SPECIAL, SPECIAL), strict=True)
    return torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)


def _pow_bound(x, y):
    """exp(y log|x|) carries log's rounding times |y log|x|| (CPU's pow is correctly rounded): ~1e-14 relative
    for results in float32's range, the emulation's."""
    return 2e-16 * (1 + (y * x.abs().log()).abs().nan_to_num(0, 0, 0))


def test_pow_is_cpus_on_special_values_and_random_ones():
    x, y = _grid()
    _assert_matches(_jax(emulated.pow, x, y), torch.pow(x, y), _pow_bound(x, y))
    for exponent in (0, 1, 2, 3, -1, -2, 5, True, 2.5, -3.0, 63.0, 64):
        got = _jax(lambda b, e=exponent: emulated.pow(b, e), x)
        _assert_matches(got, torch.pow(x, exponent), _pow_bound(x, torch.full_like(x, exponent)))
    base, exponent = torch.rand(10000, dtype=torch.float64) * 10, torch.rand(10000, dtype=torch.float64) * 20 - 10
    _assert_matches(_jax(emulated.pow, base, exponent), torch.pow(base, exponent), 1e-14)
    small = torch.tensor([3.0, -2.0, 1 / 3, 10.0], dtype=torch.float64)
    assert torch.equal(_jax(emulated.pow, small, torch.full((4,), 3.0, dtype=torch.float64)), small * small * small)


def test_atan2_is_cpus_and_exact_on_the_axes_and_diagonals():
    y, x = _grid()
    _assert_matches(_jax(emulated.atan2, y, x), torch.atan2(y, x), 4.5e-16)  # within 2 ulps
    axes = (y == 0) | (x == 0) | y.isinf() | x.isinf()
    _assert_matches(_jax(emulated.atan2, y[axes], x[axes]), torch.atan2(y[axes], x[axes]), 0)
    y, x = torch.randn(10000, dtype=torch.float64) * 10, torch.randn(10000, dtype=torch.float64) * 10
    _assert_matches(_jax(emulated.atan2, y, x), torch.atan2(y, x), 4.5e-16)


@pytest.mark.parametrize(
    "shape,dim,keepdim",
    [((1000,), None, False), ((5, 7, 3), 1, True), ((5, 7, 3), -1, False), ((0, 3), 0, False), ((4, 0), None, True)]
    + [((), None, False), ((3, 4, 5), (0, 2), True)],
)
def test_prod_is_a_tree_of_float64_multiplies(shape, dim, keepdim):
    x = torch.rand(shape, dtype=torch.float64) + 0.5
    axes = None if dim is None else tuple(d % x.ndim for d in ((dim,) if isinstance(dim, int) else dim))
    got = _jax(lambda t: emulated.prod(t, axes, keepdim), x)
    want = x.prod() if dim is None else x.prod(dim, keepdim=keepdim) if isinstance(dim, int) else x
    if isinstance(dim, tuple):
        want = x.prod(2, keepdim=True).prod(0, keepdim=True)
    if dim is None and keepdim:
        want = want.reshape((1,) * x.ndim)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


def test_complex128_is_refused_naming_the_op_and_float64_runs(on_a_tpu):
    with pytest.raises(NotImplementedError, match="'aten::add.Tensor' on complex128"):
        float64.check("aten::add.Tensor", [C128])
    for op in ("aten::add.Tensor", "aten::pow.Tensor_Scalar", "aten.atan2.default", "aten::prod.dim_int"):
        float64.check(op, [F64, None])


def test_xlas_refusals_are_named_and_other_errors_pass_through(on_a_tpu):
    error = jax.errors.JaxRuntimeError("UNIMPLEMENTED: LU decomposition of F64 is not implemented on TPU")
    refused = float64.refusal("aten::linalg_inv_ex", error, [F64])
    assert isinstance(refused, NotImplementedError) and "'aten::linalg_inv_ex'" in str(refused)
    assert float64.refusal("aten::linalg_inv_ex", error, [F32]) is None
    assert float64.refusal("aten::add", jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: x"), [F64]) is None


def test_other_platforms_compute_every_float64_op():
    float64.check("aten::add.Tensor", [C128])
    assert not emulated.applies(F64)
    x = torch.rand(7, dtype=torch.float64) + 0.5
    torch.testing.assert_close(torch.pow(x.to("tpu"), 2.5).cpu(), torch.pow(x, 2.5), rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_eager_runs_the_written_out_ops_on_a_tpu(on_a_tpu, monkeypatch, mode):
    calls = []
    for name in ("pow", "atan2", "prod"):
        original = getattr(emulated, name)
        monkeypatch.setattr(emulated, name, lambda *a, f=original, n=name: calls.append(n) or f(*a))
    modes = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}
    x = torch.rand(3, 11 + len(mode), dtype=torch.float64) + 0.5  # shapes no other test compiles
    with torch.tpu.set_eager_mode(modes[mode]):
        on = x.to("tpu")
        torch.testing.assert_close((on**2.7).cpu(), x**2.7, rtol=1e-14, atol=0)
        torch.testing.assert_close((0.9**on).cpu(), 0.9**x, rtol=1e-14, atol=0)
        torch.testing.assert_close(torch.atan2(on, -on).cpu(), torch.atan2(x, -x), rtol=1e-15, atol=0)
        torch.testing.assert_close(on.prod(1).cpu(), x.prod(1), rtol=1e-14, atol=0)
    assert set(calls) == {"pow", "atan2", "prod"}
    assert not emulated.applies(F32)


def test_compiled_graphs_run_the_written_out_ops_on_a_tpu(on_a_tpu):
    x = torch.rand(5, 13, dtype=torch.float64) + 0.5
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: (t.prod(), t**3, t**-1.5), backend="tpu")
    for got, want in zip(compiled(x.to("tpu")), (x.prod(), x**3, x**-1.5), strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-14, atol=0)
    torch._dynamo.reset()


def test_complex128_is_refused_on_transfer_to_a_tpu(monkeypatch):
    monkeypatch.setattr(storage, "platform", types.SimpleNamespace(platform=lambda: "tpu", device=platform.device))
    with pytest.raises(TypeError, match="complex128 is not supported on the TPU"):
        torch.ones(2, dtype=torch.complex128).to("tpu")


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_64_bit_scalar_in_a_32_bit_op_is_not_the_policys_business(on_a_tpu, mode):
    """A Python scalar reaches an op as a 0-d 64-bit value (autograd's `exponent - 1` in pow's backward, a CPU
    scalar tensor); the op computes at its tensors' width, so nothing is refused (on the chip, Llama's and the
    double-backward tests' float32 steps were). A complex128 one travels as complex64 (next test)."""
    modes = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}
    z = torch.randn(3, 5, dtype=torch.complex64)
    x = torch.rand(3, 5, requires_grad=True)
    with torch.tpu.set_eager_mode(modes[mode]):
        scaled = z.to("tpu") * torch.tensor(1 + 2j, dtype=torch.complex128)  # a complex128 0-d CPU operand
        torch.testing.assert_close(scaled.cpu(), z * (1 + 2j))
        on_tpu = x.detach().to("tpu").requires_grad_()
        (grad,) = torch.autograd.grad(on_tpu.pow(3).sum(), on_tpu, create_graph=True)
        (second,) = torch.autograd.grad(grad.sum(), on_tpu)
    torch.testing.assert_close(second.cpu(), 6 * x.detach())


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_invalid_call_gets_cpus_error_before_the_policys(on_a_tpu, mode):
    """torch.complex of float32 and float64 is an error on every device: CPU's message, not the complex128 refusal."""
    modes = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}
    with torch.tpu.set_eager_mode(modes[mode]):
        with pytest.raises(RuntimeError, match="Expected object of scalar type Float but got scalar type Double"):
            torch.complex(torch.ones(2, device="tpu"), torch.ones(2, dtype=torch.float64, device="tpu")).cpu()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_complex_scalars_reach_a_tpu_program_as_complex64(on_a_tpu, monkeypatch, mode):
    """JAX makes a Python complex a complex128 input, and XLA's TPU compiler aborted the process converting it to
    complex64 (`z * (2 - 1j)`, `add(..., alpha=1j)` on the chip): on a TPU it is a weakly typed complex64, as are
    0-d complex128 CPU tensors, so no program has a complex128 input; the values stay CPU's."""
    inputs = []

    def spy(lowered, *args, **kwargs):  # every program: an op's, a cluster's, a helper's, compiled now or soon
        inputs.append(lowered.in_avals)
        return look_up(lowered, *args, **kwargs)

    look_up = persistent.look_up
    monkeypatch.setattr(persistent, "look_up", spy)
    modes = {"strict": torch.tpu.EagerMode.DEFER_NEVER, "fused": torch.tpu.EagerMode.DEFER_AND_FUSE}
    z, i = torch.randn(3, 7, dtype=torch.complex64), torch.arange(21).reshape(3, 7)
    calls = [
        lambda t, n: t * (2 - 1j),
        lambda t, n: torch.add(n, t, alpha=1j),
        lambda t, n: t.real * 0.5j,
        lambda t, n: (t == (1 + 1j)) | (t != 0.25j),
        lambda t, n: t + torch.tensor(1 + 2j, dtype=torch.complex128),
        lambda t, n: torch.full((3, 7), 1.5 - 2j, device=t.device) * t,
    ]
    with torch.tpu.set_eager_mode(modes[mode]):
        for call in calls:
            for _ in range(2):  # a recurring value is cached as a device array
                got = call(z.to("tpu"), i.to("tpu")).cpu()
                torch.testing.assert_close(got, call(z, i), rtol=2e-7, atol=1e-6)
    wide = [aval for avals in inputs for aval in jax.tree.leaves(avals) if aval.dtype == np.complex128]
    assert inputs and not wide, wide
    with pytest.raises(NotImplementedError, match="on complex128"):  # computed in complex128: refused, named
        (torch.ones(3, 7, dtype=torch.float64, device="tpu") == 1j).cpu()


def _lowering(op):
    return registry.LOWERINGS[op].fn


def _barriers(jaxpr) -> list:
    """The shapes the optimization barriers of a jaxpr (and its sub-jaxprs) hold."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "optimization_barrier":
            found += [tuple(v.aval.shape) for v in eqn.outvars]
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _barriers(sub)
    return found


def test_a_single_float64_value_is_computed_among_copies_on_a_tpu(on_a_tpu):
    """The sixth device run: a one-element float64 exp, tanh or atan is float32-accurate on a v5e, at two
    elements or more float64-accurate; a pointwise lowering computes it among 8 copies, behind a barrier."""
    platform.devices()
    aten = torch.ops.aten
    scalar, single = jnp.asarray(0.5, jnp.float64), jnp.full((1, 1), 0.5, jnp.float64)
    exp = jax.make_jaxpr(_lowering(aten.exp.default))
    assert _barriers(exp(scalar).jaxpr) == [(8,)] and exp(scalar).out_avals[0].shape == ()
    assert _barriers(exp(single).jaxpr) == [(8, 1, 1)] and exp(single).out_avals[0].shape == (1, 1)
    frexp = jax.make_jaxpr(_lowering(aten.frexp.Tensor))(scalar)
    assert [a.shape for a in frexp.out_avals] == [(), ()]
    add = _lowering(aten.add.Tensor)
    # not lifted: float32, two elements, a 0-d tensor beside a (1,) one (lifting both would change PyTorch's
    # promotion between them), a Python number's weakly typed value beside a 0-d tensor is lifted alone
    assert _barriers(exp(jnp.asarray(0.5, jnp.float32)).jaxpr) == []
    assert _barriers(exp(jnp.full(2, 0.5, jnp.float64)).jaxpr) == []
    assert _barriers(jax.make_jaxpr(add)(jnp.ones(1, jnp.float32), scalar).jaxpr) == []
    assert _barriers(jax.make_jaxpr(add)(scalar, jnp.asarray(2.0)).jaxpr) == [(8,)]


_LIFTED_CALLS = {
    "exp": (torch.ops.aten.exp.default, 1),
    "tanh": (torch.ops.aten.tanh.default, 1),
    "log": (torch.ops.aten.log.default, 1),
    "digamma": (torch.ops.aten.digamma.default, 1),
    "frexp": (torch.ops.aten.frexp.Tensor, 1),
    "pow": (torch.ops.aten.pow.Tensor_Tensor, 2),
    "atan2": (torch.ops.aten.atan2.default, 2),
    "fmod": (torch.ops.aten.fmod.Tensor, 2),
    "zeta": (torch.ops.aten.special_zeta.default, 2),
    "where": (torch.ops.aten.where.self, 3),
}


@pytest.mark.parametrize("name", _LIFTED_CALLS)
def test_a_lifted_lowering_computes_what_the_lowering_does(on_a_tpu, name):
    """Lifting changes where a value is computed, not what: on the CPU platform, bit for bit the lowering's own
    result at every special value (the chip's accuracy is tests/test_on_chip.py's)."""
    platform.devices()
    op, arity = _LIFTED_CALLS[name]
    lifted, own = _lowering(op), _lowering(op).__wrapped__
    values = [jnp.asarray(v, jnp.float64) for v in SPECIAL]
    for combination in itertools.islice(itertools.product(values, repeat=arity), 0, None, 7 if arity > 1 else 1):
        if name == "where":
            combination = (combination[0] > 0, *combination[1:])
        got, want = jax.jit(lifted)(*combination), jax.jit(own)(*combination)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_only_pointwise_lowerings_are_lifted():
    aten = torch.ops.aten
    assert all(hasattr(_lowering(op), "__wrapped__") for op in (aten.exp.default, aten.mul.Tensor, aten.where.self))
    assert not any(hasattr(_lowering(op), "__wrapped__") for op in (aten.sum.default, aten.mm.default))


def test_compiled_graphs_lift_single_float64_values_on_a_tpu(on_a_tpu, monkeypatch):
    decisions = []
    original = emulated._single_float64_values
    monkeypatch.setattr(emulated, "_single_float64_values", lambda a: decisions.append(original(a)) or decisions[-1])
    x = torch.tensor(0.7, dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: (t.exp(), torch.atan2(t, t + 1), t.sum().tanh()), backend="tpu")
    for got, want in zip(compiled(x.to("tpu")), (x.exp(), torch.atan2(x, x + 1), x.tanh()), strict=True):
        assert got.shape == () and got.dtype == torch.float64
        torch.testing.assert_close(got.cpu(), want, rtol=1e-15, atol=0)
    torch._dynamo.reset()
    assert decisions.count(True) >= 3


def _primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


@pytest.mark.parametrize("ord", [3, 0.5, -1.5])
def test_norms_take_float64_powers_and_roots_as_written_out_on_a_tpu(on_a_tpu, ord):
    """XLA's float64 `pow` is float32-accurate on a TPU, and a one-element root more so: a vector norm and cdist
    of another order than 0, 1, 2, inf use the written-out power, and lift the root of a one-element sum."""
    aten = torch.ops.aten
    x, y = torch.rand(6, 5, dtype=torch.float64) + 0.1, torch.rand(4, 5, dtype=torch.float64)
    norm = _lowering(aten.linalg_vector_norm.default)
    traced = jax.make_jaxpr(lambda v: norm(v, ord))(jnp.asarray(x.numpy()))
    assert "pow" not in _primitives(traced.jaxpr) and _barriers(traced.jaxpr) == [(8,)]
    got = _jax(lambda v: norm(v, ord, [1]), x)
    torch.testing.assert_close(got, torch.linalg.vector_norm(x, ord, dim=1), rtol=1e-14, atol=0)
    if ord < 0:  # cdist takes p >= 0
        return
    cdist = _lowering(aten._cdist_forward.default)
    assert "pow" not in _primitives(jax.make_jaxpr(lambda a, b: cdist(a, b, ord))(x.numpy(), y.numpy()).jaxpr)
    torch.testing.assert_close(_jax(lambda a, b: cdist(a, b, ord), x, y), torch.cdist(x, y, ord), rtol=1e-14, atol=0)


def test_logsumexp_to_one_element_lifts_its_log_on_a_tpu(on_a_tpu):
    logsumexp = _lowering(torch.ops.aten.logsumexp.default)
    x = torch.randn(7, dtype=torch.float64) * 30
    assert _barriers(jax.make_jaxpr(lambda v: logsumexp(v, [0]))(jnp.asarray(x.numpy())).jaxpr) == [(8, 1)]  # keepdims
    cases = [x, torch.full((3,), -math.inf, dtype=torch.float64), torch.tensor([1.0, math.inf, 2.0]).double()]
    cases.append(torch.tensor([1.0, math.nan], dtype=torch.float64))
    for values in cases:
        _assert_matches(_jax(lambda v: logsumexp(v, [0]), values), torch.logsumexp(values, 0), rtol=1e-15)
    rows = torch.randn(4, 9, dtype=torch.float64)
    got = _jax(lambda v: logsumexp(v, [1], True), rows)
    torch.testing.assert_close(got, torch.logsumexp(rows, 1, keepdim=True), rtol=1e-15, atol=0)


def test_logspace_and_airy_take_no_float64_power_on_a_tpu(on_a_tpu):
    """logspace raises its base in float64 whatever the dtype, and Airy's asymptotic forms take a fourth root: with
    XLA's float32-accurate float64 `pow` on a TPU, neither may use it."""
    from torch_tpu.ops import creation

    platform.devices()  # x64 is configured
    spaced = jax.make_jaxpr(lambda: creation._logspace(-3.0, 2.5, 9, 2.0, dtype=F64))()
    assert "pow" not in _primitives(spaced.jaxpr)
    got = torch.from_numpy(np.array(jax.jit(lambda: creation._logspace(-3.0, 2.5, 9, 2.0, dtype=F64))()))
    torch.testing.assert_close(got, torch.logspace(-3.0, 2.5, 9, 2.0, dtype=torch.float64), rtol=1e-15, atol=0)
    airy = _lowering(torch.ops.aten.special_airy_ai.default)
    x = torch.tensor([-30.0, -9.0, 0.5, 9.0, 30.0], dtype=torch.float64)
    assert "pow" not in _primitives(jax.make_jaxpr(airy)(x.numpy()).jaxpr)
    torch.testing.assert_close(_jax(airy, x), torch.special.airy_ai(x), rtol=1e-12, atol=1e-300)


def test_slogdet_of_a_one_by_one_float64_matrix_lifts_its_log_on_a_tpu(on_a_tpu):
    slogdet = _lowering(torch.ops.aten._linalg_slogdet.default)
    a = torch.tensor([[2.718281828459045]], dtype=torch.float64)
    assert (8, 1) in _barriers(jax.make_jaxpr(slogdet)(a.numpy()).jaxpr)
    sign, logabsdet = (torch.from_numpy(np.array(v)) for v in jax.jit(slogdet)(a.numpy())[:2])
    want_sign, want = torch.linalg.slogdet(a)
    assert sign == want_sign
    torch.testing.assert_close(logabsdet, want, rtol=1e-15, atol=0)
