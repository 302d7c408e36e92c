"""Lowerings: matrix products (the GEMM family) and dense linear algebra.

fp32 products run at the precision in force (`torch_tpu.precision`; full fp32 by default, as on PyTorch's
CPU); bf16/fp16 products accumulate in float32 and the result is rounded once, and integer products accumulate in
int32 (up to 32 bits) or int64 (wrap-around matches the narrow type's; the TPU has no int64 dot). The dispatcher
casts each result to PyTorch's output dtype.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu import precision
from torch_tpu.ops import emulated
from torch_tpu.ops.registry import aten, lower, lower_in_graphs
from torch_tpu.runtime import dtypes, float64, platform


def _accumulator(*arrays):
    return dtypes.accumulation_dtype(jnp.result_type(*arrays))


def _dot_accumulator(a, b):
    """The dtype a matrix product of `a` and `b` accumulates in. Integers (and bools) of up to 32 bits accumulate in
    int32: the product's dtype is its operands', which an int32 sum truncates to exactly as an int64 one does (both
    wrap modulo a power of two), and XLA's TPU backend has no 64-bit integer dot; int64 operands raise there."""
    dtype = jnp.result_type(a, b)
    if not dtypes.is_integral(dtype):
        return dtypes.accumulation_dtype(dtype)
    if np.dtype(dtype).itemsize < 4 or np.dtype(dtype) == np.int32:
        return np.dtype(np.int32)
    if platform.platform() == "tpu":
        raise float64.Unsupported(
            f"torch_tpu: matrix products of {np.dtype(dtype).name} tensors are not supported on the TPU (XLA has no "
            "64-bit integer dot there); compute them in int32 or a float dtype, or on CPU (`.cpu()`)"
        )
    return dtypes.accumulation_dtype(dtype)


def _one_dtype(a, b) -> None:
    """Operands of two dtypes raise (CPU's kernels refuse them; the dispatcher then raises CPU's own error)
    instead of promoting."""
    if a.dtype != b.dtype:
        raise TypeError(f"torch_tpu: a matrix product of {a.dtype} and {b.dtype} operands")


def _product(spec, a, b):
    """einsum `spec` of `a` and `b` at the precision in force, in the accumulator dtype (`_one_dtype`)."""
    _one_dtype(a, b)
    return jnp.einsum(spec, a, b, precision=precision.for_dot(), preferred_element_type=_dot_accumulator(a, b))


def _blend(self, product, beta, alpha):
    """beta * self + alpha * product, with beta and alpha in the product's dtype (an integer product truncates
    them, as PyTorch does); beta == 0 ignores `self` (NaN and inf included)."""
    beta, alpha = jnp.asarray(beta).astype(product.dtype), jnp.asarray(alpha).astype(product.dtype)
    scaled = beta * jnp.asarray(self).astype(product.dtype)
    return jnp.where(beta == 0, jnp.zeros_like(scaled), scaled) + alpha * product


def _product_lowering(spec, self, other, out_dtype=None):
    return _product(spec, self, other)


def _blend_lowering(spec, self, a, b, out_dtype=None, *, beta=1, alpha=1):
    return _blend(self, _product(spec, a, b), beta, alpha)


# The GEMM family: each op the einsum `spec` of its two operands; the `add` ops blend it into `self`.
for _ops, _spec, _blends in (
    ((aten.mm.default, aten.mm.dtype, aten._int_mm.default), "ij,jk->ik", False),
    ((aten.bmm.default, aten.bmm.dtype), "bij,bjk->bik", False),
    ((aten.mv.default,), "ij,j->i", False),
    ((aten.dot.default,), "i,i->", False),
    ((aten.addmm.default, aten.addmm.dtype), "ij,jk->ik", True),
    ((aten.baddbmm.default, aten.baddbmm.dtype), "bij,bjk->bik", True),
    ((aten.addbmm.default,), "bij,bjk->ik", True),
    ((aten.addmv.default,), "ij,j->i", True),
):
    lower(*_ops)(functools.partial(_blend_lowering if _blends else _product_lowering, _spec))


def batched_product(a, b):
    """The matrix product of two operands of one batch shape (`torch_tpu::matmul`, kernels.prebuilt.matmul): one
    dot over the operands as they are stored, at the precision in force, in the accumulator dtype."""
    return _product("...ij,...jk->...ik", a, b)


def linear_product(x, weight, bias=None):
    """`x @ weight.T + bias` as `addmm` computes it (`torch_tpu::linear`, kernels.prebuilt.linear): one dot over the
    operands as stored, the bias added to its accumulator-dtype result."""
    product = _product("...i,oi->...o", x, weight)
    return product if bias is None else product + jnp.asarray(bias).astype(product.dtype)


# `aten::linear` where an exported graph keeps it: kernels.prebuilt.linear gives it tpu kernels, and
# `torch.export`'s decompositions leave an op with a backend kernel whole.
lower_in_graphs(aten.linear.default)(linear_product)


@lower_in_graphs(aten.matmul.default)
def _matmul_in_graphs(self, other):
    """`aten::matmul` where an exported graph keeps it (kernels.prebuilt.matmul), with its broadcasting."""
    _one_dtype(self, other)
    accumulator = _dot_accumulator(self, other)
    return jnp.matmul(self, other, precision=precision.for_dot(), preferred_element_type=accumulator)


def linear_gradients(grad, x, weight, wanted):
    """The gradients of `linear_product` for x, weight and bias as its backward's products and sum compute them
    (`wanted`: which; an unwanted one is an empty array)."""
    rows = grad.reshape(-1, grad.shape[-1])
    empty = jnp.zeros((0,), grad.dtype)
    grad_x = _product("...o,oi->...i", grad, weight) if wanted[0] else empty
    grad_weight = _product("no,ni->oi", rows, x.reshape(-1, x.shape[-1])) if wanted[1] else empty
    grad_bias = jnp.sum(rows.astype(_accumulator(rows)), axis=0) if wanted[2] else empty
    return grad_x, grad_weight, grad_bias


@lower(aten._addmm_activation.default)
def _addmm_activation(self, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    result = _blend(self, _product("ij,jk->ik", mat1, mat2), beta, alpha)
    return jax.nn.gelu(result, approximate=False) if use_gelu else jax.nn.relu(result)


@lower(aten.vdot.default)
def vdot(self, other):
    return _product("i,i->", jnp.conj(self), other)


@lower(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    if vec1.dtype == jnp.bool_:
        return (jnp.asarray(beta) != 0) & self | (jnp.asarray(alpha) != 0) & vec1[:, None] & vec2[None, :]
    wide = _accumulator(vec1, vec2)
    return _blend(self, vec1.astype(wide)[:, None] * vec2.astype(wide)[None, :], beta, alpha)


@lower(aten.trace.default)
def trace(self):
    return jnp.trace(self.astype(_accumulator(self)))


@lower(aten.diag_embed.default)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    length = self.shape[-1]
    size = length + abs(offset)
    index = jnp.arange(length)
    rows, cols = (index, index + offset) if offset >= 0 else (index - offset, index)
    square = jnp.zeros(self.shape[:-1] + (size, size), self.dtype).at[..., rows, cols].set(self)
    ndim = self.ndim + 1
    return jnp.moveaxis(square, (-2, -1), (dim1 % ndim, dim2 % ndim))


@lower(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    a, b = jnp.broadcast_arrays(self, other)
    return jnp.cross(a, b, axis=dim)


def _transpose(x):
    return jnp.swapaxes(x, -1, -2)


def _adjoint(x):
    return jnp.conj(_transpose(x))


def _batch_broadcast(a, b):
    """`a` and `b` with their batch (all but the last two) dimensions broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _cholesky(a, upper):
    """Cholesky factor read from one triangle of `a` only (the lower, or the upper when `upper`), as LAPACK."""
    lower = jax.lax.linalg.cholesky(_adjoint(a) if upper else a, symmetrize_input=False)
    return _adjoint(lower) if upper else lower


def _first_failure(failed):
    """LAPACK-style info: 1 + the first index where `failed` holds along the last axis, or 0."""
    if failed.shape[-1] == 0:
        return jnp.zeros(failed.shape[:-1], jnp.int32)
    index = jnp.argmax(failed, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(failed, axis=-1), index, 0)


@lower(aten.cholesky.default)
def cholesky(self, upper=False):
    return _cholesky(self, upper)


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    """NOTE: a non-positive-definite input gives NaN factors, not LAPACK's partial ones; info may be too small."""
    factor = _cholesky(self, upper)
    diagonal = jnp.diagonal(factor, axis1=-2, axis2=-1)
    return factor, _first_failure(~jnp.isfinite(diagonal))


@lower(aten.cholesky_solve.default)
def cholesky_solve(self, input2, upper=False):
    factor, rhs = _batch_broadcast(input2, self)
    lower = _adjoint(factor) if upper else factor
    half = jax.lax.linalg.triangular_solve(lower, rhs, left_side=True, lower=True)
    return jax.lax.linalg.triangular_solve(lower, half, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    identity = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return cholesky_solve(identity, self, upper)


def _lu(a):
    """(LU, 1-based int32 pivots, info) of partial-pivoting LU, as LAPACK's getrf."""
    lu, pivots, _ = jax.lax.linalg.lu(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, pivots + 1, _first_failure(diagonal == 0)


def _lu_solve(lu, pivots, b, adjoint):
    """Solve A X = B (A^H X = B when `adjoint`) for A = P L U given by LAPACK-style `lu` and `pivots`."""
    lu, b = _batch_broadcast(lu, b)
    size = lu.shape[-1]
    pivots = jnp.broadcast_to(pivots, lu.shape[:-2] + pivots.shape[-1:])
    permutation = jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, size)
    solve = jax.lax.linalg.triangular_solve
    if not adjoint:
        b = jnp.take_along_axis(b, permutation[..., None], axis=-2)
        y = solve(lu, b, left_side=True, lower=True, unit_diagonal=True)
        return solve(lu, y, left_side=True, lower=False)
    y = solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    z = solve(lu, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True, unit_diagonal=True)
    inverse = jnp.argsort(permutation, axis=-1)
    return jnp.take_along_axis(z, inverse[..., None], axis=-2)


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the TPU")
    return _lu(A)


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    if left:
        return _lu_solve(LU, pivots, B, adjoint)
    return _adjoint(_lu_solve(LU, pivots, _adjoint(B), not adjoint))


def _unpack_permutation(pivots, size, dtype):
    permutation = jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, size)
    return jnp.swapaxes(jax.nn.one_hot(permutation, size, dtype=dtype), -1, -2)


def _unpack_factors(lu):
    rows, cols = lu.shape[-2:]
    k = min(rows, cols)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(rows, k, dtype=lu.dtype)
    return lower, jnp.triu(lu[..., :k, :])


@lower(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    empty = jnp.zeros((0,), LU_data.dtype)
    permutation = _unpack_permutation(LU_pivots, LU_data.shape[-2], LU_data.dtype) if unpack_pivots else empty
    lower, upper = _unpack_factors(LU_data) if unpack_data else (empty, empty)
    return permutation, lower, upper


@lower(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    lu, pivots, _ = linalg_lu_factor_ex(A, pivot=pivot)
    return lu_unpack(lu, pivots)


def _det_from_lu(lu, pivots):
    size = lu.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, size + 1, dtype=pivots.dtype), axis=-1)
    sign = jnp.where(swaps % 2 == 0, 1, -1).astype(lu.dtype)
    return sign, jnp.diagonal(lu, axis1=-2, axis2=-1)


def _det_lu(A):
    """LU of A as PyTorch's CPU kernel returns it for det/slogdet: of A^T for real A (its contiguous-input path,
    which the backward assumes for contiguous A), of A itself for complex A."""
    return _lu(A if dtypes.is_complex(A.dtype) else _transpose(A))


@lower(aten._linalg_det.default)
def _linalg_det(A):
    """NOTE: backward is correct for contiguous or complex A only (PyTorch's formula reads A's strides)."""
    lu, pivots, _ = _det_lu(A)
    sign, diagonal = _det_from_lu(lu, pivots)
    return sign * jnp.prod(diagonal, axis=-1), lu, pivots


@lower(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    """NOTE: backward is correct for contiguous or complex A only (PyTorch's formula reads A's strides)."""
    lu, pivots, _ = _det_lu(A)
    sign, diagonal = _det_from_lu(lu, pivots)
    magnitude = jnp.abs(diagonal)
    phase = diagonal / jnp.where(magnitude == 0, 1, magnitude).astype(diagonal.dtype)
    sign = jnp.where(jnp.any(magnitude == 0, axis=-1), 0, sign * jnp.prod(phase, axis=-1))
    return sign, jnp.sum(emulated.single_log(magnitude), axis=-1), lu, pivots  # 1×1 in float64: ops/emulated.py


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
    lu, pivots, info = _lu(A)
    identity = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, pivots, identity, adjoint=False), info


def _is_vector_rhs(A, B):
    """Whether B is a (batch of) vector(s) rather than matrices, by PyTorch's rule for solvers."""
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    lu, pivots, info = _lu(A)
    vector = _is_vector_rhs(A, B)
    rhs = B[..., None] if vector else B
    result = linalg_lu_solve(lu, pivots, rhs, left=left)
    return (result[..., 0] if vector else result), lu, pivots, info


def _least_squares(a, b, rcond):
    """(minimum-norm least-squares solution, singular values, rank) for one matrix `a`."""
    u, singular, vh = jnp.linalg.svd(a, full_matrices=False)
    cutoff = rcond * singular[..., :1]
    kept = singular > cutoff
    inverse = jnp.where(kept, 1 / jnp.where(kept, singular, 1), 0)
    solution = _adjoint(vh) @ (inverse[:, None] * (_adjoint(u) @ b))
    return solution, singular, jnp.sum(kept).astype(jnp.int64)


@lower(aten.linalg_lstsq.default)
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """NOTE: solved through the SVD whatever `driver` (same solution for full-rank inputs); residuals assume
    full rank, which PyTorch checks on the data."""
    vector = _is_vector_rhs(self, b)
    rhs = b[..., None] if vector else b
    a, rhs = _batch_broadcast(self, rhs)
    rows, cols = a.shape[-2:]
    rcond = jnp.finfo(a.dtype).eps * max(rows, cols) if rcond is None else rcond
    solve = functools.partial(_least_squares, rcond=rcond)
    for _ in a.shape[:-2]:
        solve = jax.vmap(solve)
    solution, singular, rank = solve(a, rhs)
    driver = driver or "gelsy"
    empty = jnp.zeros((0,), a.dtype)
    residuals = empty
    if rows > cols and driver != "gelsy":
        residual = jnp.abs(a @ solution - rhs)
        residuals = jnp.sum(residual * residual, axis=-2)
        residuals = residuals[..., 0] if vector else residuals
    singular = singular if driver in ("gelsd", "gelss") else empty
    rank = rank if driver != "gels" else jnp.zeros((0,), jnp.int64)
    return (solution[..., 0] if vector else solution), residuals, rank, singular


@lower(aten.linalg_eig.default)
def linalg_eig(self):
    """NOTE: XLA has a non-symmetric eigensolver on its CPU platform only."""
    values, vectors = jax.lax.linalg.eig(self, compute_left_eigenvectors=False)
    return values, vectors


@lower(aten._linalg_eigvals.default)
def _linalg_eigvals(self):
    """NOTE: XLA has a non-symmetric eigensolver on its CPU platform only."""
    return jax.lax.linalg.eig(self, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]


@lower(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    A, B = _batch_broadcast(A, self)
    solution = jax.lax.linalg.triangular_solve(
        A, B, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return solution, A


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    A, B = _batch_broadcast(self, B)
    return jax.lax.linalg.triangular_solve(A, B, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lower(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    vectors, values = jax.lax.linalg.eigh(A, lower=UPLO.upper() == "L", symmetrize_input=False)
    return values, vectors if compute_v else jnp.zeros((0,), A.dtype)


@lower(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        empty = jnp.zeros((0,), A.dtype)
        return empty, jnp.linalg.svd(A, compute_uv=False), empty
    return jnp.linalg.svd(A, full_matrices=full_matrices)


@lower(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), A.dtype), jnp.linalg.qr(A, mode="r")
    return jnp.linalg.qr(A, mode=mode)


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    """16-bit floats (which JAX's expm does not take) are exponentiated in float32, then rounded."""
    return jax.scipy.linalg.expm(self.astype(_accumulator(self)))


@lower(aten.geqrf.default)
def geqrf(self):
    reflectors, tau = jnp.linalg.qr(self, mode="raw")
    return _transpose(reflectors), tau


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
    return jax.lax.linalg.householder_product(input, tau)


@lower(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    reflectors = self[..., : min(self.shape[-2:])]
    return jax.lax.linalg.ormqr(reflectors, input2, input3, left=left, transpose=transpose)


_BUNCH_KAUFMAN = (1 + 17**0.5) / 8  # LAPACK's pivot threshold: bounds the growth of the factors


def _abs1(x):
    """LAPACK's pivoting magnitude: |x| for real x, |Re x| + |Im x| for complex x (CABS1)."""
    return jnp.abs(x.real) + jnp.abs(x.imag) if dtypes.is_complex(x.dtype) else jnp.abs(x)


def _mirrored(work, conj):
    """`work` with its strict upper triangle replaced by the (conjugate) transpose of its lower one."""
    index = jnp.arange(work.shape[-1])
    return jnp.where(index[:, None] >= index[None, :], work, conj(_transpose(work)))


def _ldl_pivot(work, k, index):
    """LAPACK's Bunch-Kaufman choice at column `k` of the symmetric trailing matrix `work`: (kp, two, singular):
    the row to swap in, whether a 2x2 block is used, and whether column k is zero or NaN."""
    trailing, below = index >= k, index > k
    absakk = _abs1(work[k, k])
    off = jnp.where(below, _abs1(work[:, k]), -1)
    imax = jnp.argmax(off)
    colmax = jnp.maximum(off[imax], 0)
    rowmax = jnp.max(jnp.where(trailing & (index != imax), _abs1(work[imax]), 0))
    singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
    keep = (absakk >= _BUNCH_KAUFMAN * colmax) | (absakk >= _BUNCH_KAUFMAN * colmax * (colmax / rowmax))
    swap_one = _abs1(work[imax, imax]) >= _BUNCH_KAUFMAN * rowmax
    kp = jnp.where(singular | keep, k, imax)
    return kp, ~singular & ~keep & ~swap_one, singular


def _ldl_eliminate(work, k, two, index, conj):
    """`work` after eliminating the pivot block at `k` (1x1, or 2x2 when `two`): the trailing matrix loses
    W D^-1 W^T (W^H when hermitian) and the columns below the block become L = W D^-1."""
    rest = index >= k + 1 + two
    k1 = jnp.minimum(k + 1, work.shape[-1] - 1)  # the block's second column (read only when `two`)
    a11, a22, b = work[k, k], work[k1, k1], work[k1, k]
    first = jnp.where(rest, work[:, k], 0)
    second = jnp.where(rest & two, work[:, k1], 0)
    det = jnp.where(two, a11 * a22 - b * conj(b), a11)
    l_first = jnp.where(two, first * a22 - second * b, first) / det
    l_second = jnp.where(two, (second * a11 - first * conj(b)) / det, 0)
    update = first[:, None] * conj(l_first)[None, :] + second[:, None] * conj(l_second)[None, :]
    inside = rest[:, None] & rest[None, :]
    work = jnp.where(inside, work - update, work)
    work = work.at[:, k].set(jnp.where(rest, l_first, work[:, k]))
    return work.at[:, k1].set(jnp.where(rest & two, l_second, work[:, k1]))


def _ldl_factor(a, hermitian):
    """(LD, 1-based int32 pivots, info) of the Bunch-Kaufman factorization P A P^T = L D L^T (L D L^H when
    `hermitian`) of one square matrix from its lower triangle, in the format and pivot order of LAPACK's
    sytf2/hetf2 (what PyTorch returns, and what `ldl_solve` reads)."""
    size = a.shape[-1]
    if size == 0:
        return a, jnp.zeros((0,), jnp.int32), jnp.zeros((), jnp.int32)
    conj = jnp.conj if hermitian and dtypes.is_complex(a.dtype) else (lambda x: x)
    index = jnp.arange(size)
    work = _mirrored(a, conj)
    if conj is jnp.conj:
        work = _set_diagonal(work, jnp.diagonal(work).real)

    def step(state):
        k, work, pivots, info = state
        kp, two, singular = _ldl_pivot(work, k, index)
        kk = k + two
        order = index.at[kk].set(kp).at[kp].set(kk)
        trailing = (index[:, None] >= k) & (index[None, :] >= k)
        work = jnp.where(trailing, work[order][:, order], work)
        work = jnp.where(singular, work, _mirrored(_ldl_eliminate(work, k, two, index, conj), conj))
        if conj is jnp.conj:
            work = _set_diagonal(work, jnp.diagonal(work).real)
        pivot = jnp.where(two, -(kp + 1), kp + 1).astype(jnp.int32)
        second = jnp.minimum(k + 1, size - 1)
        pivots = pivots.at[second].set(jnp.where(two, pivot, pivots[second])).at[k].set(pivot)
        info = jnp.where(singular & (info == 0), k + 1, info).astype(jnp.int32)
        return k + 1 + two, work, pivots, info

    start = (jnp.zeros((), jnp.int32), work, jnp.zeros((size,), jnp.int32), jnp.zeros((), jnp.int32))
    _, work, pivots, info = jax.lax.while_loop(lambda state: state[0] < size, step, start)
    return jnp.tril(work), pivots, info


def _set_diagonal(x, diagonal):
    index = jnp.arange(x.shape[-1])
    return x.at[index, index].set(diagonal.astype(x.dtype))


def _batched(fn, batch_dims):
    for _ in range(batch_dims):
        fn = jax.vmap(fn)
    return fn


@lower(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    """NOTE: unblocked, as LAPACK's sytf2: one loop step of O(n^2) work per pivot block."""
    factor = functools.partial(_ldl_factor, hermitian=hermitian)
    return _batched(factor, self.ndim - 2)(self)


def _swap_rows(b, i, j):
    index = jnp.arange(b.shape[0])
    return b[index.at[i].set(j).at[j].set(i)]


def _ldl_solve(ld, pivots, b, hermitian):
    """X with A X = B for A factored by `_ldl_factor` (LAPACK's sytrs/hetrs): L D y = P B forward, block by
    block, then L^T X = y (L^H when `hermitian`) backward, undoing the interchanges."""
    size = ld.shape[-1]
    conj = jnp.conj if hermitian and dtypes.is_complex(ld.dtype) else (lambda x: x)
    index = jnp.arange(size)

    def forward(state):
        k, b = state
        two = pivots[k] < 0
        second = jnp.minimum(k + 1, size - 1)
        b = _swap_rows(b, k + two, jnp.abs(pivots[k]) - 1)
        first_column = jnp.where(index > k + two, ld[:, k], 0)
        second_column = jnp.where((index > k + 1) & two, ld[:, second], 0)
        b = b - first_column[:, None] * b[k] - second_column[:, None] * b[second]
        a11, a22, off = ld[k, k], ld[second, second], ld[second, k]
        det = a11 * a22 - off * conj(off)
        one_row = b[k] / a11
        two_first = (a22 * b[k] - conj(off) * b[second]) / det
        two_second = (a11 * b[second] - off * b[k]) / det
        b = b.at[k].set(jnp.where(two, two_first, one_row))
        return k + 1 + two, b.at[second].set(jnp.where(two, two_second, b[second]))

    def backward(state):
        k, b = state
        two = pivots[k] < 0
        first = jnp.maximum(k - 1, 0)
        below = (index > k)[:, None]
        b = b.at[k].add(-jnp.sum(jnp.where(below, conj(ld[:, k])[:, None] * b, 0), axis=0))
        correction = jnp.sum(jnp.where(below, conj(ld[:, first])[:, None] * b, 0), axis=0)
        b = b.at[first].add(jnp.where(two, -correction, 0))
        return k - 1 - two, _swap_rows(b, k, jnp.abs(pivots[k]) - 1)

    zero = jnp.zeros((), jnp.int32)
    _, b = jax.lax.while_loop(lambda state: state[0] < size, forward, (zero, b))
    _, b = jax.lax.while_loop(lambda state: state[0] >= 0, backward, (zero + size - 1, b))
    return b


@lower(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    LD, B = _batch_broadcast(LD, B)
    pivots = jnp.broadcast_to(pivots, LD.shape[:-1])
    solve = functools.partial(_ldl_solve, hermitian=hermitian)
    return _batched(solve, LD.ndim - 2)(LD, pivots, B.astype(LD.dtype))


def _euclidean_dist(x1, x2):
    """PyTorch's `_euclidean_dist`: |x1|^2 - 2 x1.x2 + |x2|^2 as one matrix product, clamped at 1e-30, rooted."""
    norm1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    norm2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    left = jnp.concatenate([-2 * x1, norm1, jnp.ones_like(norm1)], axis=-1)
    right = jnp.concatenate([x2, jnp.ones_like(norm2), norm2], axis=-1)
    return jnp.sqrt(jnp.maximum(_product("...ik,...jk->...ij", left, right), 1e-30))


@lower(aten._euclidean_dist.default)
def _euclidean_dist_lowering(x1, x2):
    return _euclidean_dist(x1, x2)


def _sum_to(x, shape):
    """`x` summed down to `shape`, which broadcasts to `x.shape` (a broadcast input's gradient)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(shape) if n == 1 and x.shape[lead + d] != 1)
    return jnp.sum(x, axis=axes).reshape(shape)


def _pairwise_differences(x1, x2):
    x1, x2 = _batch_broadcast(x1, x2)
    return x1[..., :, None, :] - x2[..., None, :, :]


def _p_norm(diff, p):
    """The p-norm of each row of `diff` (last axis): p = 0 counts non-zeros, p = inf takes the largest."""
    diff = jnp.abs(diff)
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(diff.dtype)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    if p == float("inf"):
        return jnp.max(diff, axis=-1, initial=0)
    return emulated.single_power(jnp.sum(emulated.power(diff, p), axis=-1), 1 / p)  # float64: ops/emulated.py


def _p_norm_grad(grad, diff, norm, p):
    """grad * d norm / d diff for rows `diff` of norms `norm`, zero where a norm is zero (PyTorch's formulas)."""
    grad, norm = grad[..., None], norm[..., None]
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return grad * jnp.sign(diff)
    if p == 2:
        return jnp.where(norm == 0, 0, grad * diff / jnp.where(norm == 0, 1, norm))
    if p == float("inf"):
        return grad * jnp.sign(diff) * (jnp.abs(diff) == norm)
    safe = jnp.where(norm == 0, 1, norm)
    magnitude = jnp.abs(diff)
    power = emulated.power(magnitude, p - 1) if p < 2 else diff * emulated.power(magnitude, p - 2)
    terms = (jnp.sign(diff) if p < 2 else 1) * power * grad / emulated.power(safe, p - 1)
    return jnp.where((norm == 0) | ((diff == 0) & (p < 1)), 0, terms)


@lower(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode=None):
    """As PyTorch's CPU: p = 2 uses the matrix-product form when `compute_mode` asks (1) or allows it (None or
    0) for more than 25 rows, else each distance is summed from the differences."""
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and max(x1.shape[-2], x2.shape[-2]) > 25)):
        return _euclidean_dist(*_batch_broadcast(x1, x2))
    return _p_norm(_pairwise_differences(x1, x2), p)


@lower(aten._cdist_backward.default)
def _cdist_backward(grad, x1, x2, p, cdist):
    """The gradient w.r.t. x1."""
    terms = _p_norm_grad(grad, _pairwise_differences(x1, x2), cdist, p)
    return _sum_to(jnp.sum(terms, axis=-2), x1.shape)


def _pairs(rows):
    """Row indices (i, j), i < j, in the order of pdist's condensed output."""
    return np.triu_indices(rows, 1)


@lower(aten._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    first, second = _pairs(self.shape[0])
    return _p_norm(self[first] - self[second], p)


@lower(aten._pdist_backward.default)
def _pdist_backward(grad, self, p, pdist):
    first, second = _pairs(self.shape[0])
    terms = _p_norm_grad(grad, self[first] - self[second], pdist, p)
    return jnp.zeros_like(self).at[first].add(terms).at[second].add(-terms)
