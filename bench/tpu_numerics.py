"""The device's numerics, measured against CPU PyTorch: what docs/numerics.md quotes for each platform.

Sections (all by default; `--sections matmul,float64`):
  matmul          fp32 matmul and conv2d error against a float64 reference at each `torch.tpu.Precision`
                  (DEFAULT / HIGH / HIGHEST), beside CPU PyTorch's own fp32 error
  transcendental  fp32 elementwise functions: worst error in float32 ulps against float64, tpu beside CPU
  subnormal       whether float32 / bfloat16 / float64 subnormal results survive (XLA flushes them to zero)
  bf16            bfloat16 elementwise bit-equality with CPU, a bf16 matmul's and a long bf16 sum's error
  float64         every op of the OpInfo subset (tests/test_opinfo.py's FORWARD list) in float64 on `tpu`
                  against CPU float64: "exact" (relative error < 1e-13), "double-float" (< 1e-9: emulated with a
                  pair of float32s), "float32" (worse: a silent float32 result), or the error it raised; plus
                  float64's range on the device (1e300 * 10, 1e-300 * 1e-10), and float64_rank's figures
  float64_rank    a few float64 ops on 0-d and on 1-d values, and where a 0-d float64 `exp` loses accuracy
Prints one line per figure and, with --json, writes them all.

    python bench/tpu_numerics.py [--sections ...] [--json numerics.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repository root, not bench/

import torch_tpu  # noqa: E402,F401  (the backend; `import torch` autoloads it where it is installed)

RESULTS: dict[str, Any] = {}


def _record(section: str, name: str, value: Any) -> None:
    RESULTS.setdefault(section, {})[name] = value
    print(f"{section:15s} {name:38s} {value}")


def _relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """max |actual - reference| / max |reference| (a matrix product's error scale)."""
    actual, reference = actual.detach().cpu().double(), reference.detach().cpu().double()
    return float((actual - reference).abs().max() / reference.abs().max().clamp_min(1e-300))


def matmul() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(512, 2048), torch.randn(2048, 512)
    x, w = torch.randn(8, 64, 32, 32), torch.randn(64, 64, 3, 3)
    exact_mm = a.double() @ b.double()
    exact_conv = F.conv2d(x.double(), w.double(), padding=1)
    _record("matmul", "cpu fp32 mm 512x2048x512", f"{_relative_error(a @ b, exact_mm):.2e}")
    _record("matmul", "cpu fp32 conv2d 3x3 64ch", f"{_relative_error(F.conv2d(x, w, padding=1), exact_conv):.2e}")
    ta, tb, tx, tw = (t.to("tpu") for t in (a, b, x, w))
    for level in torch.tpu.Precision:
        with torch.tpu.precision(level):
            mm = _relative_error(ta @ tb, exact_mm)
            conv = _relative_error(F.conv2d(tx, tw, padding=1), exact_conv)
        _record("matmul", f"tpu fp32 mm {level.name}", f"{mm:.2e}")
        _record("matmul", f"tpu fp32 conv2d {level.name}", f"{conv:.2e}")
    for name in ("medium", "high", "highest"):
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(name)
        try:
            _record(
                "matmul",
                f"tpu fp32 mm set_float32_matmul_precision({name})",
                f"{_relative_error(ta @ tb, exact_mm):.2e}",
            )
        finally:
            torch.set_float32_matmul_precision(previous)


def _ulps(actual: torch.Tensor, reference64: torch.Tensor) -> float:
    """Worst distance in float32 ulps of the reference, where the reference is finite and at least 1e-6 in
    magnitude (below, a function like gelu(-10) ~ -8e-23 is all cancellation, on CPU too: ulps mean nothing)."""
    actual, reference64 = actual.detach().cpu().double(), reference64.double()
    finite = torch.isfinite(reference64) & torch.isfinite(actual) & (reference64.abs() >= 1e-6)
    spacing = torch.from_numpy(np.spacing(np.abs(reference64.float().numpy()))).double().clamp_min(2.0**-149)
    return float(((actual - reference64).abs() / spacing)[finite].max()) if finite.any() else float("nan")


_FUNCTIONS: dict[str, tuple[Callable, tuple[float, float]]] = {
    "exp": (torch.exp, (-80.0, 80.0)),
    "expm1": (torch.expm1, (-5.0, 5.0)),
    "log": (torch.log, (1e-6, 1e6)),
    "log1p": (torch.log1p, (-0.9, 10.0)),
    "tanh": (torch.tanh, (-10.0, 10.0)),
    "sigmoid": (torch.sigmoid, (-20.0, 20.0)),
    "erf": (torch.erf, (-4.0, 4.0)),
    "sin": (torch.sin, (-100.0, 100.0)),
    "cos": (torch.cos, (-100.0, 100.0)),
    "sqrt": (torch.sqrt, (0.0, 1e6)),
    "rsqrt": (torch.rsqrt, (1e-6, 1e6)),
    "reciprocal": (torch.reciprocal, (0.01, 100.0)),
    "pow(x, 2.5)": (lambda t: torch.pow(t, 2.5), (0.0, 100.0)),
    "gelu(tanh)": (lambda t: F.gelu(t, approximate="tanh"), (-3.0, 10.0)),
    "gelu": (F.gelu, (-3.0, 10.0)),
    "silu": (F.silu, (-20.0, 20.0)),
    "softmax": (lambda t: torch.softmax(t.reshape(-1, 256), -1), (-30.0, 30.0)),
    "log_softmax": (lambda t: torch.log_softmax(t.reshape(-1, 256), -1), (-30.0, 30.0)),
}


def transcendental() -> None:
    for name, (fn, (low, high)) in _FUNCTIONS.items():
        x = torch.linspace(low, high, 65536)
        reference = fn(x.double())
        cpu = _ulps(fn(x), reference)
        tpu = _ulps(fn(x.to("tpu")), reference)
        _record("transcendental", name, f"tpu {tpu:.1f} ulp, cpu {cpu:.1f} ulp")


def subnormal() -> None:
    for dtype, tiny in ((torch.float32, 1e-39), (torch.bfloat16, 1e-39), (torch.float64, 1e-310)):
        try:
            x = torch.tensor([tiny], dtype=dtype)
            cpu = float((x * 2)[0])
            moved = x.to("tpu")
            kept = float(moved.cpu()[0])
            computed = float((moved * 2).cpu()[0])
            _record("subnormal", f"{dtype} x*2 (x={tiny:g})", f"tpu {computed:g} (copy keeps {kept:g}), cpu {cpu:g}")
        except Exception as error:  # a dtype the device refuses is a finding
            _record("subnormal", f"{dtype}", f"raised {type(error).__name__}: {str(error)[:120]}")


def bf16() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(1 << 16).bfloat16(), torch.randn(1 << 16).bfloat16()
    for name, fn in (("add", torch.add), ("mul", torch.mul), ("div", torch.div), ("exp", lambda x, _: torch.exp(x))):
        equal = (fn(a.to("tpu"), b.to("tpu")).cpu() == fn(a, b)).float().mean()
        _record("bf16", f"{name}: share bit-equal to cpu", f"{float(equal):.4f}")
    m, n = torch.randn(1024, 1024).bfloat16(), torch.randn(1024, 1024).bfloat16()
    exact = m.double() @ n.double()
    _record("bf16", "mm 1024^3 error", f"tpu {_relative_error(m.to('tpu') @ n.to('tpu'), exact):.2e}, "
            f"cpu {_relative_error(m @ n, exact):.2e}")  # fmt: skip
    v = (torch.rand(1 << 20) + 0.5).bfloat16()
    exact_sum = v.double().sum()
    tpu_sum, cpu_sum = v.to("tpu").sum().cpu().double(), v.sum().double()
    errors = [float(abs(total - exact_sum) / exact_sum) for total in (tpu_sum, cpu_sum)]
    _record("bf16", "sum of 2^20 values in [0.5,1.5) rel err", f"tpu {errors[0]:.2e}, cpu {errors[1]:.2e}")


def _classify(error: float, expected: Any) -> str:
    if error < 1e-13:
        return "exact"
    if error < 1e-9:
        return "double-float"
    if _beyond_float32_range(expected):  # the emulation has float32's exponent range: inf or 0 there, not accuracy
        return "beyond float32's range"
    return "float32"


def _beyond_float32_range(expected: Any) -> bool:
    tiny, huge = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    for t in torch.utils._pytree.tree_leaves(expected):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            t = t.detach()
            magnitude = t.abs()[torch.isfinite(t) & (t != 0)]
            if magnitude.numel() and (magnitude.min() < tiny or magnitude.max() > huge):
                return True
    return False


def _compare64(actual: Any, expected: Any) -> float:
    worst = 0.0
    actual_leaves = [t for t in torch.utils._pytree.tree_leaves(actual) if isinstance(t, torch.Tensor)]
    expected_leaves = [t for t in torch.utils._pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    for a, e in zip(actual_leaves, expected_leaves, strict=True):
        if e.is_complex():
            a, e = torch.view_as_real(a.cpu().resolve_conj()), torch.view_as_real(e.resolve_conj())
        if not e.is_floating_point() or e.numel() == 0:
            if not torch.equal(a.cpu(), e):
                return math.inf
            continue
        a, e = a.detach().cpu().double(), e.detach().double()
        finite = torch.isfinite(e)
        if not torch.equal(torch.isfinite(a), finite):
            return math.inf
        scale = e[finite].abs().max().clamp_min(1e-300) if finite.any() else torch.tensor(1.0)
        worst = max(worst, float(((a - e)[finite]).abs().max() / scale) if finite.any() else 0.0)
    return worst


# XLA's TPU compiler aborts the whole process (no exception) on these in float64: "Unsupported CVT X{64|128}
# expansion from f64 to c128" (measured on a v5e); torch_tpu refuses them up front (runtime/float64.py).
ABORTS_ON_TPU = {"fft.fft", "fft.rfft", "fft.irfft"}


# The float64 section's ops (`--float64-ops`): OpInfo names; default every op of tests/test_opinfo.py's FORWARD list
# (about 130 compiles: minutes on a chip).
FLOAT64_OPS: list[str] = []


def float64() -> None:
    from torch.testing._internal.common_methods_invocations import op_db

    from tests.test_opinfo import FORWARD

    by_name = {(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name): op for op in op_db}
    classes: dict[str, list[str]] = {}
    for name in FLOAT64_OPS or FORWARD:
        op = by_name[name]
        if name in ABORTS_ON_TPU and torch.tpu.get_device_name().startswith("TPU"):
            classes.setdefault("aborts the process", []).append(name)
            continue
        if torch.float64 not in op.supported_dtypes("cpu"):
            continue
        sample = next(iter(op.sample_inputs("cpu", torch.float64)))
        args, kwargs = (sample.input, *sample.args), sample.kwargs
        expected = op(*args, **kwargs)
        try:
            moved = torch.utils._pytree.tree_map(lambda t: t.to("tpu") if isinstance(t, torch.Tensor) else t, args)
            error = _compare64(op(*moved, **kwargs), expected)
            verdict = _classify(error, expected)
            RESULTS.setdefault("float64_errors", {})[name] = error
        except Exception as error:  # what the device refuses is the finding
            verdict = f"raised {type(error).__name__}: {str(error).splitlines()[0][:100]}"
        classes.setdefault(verdict.split(":")[0], []).append(name)
        RESULTS.setdefault("float64_ops", {})[name] = verdict
    for verdict, names in classes.items():
        _record("float64", f"{verdict} ({len(names)})", " ".join(names))
    float64_rank()
    for label, fn in (("1e300 * 10", lambda t: t * 10), ("1e-300 * 1e-10", lambda t: t * 1e-10)):
        base = torch.tensor([1e300 if "e300 " in label else 1e-300], dtype=torch.float64)
        try:
            _record(
                "float64", f"range {label}", f"tpu {float(fn(base.to('tpu')).cpu()[0]):g}, cpu {float(fn(base)[0]):g}"
            )
        except Exception as error:
            _record("float64", f"range {label}", f"raised {type(error).__name__}: {str(error)[:100]}")
    third = torch.tensor([1.0], dtype=torch.float64)
    try:
        _record("float64", "1/3 error", f"{_compare64((third.to('tpu') / 3).cpu(), third / 3):.2e}")
    except Exception as error:
        _record("float64", "1/3", f"raised {type(error).__name__}: {str(error)[:100]}")


def float64_rank() -> None:
    """The same values as 0-d tensors and as one 1-d tensor: on the fourth device run the float64 section put `pow`
    and `atan2`, whose OpInfo samples are 0-d, among the float32-accurate, while tests/test_on_chip.py found 1-d
    ones float64-accurate; these lines tell whether the rank is the cause."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(8, generator=generator, dtype=torch.float64) * 4 + 0.5
    y = torch.rand(8, generator=generator, dtype=torch.float64) * 2 - 1
    cases = {"pow": torch.pow, "atan2": torch.atan2, "mul": torch.mul, "div": torch.div}
    cases |= {"exp": lambda a, b: torch.exp(b), "log": lambda a, b: torch.log(a), "atan": lambda a, b: torch.atan(b)}
    for name, fn in cases.items():
        expected = fn(x, y)
        whole = float(((fn(x.to("tpu"), y.to("tpu")).cpu() - expected).abs() / expected.abs()).max())
        one_by_one = torch.stack([fn(a.to("tpu"), b.to("tpu")).cpu() for a, b in zip(x, y, strict=True)])
        single = float(((one_by_one - expected).abs() / expected.abs()).max())
        _record("float64", f"{name} relative error, 1-d / 0-d", f"{whole:.2e} / {single:.2e}")
    _float64_scalar_exp(x)


def _float64_scalar_exp(x: torch.Tensor) -> None:
    """Where a 0-d float64 `exp` loses accuracy (the fifth run: 4.7e-8 at 0-d, 5e-15 at 1-d, while
    tests/test_on_chip.py's 0-d `pow`, built on `exp`, was float64-accurate): plain JAX at 0-d, (1,) and (8,), a 0-d
    value reshaped to (1,) inside the program (plain, behind an optimization barrier, broadcast to a vreg's
    (8, 128)), a 0-d value beside a vector in one program, a scalar taken from a vector inside, and ours in Strict
    and Fused eager, each one value at a time. With HLO_DIR set, the 0-d and (1,) programs' optimized HLO."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    expected = torch.exp(x)

    def worst(results: list) -> str:
        got = torch.tensor([float(np.asarray(r).reshape(-1)[0]) for r in results], dtype=torch.float64)
        return f"{float(((got - expected).abs() / expected).max()):.2e}"

    values = [jnp.asarray(float(v), jnp.float64) for v in x]
    vector = jnp.asarray(x.numpy())
    exp = jax.jit(jnp.exp)
    programs = {
        "0-d as (1,) inside": lambda v: jnp.exp(v.reshape(1)).reshape(()),
        "0-d as (1,) behind a barrier": lambda v: jnp.exp(lax.optimization_barrier(v.reshape(1))).reshape(()),
        "0-d broadcast to (8, 128)": lambda v: jnp.exp(jnp.broadcast_to(v, (8, 128)))[0, 0],
    }
    _record("float64", "jax exp 0-d", worst([exp(v) for v in values]))
    _record("float64", "jax exp (1,)", worst([exp(v.reshape(1)) for v in values]))
    _record("float64", "jax exp (8,)", worst(list(np.asarray(exp(vector)).reshape(8, 1))))
    for name, program in programs.items():
        _record("float64", f"jax exp {name}", worst([jax.jit(program)(v) for v in values]))
    beside = jax.jit(lambda v, w: (jnp.exp(v), w * 2))
    _record("float64", "jax exp 0-d beside a vector", worst([beside(v, vector)[0] for v in values]))
    taken = jax.jit(lambda w, i: jnp.exp(w[i]))
    _record("float64", "jax exp of a vector's element", worst([taken(vector, i) for i in range(len(values))]))
    _xla_float64_on_vectors(vector)
    for mode in (torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE):
        with torch.tpu.set_eager_mode(mode):
            _record("float64", f"ours exp 0-d {mode.name}", worst([torch.exp(v.to("tpu")).cpu() for v in x]))
    indexed = [torch.exp(x[i].to("tpu")).cpu() for i in range(len(x))]  # as tests/test_on_chip.py takes them
    _record("float64", "ours exp x[i]", worst(indexed))
    hlo_dir = os.environ.get("HLO_DIR")
    if hlo_dir:
        for label, value in (("0d", values[0]), ("1", values[0].reshape(1))):
            text = exp.lower(value).compile().as_text()
            Path(hlo_dir, f"exp_float64_{label}.hlo.txt").write_text(text or "")


def _xla_float64_on_vectors(x) -> None:
    """XLA's own float64 `pow`, `atan2` and multiply reduction on 8 elements, which torch_tpu writes out on a TPU
    (ops/emulated.py) since the fourth run measured them float32-accurate on OpInfo's samples, which were 0-d."""
    import jax
    import jax.numpy as jnp

    wide = np.asarray(x, np.float64)
    cases = {
        "pow": (lambda v: jnp.power(v, 2.7), wide**2.7),
        "atan2": (lambda v: jnp.arctan2(v - 1, v), np.arctan2(wide - 1, wide)),
        "prod": (lambda v: jnp.prod(v, keepdims=True), np.prod(wide, keepdims=True)),
    }
    for name, (fn, expected) in cases.items():
        error = np.abs(np.asarray(jax.jit(fn)(x), np.float64) - expected) / np.abs(expected)
        _record("float64", f"jax {name} (8,), XLA's own", f"{float(np.max(error)):.2e}")


SECTIONS = {
    "matmul": matmul,
    "transcendental": transcendental,
    "subnormal": subnormal,
    "bf16": bf16,
    "float64": float64,
    "float64_rank": float64_rank,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--float64-ops", default="", help="comma-separated OpInfo names (default: all)")
    args = parser.parse_args()
    FLOAT64_OPS.extend(name for name in args.float64_ops.split(",") if name)
    print(f"device: {torch.tpu.get_device_name()}; torch {torch.__version__}")
    failed = 0
    for name in args.sections.split(","):
        try:
            SECTIONS[name]()
        except Exception:  # one section's failure must not hide the others' figures
            failed += 1
            print(f"section {name} failed:\n{traceback.format_exc()}")
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
