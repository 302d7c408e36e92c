"""Matrix products and dense linear algebra on `tpu` against CPU PyTorch."""

import math
import re
import types

import jax
import jax.numpy as jnp
import pytest
import torch

import torch_tpu
from tests.helpers import random_tensor
from torch_tpu.runtime import compat
from torch_tpu.testing.compare import assert_close, check_op

FLOAT, BF16, INT = torch.float32, torch.bfloat16, torch.int64
aten = torch.ops.aten


def make(*shape, dtype=FLOAT):
    """A random tensor (tests/helpers.py): integers in [-4, 4]; float32 ones require grad."""
    return random_tensor(*shape, dtype=dtype, grad=dtype == FLOAT, low=-4, high=4)


# (id, fn, input shapes, dtypes)
PRODUCTS = [
    ("mm", torch.mm, [(3, 4), (4, 5)], (FLOAT, BF16, INT)),
    ("bmm", torch.bmm, [(2, 3, 4), (2, 4, 5)], (FLOAT, BF16, INT)),
    ("addmm", torch.addmm, [(3, 5), (3, 4), (4, 5)], (FLOAT, BF16, INT)),
    ("addmm_scaled", lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=-2.0), [(5,), (3, 4), (4, 5)], (FLOAT, BF16)),
    ("addmm_int_scaled", lambda s, a, b: torch.addmm(s, a, b, beta=2, alpha=3), [(1, 5), (3, 4), (4, 5)], (INT,)),
    ("mv", torch.mv, [(3, 4), (4,)], (FLOAT, BF16, INT)),
    ("addmv", lambda s, a, v: torch.addmv(s, a, v, beta=2.0, alpha=0.5), [(3,), (3, 4), (4,)], (FLOAT, BF16)),
    ("dot", torch.dot, [(7,), (7,)], (FLOAT, BF16, INT)),
    ("vdot", torch.vdot, [(7,), (7,)], (FLOAT, INT)),
    (
        "baddbmm",
        lambda s, a, b: torch.baddbmm(s, a, b, beta=0.5, alpha=2.0),
        [(3, 5), (2, 3, 4), (2, 4, 5)],
        (FLOAT, BF16),
    ),
    ("addbmm", lambda s, a, b: torch.addbmm(s, a, b, alpha=-1.0), [(3, 5), (2, 3, 4), (2, 4, 5)], (FLOAT, BF16, INT)),
    ("addr", lambda s, a, b: torch.addr(s, a, b, beta=2.0, alpha=0.5), [(3, 4), (3,), (4,)], (FLOAT, BF16)),
    ("outer", torch.outer, [(3,), (4,)], (FLOAT, INT)),
    ("matmul_1d_2d", torch.matmul, [(4,), (4, 5)], (FLOAT,)),
    ("matmul_3d_2d", torch.matmul, [(2, 3, 4), (4, 5)], (FLOAT, BF16, INT)),
    ("matmul_broadcast", torch.matmul, [(2, 1, 3, 4), (3, 4, 5)], (FLOAT,)),
    ("linear", torch.nn.functional.linear, [(2, 3, 4), (5, 4), (5,)], (FLOAT, BF16)),
    ("linear_nobias", torch.nn.functional.linear, [(3, 4), (5, 4)], (FLOAT,)),
    ("einsum", lambda a, b: torch.einsum("bij,bkj->bik", a, b), [(2, 3, 4), (2, 5, 4)], (FLOAT,)),
    ("tensordot", lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), [(2, 3, 4), (3, 4, 5)], (FLOAT,)),
    ("inner", torch.inner, [(3, 4), (5, 4)], (FLOAT,)),
    ("kron", torch.kron, [(2, 3), (3, 2)], (FLOAT,)),
    ("multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), [(3, 4), (4, 5), (5, 2)], (FLOAT,)),
    ("trace", torch.trace, [(4, 5)], (FLOAT, BF16, INT)),
    ("diag_embed", torch.diag_embed, [(2, 3)], (FLOAT, BF16, INT)),
    ("diag_embed_offset", lambda x: torch.diag_embed(x, -1, 0, 2), [(2, 3)], (FLOAT, INT)),
    ("diag_embed_positive", lambda x: torch.diag_embed(x, 2, 2, 0), [(2, 3)], (FLOAT,)),
    ("cross", lambda a, b: torch.linalg.cross(a, b), [(2, 3), (1, 3)], (FLOAT, INT)),
    ("cross_dim", lambda a, b: torch.linalg.cross(a, b, dim=0), [(3, 2), (3, 2)], (FLOAT,)),
]


@pytest.mark.parametrize(
    "fn, shapes, dtype",
    [pytest.param(fn, shapes, d, id=f"{name}-{str(d)[6:]}") for name, fn, shapes, dtypes in PRODUCTS for d in dtypes],
)
def test_product(fn, shapes, dtype):
    args = [make(*shape, dtype=dtype) for shape in shapes]
    check_op(fn, *args, grad=dtype == FLOAT)


def test_addmm_beta_zero_ignores_nan():
    s = torch.full((3, 5), math.nan)
    check_op(lambda s, a, b: torch.addmm(s, a, b, beta=0), s, make(3, 4), make(4, 5))
    check_op(lambda s, a, b: torch.baddbmm(s, a, b, beta=0.0), s, make(2, 3, 4), make(2, 4, 5))


def test_fp32_matmul_is_fp32_accurate():
    a, b = torch.randn(64, 256, dtype=torch.float64), torch.randn(256, 32, dtype=torch.float64)
    exact = a @ b
    result = (a.float().to("tpu") @ b.float().to("tpu")).cpu().double()
    assert (result - exact).abs().max() < 1e-4


def test_bf16_matmul_accumulates_in_fp32():
    a, b = torch.randn(8, 512).bfloat16(), torch.randn(512, 8).bfloat16()
    exact = (a.float() @ b.float()).bfloat16()
    assert_close(a.to("tpu") @ b.to("tpu"), exact, rtol=0, atol=0)


def test_mm_out_dtype():
    a, b = torch.randn(3, 4).bfloat16(), torch.randn(4, 5).bfloat16()
    result = aten.mm.dtype(a.to("tpu"), b.to("tpu"), torch.float32)
    assert_close(result, a.float() @ b.float())


def test_int_mm():
    a, b = torch.randint(-100, 100, (32, 32), dtype=torch.int8), torch.randint(-100, 100, (32, 32), dtype=torch.int8)
    check_op(torch._int_mm, a, b)


def test_int8_mm_wraps():
    a, b = torch.randint(-100, 100, (3, 8), dtype=torch.int8), torch.randint(-100, 100, (8, 4), dtype=torch.int8)
    check_op(torch.mm, a, b)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_integer_products_wrap_as_cpus(dtype):
    """Sums past the dtype's range wrap as on CPU, whether accumulated in int32 (up to 32 bits) or int64."""
    info = torch.iinfo(dtype)
    high = min(info.max, 2**40)
    a = torch.randint(max(info.min, -high), high, (2, 3, 16), dtype=dtype)
    b = torch.randint(max(info.min, -high), high, (2, 16, 5), dtype=dtype)
    check_op(lambda a, b: (a @ b, torch.mm(a[0], b[0]), torch.mv(a[0], b[0, :, 0]), torch.dot(a[0, 0], a[1, 0])), a, b)


def test_integer_products_take_no_64_bit_dot_and_int64_ones_are_refused_on_a_tpu(monkeypatch):
    """XLA's TPU backend has no 64-bit integer dot ("X{64|128} ... rewriting is not implemented" on a v5e): a
    product of integers up to 32 bits accumulates in int32, and one of int64 raises naming the dtype."""
    from torch_tpu.ops import linalg

    monkeypatch.setattr(linalg, "platform", types.SimpleNamespace(platform=lambda: "tpu"))
    for dtype in (jnp.int8, jnp.uint8, jnp.int16, jnp.int32, jnp.bool_):
        a, b = jnp.ones((2, 3), dtype), jnp.ones((3, 4), dtype)
        text = jax.jit(lambda a, b: linalg._product("ij,jk->ik", a, b)).lower(a, b).as_text()
        assert "dot_general" in text and "xi64>" not in text.split("dot_general")[1].split("\n")[0]
    with pytest.raises(NotImplementedError, match="int64 tensors are not supported on the TPU"):
        linalg._product("ij,jk->ik", jnp.ones((2, 3), jnp.int64), jnp.ones((3, 4), jnp.int64))


def test_complex_products():
    a, b = torch.randn(3, 4, dtype=torch.complex64), torch.randn(4, 5, dtype=torch.complex64)
    check_op(lambda a, b: (a @ b, torch.vdot(a[0], b[:, 0]), torch.addmm(a @ b, a, b, beta=1j)), a, b)


def test_addr_bool():
    check_op(torch.addr, torch.rand(3, 4) > 0.5, torch.rand(3) > 0.5, torch.rand(4) > 0.5)


def test_addmm_activation():
    s, a, b = make(5), make(3, 4), make(4, 5)
    check_op(
        lambda s, a, b: (aten._addmm_activation(s, a, b, beta=0.5), aten._addmm_activation(s, a, b, use_gelu=True)),
        s,
        a,
        b,
    )


def test_out_variants():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    out = torch.empty(0, device="tpu")
    torch.mm(a.to("tpu"), b.to("tpu"), out=out)
    assert_close(out, a @ b)
    check_op(lambda s, a, b: s.clone().addmm_(a, b, alpha=2.0), torch.randn(3, 5), a, b)


def spd(*shape):
    x = torch.randn(shape)
    return (x @ x.mT + shape[-1] * torch.eye(shape[-1])).requires_grad_()


def triangular(*shape, upper):
    x = torch.randn(shape) + 3 * torch.eye(shape[-1])
    return (x.triu() if upper else x.tril()).requires_grad_()


def abs_columns(x):
    """Singular/eigen vectors up to sign."""
    return x.abs()


DECOMPOSITIONS = [
    ("cholesky", lambda s: torch.linalg.cholesky(s), lambda: [spd(4, 4)]),
    ("cholesky_upper", lambda s: torch.linalg.cholesky(s, upper=True), lambda: [spd(2, 3, 3)]),
    ("cholesky_ex", lambda s: torch.linalg.cholesky_ex(s), lambda: [spd(4, 4)]),
    ("cholesky_legacy", lambda s: torch.cholesky(s, upper=True), lambda: [spd(3, 3)]),
    ("cholesky_solve", lambda s, b: torch.cholesky_solve(b, torch.linalg.cholesky(s)), lambda: [spd(4, 4), make(4, 2)]),
    (
        "cholesky_solve_upper",
        lambda s, b: torch.cholesky_solve(b, torch.linalg.cholesky(s, upper=True), upper=True),
        lambda: [spd(2, 3, 3), make(3, 2)],
    ),
    ("cholesky_inverse", lambda s: torch.cholesky_inverse(torch.linalg.cholesky(s)), lambda: [spd(4, 4)]),
    ("det", torch.linalg.det, lambda: [make(4, 4)]),
    ("det_batched", torch.linalg.det, lambda: [make(2, 3, 3)]),
    ("slogdet", torch.linalg.slogdet, lambda: [make(2, 4, 4)]),
    ("logdet", torch.logdet, lambda: [spd(3, 3)]),
    ("inv", torch.linalg.inv, lambda: [make(2, 4, 4)]),
    ("inv_ex", torch.linalg.inv_ex, lambda: [make(4, 4)]),
    ("solve", torch.linalg.solve, lambda: [make(4, 4), make(4, 3)]),
    ("solve_vector", torch.linalg.solve, lambda: [make(2, 4, 4), make(2, 4)]),
    ("solve_broadcast", torch.linalg.solve, lambda: [make(4, 4), make(2, 4, 3)]),
    ("solve_right", lambda a, b: torch.linalg.solve(a, b, left=False), lambda: [make(2, 4, 4), make(3, 4)]),
    ("solve_ex", torch.linalg.solve_ex, lambda: [make(3, 3), make(3, 2)]),
    ("lu_factor", torch.linalg.lu_factor, lambda: [make(2, 4, 4)]),
    ("lu_factor_wide", torch.linalg.lu_factor, lambda: [make(3, 5)]),
    ("lu", torch.linalg.lu, lambda: [make(4, 4)]),
    ("lu_tall", torch.linalg.lu, lambda: [make(5, 3)]),
    ("lu_solve", lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b), lambda: [make(4, 4), make(4, 2)]),
    (
        "lu_solve_adjoint",
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True),
        lambda: [make(4, 4), make(4, 2)],
    ),
    (
        "lu_solve_right",
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=False),
        lambda: [make(4, 4), make(2, 4)],
    ),
    (
        "lu_solve_right_adjoint",
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=False, adjoint=True),
        lambda: [make(2, 4, 4), make(2, 4)],
    ),
    ("lu_unpack", lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), lambda: [make(4, 4)]),
    ("eigh", lambda s: (torch.linalg.eigh(s)[0], abs_columns(torch.linalg.eigh(s)[1])), lambda: [spd(4, 4)]),
    ("eigh_upper", lambda s: torch.linalg.eigh(s.triu(), UPLO="U")[0], lambda: [spd(2, 3, 3)]),
    ("eigvalsh", torch.linalg.eigvalsh, lambda: [spd(4, 4)]),
    ("svd", lambda a: [abs_columns(t) for t in torch.linalg.svd(a, full_matrices=False)], lambda: [make(5, 3)]),
    ("svd_full", lambda a: [abs_columns(t[..., :3, :]) for t in torch.linalg.svd(a)[::2]], lambda: [make(3, 5)]),
    ("svdvals", torch.linalg.svdvals, lambda: [make(2, 4, 3)]),
    ("qr", torch.linalg.qr, lambda: [make(5, 3)]),
    ("qr_complete", lambda a: torch.linalg.qr(a, mode="complete"), lambda: [make(3, 4)]),
    (
        "solve_triangular",
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
        lambda: [triangular(4, 4, upper=True), make(4, 2)],
    ),
    (
        "solve_triangular_right_lower",
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=False),
        lambda: [triangular(2, 4, 4, upper=False), make(3, 4)],
    ),
    (
        "solve_triangular_unit",
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
        lambda: [triangular(4, 4, upper=False), make(4, 2)],
    ),
    (
        "triangular_solve",
        lambda b, a: torch.triangular_solve(b, a, upper=False),
        lambda: [make(4, 2), triangular(4, 4, upper=False)],
    ),
    (
        "triangular_solve_transpose",
        lambda b, a: torch.triangular_solve(b, a, transpose=True),
        lambda: [make(2, 4, 2), triangular(4, 4, upper=True)],
    ),
    ("matrix_exp", lambda a: torch.linalg.matrix_exp(a / 4), lambda: [make(2, 3, 3)]),
    ("matrix_norm_fro", torch.linalg.matrix_norm, lambda: [make(3, 4)]),
    ("matrix_norm_inf", lambda a: torch.linalg.matrix_norm(a, math.inf), lambda: [make(3, 4)]),
    ("matrix_norm_nuc", lambda a: torch.linalg.matrix_norm(a, "nuc"), lambda: [make(3, 4)]),
    ("pinv", torch.linalg.pinv, lambda: [make(4, 3)]),
]


_REMOVED = pytest.mark.skipif(
    isinstance(compat.aten.cholesky, compat.AbsentOp), reason=f"torch {torch.__version__} removed torch.cholesky"
)


@pytest.mark.parametrize(
    "fn, inputs",
    [
        pytest.param(fn, inputs, id=name, marks=_REMOVED if name == "cholesky_legacy" else ())
        for name, fn, inputs in DECOMPOSITIONS
    ],
)
def test_decomposition(fn, inputs):
    check_op(fn, *inputs(), grad=True)


def test_complex_decompositions():
    x = torch.randn(3, 3, dtype=torch.complex64)
    h = x @ x.mH + 3 * torch.eye(3)
    check_op(
        lambda x, h: (
            torch.linalg.cholesky(h),
            torch.linalg.inv(x),
            torch.linalg.det(x),
            torch.linalg.slogdet(x),
            torch.linalg.solve(x, h),
            torch.linalg.eigvalsh(h),
            torch.linalg.svdvals(x),
        ),
        x,
        h,
    )


def test_qr_modes_without_grad():
    a = torch.randn(2, 4, 3)
    check_op(lambda a: (torch.linalg.qr(a, mode="complete"), torch.linalg.qr(a, mode="r")), a)


def test_singular():
    a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [4.0, 5.0, 7.0]])
    check_op(
        lambda a: (
            torch.linalg.det(a),
            torch.linalg.slogdet(a),
            torch.linalg.inv_ex(a)[1],
            torch.linalg.lu_factor_ex(a)[2],
        ),
        a,
    )
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(a.to("tpu"))


def test_not_positive_definite():
    a = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    assert torch.linalg.cholesky_ex(a.to("tpu")).info.item() != 0
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(a.to("tpu"))


def test_cholesky_reads_one_triangle():
    s = spd(3, 3).detach()
    noisy_upper = s.tril() + torch.randn(3, 3).triu(1)
    noisy_lower = s.triu() + torch.randn(3, 3).tril(-1)
    check_op(
        lambda a, b: (
            torch.linalg.cholesky(a),
            torch.linalg.cholesky(b, upper=True),
            torch.linalg.eigvalsh(a),
            torch.linalg.eigvalsh(b, UPLO="U"),
        ),
        noisy_upper,
        noisy_lower,
    )


def test_scalars_in_integer_products():
    """Integer products truncate beta and alpha (0.5 -> 0), as PyTorch does; bool addr reads them as truthy."""
    s, a, v = torch.randint(-4, 5, (3,)), torch.randint(-4, 5, (3, 4)), torch.randint(-4, 5, (4,))
    check_op(lambda s, a, v: (torch.addmv(s, a, v, beta=0.5, alpha=2.5), torch.addmv(s, a, v, beta=1.5)), s, a, v)
    b = torch.rand(3, 4) > 0.5, torch.rand(3) > 0.5, torch.rand(4) > 0.5
    check_op(lambda s, x, y: (torch.addr(s, x, y, beta=3, alpha=2), torch.addr(s, x, y, beta=0)), *b)


def test_empty_matrices():
    empty = torch.randn(2, 0, 0)
    check_op(
        lambda a: (
            torch.linalg.det(a),
            torch.linalg.slogdet(a),
            torch.linalg.inv(a),
            torch.linalg.cholesky_ex(a),
            torch.linalg.solve(a, a),
        ),
        empty,
    )


def test_householder():
    a, tau = make(5, 3), make(3)
    check_op(lambda x: torch.geqrf(x), a.detach())
    check_op(torch.linalg.householder_product, a, tau, grad=True)
    reflectors, taus = torch.geqrf(torch.randn(4, 4))
    other = make(4, 2)
    for left, transpose in ((True, False), (True, True), (False, False)):
        rhs = other if left else other.mT
        check_op(
            lambda r, t, c, left=left, transpose=transpose: torch.ormqr(r, t, c, left, transpose),
            reflectors,
            taus,
            rhs,
            grad=True,
        )


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, 3.0, math.inf])
def test_distances(p):
    check_op(lambda a, b: torch.cdist(a, b, p=p), make(2, 4, 3), make(5, 3), grad=p != 0)
    check_op(lambda a: torch.pdist(a, p=p), make(5, 3), grad=p != 0)


def test_cdist_matrix_product_form():
    """Over 25 rows, p = 2 distances come from one matrix product (PyTorch's CPU does the same)."""
    check_op(lambda a, b: torch.cdist(a, b), make(30, 4), make(7, 4), grad=True)
    check_op(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), make(3, 4), make(2, 4), grad=True)


@pytest.mark.parametrize("driver", [None, "gelsd", "gels"])
def test_lstsq(driver):
    check_op(lambda a, b: tuple(torch.linalg.lstsq(a, b, driver=driver)), make(2, 5, 3), make(2, 5, 2), grad=True)
    check_op(lambda a, b: torch.linalg.lstsq(a, b, driver=driver).solution, make(3, 5), make(3, 2))
    check_op(lambda a, b: torch.linalg.lstsq(a, b, driver=driver).solution, make(5, 3), make(5))


def test_eig():
    """Eigenvectors are normalized as LAPACK's (unit norm); compared up to their phase."""
    a = make(4, 4).detach()
    check_op(lambda x: (torch.linalg.eigvals(x), torch.linalg.eig(x)[0]), a)
    check_op(lambda x: torch.linalg.eig(x)[1].abs(), a)


def symmetric(*shape, dtype=FLOAT, hermitian=False):
    x = torch.randn(shape, dtype=dtype)
    return x + (x.mH if hermitian else x.mT)


@pytest.mark.parametrize("dtype, hermitian", [(FLOAT, False), (torch.complex64, False), (torch.complex64, True)])
def test_ldl_factor_and_solve(dtype, hermitian):
    """LD and pivots in LAPACK's format and pivot order (1x1 and 2x2 blocks, a zero column), then solves."""
    a = symmetric(3, 6, 6, dtype=dtype, hermitian=hermitian)
    a[1, 0, :] = a[1, :, 0] = 0
    a[2, 0, 0] = 0  # forces a 2x2 pivot block
    check_op(lambda x: torch.linalg.ldl_factor_ex(x, hermitian=hermitian), a)
    check_op(lambda x: torch.linalg.ldl_factor(x, hermitian=hermitian), a[2])
    full_rank = a[[0, 2]]
    factors = torch.linalg.ldl_factor(full_rank, hermitian=hermitian)
    check_op(
        lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b, hermitian=hermitian), *factors, torch.randn(6, 3, dtype=dtype)
    )


def test_matrix_exp_bf16():
    """Computed in float32 and rounded; compared with CPU's float32 result, as CPU's own bf16 kernel overflows."""
    a = (torch.randn(2, 4, 4) / 4).to(BF16)
    assert_close(torch.linalg.matrix_exp(a.to("tpu")), torch.linalg.matrix_exp(a.float()).to(BF16))


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (torch.mm, [(3, 4), (4, 5)]),
        (torch.bmm, [(2, 3, 4), (2, 4, 5)]),
        (torch.addmm, [(3, 5), (3, 4), (4, 5)]),
        (torch.mv, [(3, 4), (4,)]),
        (torch.matmul, [(2, 3, 4), (2, 4, 5)]),
        (torch.nn.functional.linear, [(3, 4), (5, 4)]),
    ],
    ids=["mm", "bmm", "addmm", "mv", "matmul", "linear"],
)
def test_operands_of_two_dtypes_raise_cpus_error(fn, shapes):
    """CPU's kernels refuse a float32 operand beside a bfloat16 one (the meta kernels let it through)."""
    args = [torch.randn(shape, dtype=BF16 if i == len(shapes) - 1 else FLOAT) for i, shape in enumerate(shapes)]
    with pytest.raises(RuntimeError) as on_cpu:
        fn(*args)
    with pytest.raises(RuntimeError, match=re.escape(str(on_cpu.value))):
        fn(*(a.to("tpu") for a in args))


def test_linear_and_matmul_where_an_exported_graph_keeps_them():
    """`torch.export` leaves `aten::linear` and `aten::matmul` whole (they have tpu kernels): their graph
    lowerings give CPU's values, broadcasting and 1-d operands included, and the module exports."""
    import jax.numpy as jnp
    import numpy as np

    from torch_tpu.ops.registry import graph_lowering

    torch.manual_seed(0)
    as_jax = lambda t: jnp.asarray(t.numpy())
    x, weight, bias = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    linear = graph_lowering(aten.linear.default).fn
    got = torch.from_numpy(np.asarray(linear(as_jax(x), as_jax(weight), as_jax(bias))))
    assert_close(got, torch.nn.functional.linear(x, weight, bias))
    matmul = graph_lowering(aten.matmul.default).fn
    for a, b in ((torch.randn(2, 1, 3, 4), torch.randn(5, 4, 2)), (torch.randn(4), torch.randn(2, 4, 3))):
        assert_close(torch.from_numpy(np.asarray(matmul(as_jax(a), as_jax(b)))), a @ b)
    text = torch_tpu.export_stablehlo(torch.nn.Linear(4, 2).to("tpu"), (torch.ones(3, 4, device="tpu"),))
    assert "stablehlo.dot_general" in text
