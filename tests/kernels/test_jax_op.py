"""`torch.tpu.pallas.jax_op`: JAX functions as PyTorch ops, against CPU PyTorch — every eager mode, compiled
graphs without graph breaks, gradients, optional/list/static arguments, x64, errors, `register_lowering`, and a
kernel changed between two processes sharing a cache."""

import functools
import itertools
import json
import pathlib
import subprocess
import sys
from typing import Optional

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import ROOT
from torch_tpu.kernels.jax_op import KernelError
from torch_tpu.testing.compare import EAGER_MODES as MODES
from torch_tpu.testing.compare import float32_tolerance
from torch_tpu.testing.processes import child_env

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

_names = itertools.count()


def _name(base: str) -> str:
    """A fresh op name: custom ops live for the process."""
    return f"jaxop_test::{base}_{next(_names)}"


def scaled_gelu(x: jax.Array, y: jax.Array, alpha: float) -> jax.Array:
    return jax.nn.gelu(x) * y * alpha


def _gelu_ref(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return F.gelu(x, approximate="tanh") * y * alpha


def combine(
    x: jax.Array, bias: jax.Array | None, extras: list[jax.Array], scale: float = 2.0, mode: str = "sum"
) -> tuple[jax.Array, jax.Array]:
    total = x * scale + (0.0 if bias is None else bias)
    for extra in extras:
        total = total + extra if mode == "sum" else total * extra
    return total, jnp.sum(total, axis=-1)


def _combine_ref(x, bias, extras, scale=2.0, mode="sum"):
    total = x * scale + (0.0 if bias is None else bias)
    for extra in extras:
        total = total + extra if mode == "sum" else total * extra
    return total, total.sum(-1)


@pytest.fixture(scope="module")
def gelu_op():
    return torch.tpu.pallas.jax_op(_name("scaled_gelu"), scaled_gelu)


@pytest.fixture(scope="module")
def combine_op():
    return torch.tpu.pallas.jax_op(_name("combine"), combine)


def test_schema_from_annotations(gelu_op, combine_op):
    def typed(x: Optional[jax.Array], n: Optional[int] = None, sizes: list[int] = (1, 2)) -> list[jax.Array]:  # noqa: UP045
        return [x]

    op = torch.tpu.pallas.jax_op(_name("typed"), typed)
    assert str(op._opoverload._schema).endswith("(Tensor? x, int? n=None, int[] sizes=[1, 2]) -> Tensor[]")
    bound = torch.tpu.pallas.jax_op(_name("bound"), functools.partial(scaled_gelu, alpha=0.5))
    assert str(bound._opoverload._schema).endswith("(Tensor x, Tensor y, *, float alpha=0.5) -> Tensor")
    assert str(gelu_op._opoverload._schema).endswith("(Tensor x, Tensor y, float alpha) -> Tensor")
    assert str(combine_op._opoverload._schema).endswith(
        '(Tensor x, Tensor? bias, Tensor[] extras, float scale=2., str mode="sum") -> (Tensor, Tensor)'
    )


@pytest.mark.parametrize("mode", MODES)
def test_eager_modes_match_cpu(gelu_op, mode):
    a, b = torch.randn(8), torch.randn(8)
    with torch.tpu.set_eager_mode(MODES[mode]):
        out = gelu_op(a.to("tpu"), b.to("tpu"), 0.5) + 1
        result = out.cpu()
    torch.testing.assert_close(result, _gelu_ref(a, b, 0.5) + 1)


def test_cpu_kernel_is_the_reference(gelu_op):
    a, b = torch.randn(8), torch.randn(8)
    out = gelu_op(a, b, 0.25)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, _gelu_ref(a, b, 0.25))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_optional_list_and_static_arguments(combine_op, mode):
    x, bias, e1, e2 = (torch.randn(3, 4) for _ in range(4))
    tpu = lambda t: t.to("tpu")
    cases = [
        ((x, bias, [e1, e2]), {}),
        ((x, None, [e1]), {"scale": 0.5, "mode": "prod"}),
        ((x, bias, []), {"mode": "prod"}),
    ]
    with torch.tpu.set_eager_mode(MODES[mode]):
        for (a, opt, extras), kwargs in cases:
            got = combine_op(tpu(a), None if opt is None else tpu(opt), [tpu(e) for e in extras], **kwargs)
            want = _combine_ref(a, opt, extras, **kwargs)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g.cpu(), w)


def _graph_breaks(fn, *args) -> int:
    return torch._dynamo.explain(fn)(*args).graph_break_count


def test_compiled_fullgraph_inlines_the_kernel(gelu_op, combine_op):
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    seen = {}

    def model(x, y):
        total, rows = combine_op(gelu_op(x, y, 0.5), None, [y], scale=3.0)
        return total.relu() + rows[:, None]

    def callback(fx_code, stablehlo):
        seen["fx"], seen["hlo"] = fx_code, stablehlo

    compiled = torch.compile(model, backend="tpu", fullgraph=True, options={"debug_callback": callback})
    got = compiled(a.to("tpu"), b.to("tpu")).cpu()
    total, rows = _combine_ref(_gelu_ref(a, b, 0.5), None, [b], scale=3.0)
    rtol, atol = float32_tolerance(1.3e-6, 1e-5)  # the kernel's tanh-approximated gelu on the chip
    torch.testing.assert_close(got, total.relu() + rows[:, None], rtol=rtol, atol=atol)
    assert "jaxop_test" in seen["fx"]  # the op is a node of the ATen graph ...
    assert "custom_call" not in seen["hlo"]  # ... and its body is in the graph's one program
    assert _graph_breaks(model, a.to("tpu"), b.to("tpu")) == 0


def test_gradients_match_cpu_eager_and_compiled(combine_op):
    x, bias, e1 = (torch.randn(3, 4) for _ in range(3))
    weight = torch.randn(3, 4)

    def loss(op, x, bias, e1, w):
        total, rows = op(x, bias, [e1], scale=1.5, mode="prod")
        return (total * w).sum() + rows.pow(2).sum()

    leaves = [t.clone().requires_grad_() for t in (x, bias, e1)]
    loss(lambda *a, **k: _combine_ref(*a, **k), *leaves, weight).backward()
    expected = [t.grad for t in leaves]
    compiled = torch.compile(loss, backend="tpu", fullgraph=True)
    for run, mode in ((loss, "strict"), (loss, "fused"), (compiled, "strict")):
        with torch.tpu.set_eager_mode(MODES[mode]):
            leaves = [t.to("tpu").requires_grad_() for t in (x, bias, e1)]
            run(combine_op, *leaves, weight.to("tpu")).backward()
            grads = [t.grad.cpu() for t in leaves]
        for got, want in zip(grads, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_integer_inputs_get_no_gradient():
    def shift(x: jax.Array, k: jax.Array) -> jax.Array:
        return x * k.astype(x.dtype)

    op = torch.tpu.pallas.jax_op(_name("shift"), shift)
    x = torch.randn(5, device="tpu", requires_grad=True)
    k = torch.arange(5, device="tpu")
    op(x, k).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.arange(5.0))


def test_user_registered_backward_replaces_vjp():
    def square(x: jax.Array) -> jax.Array:
        return x * x

    op = torch.tpu.pallas.jax_op(_name("square"), square)
    op.register_autograd(lambda ctx, g: g * 10, setup_context=lambda ctx, inputs, output: None)
    x = torch.randn(4, device="tpu", requires_grad=True)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((4,), 10.0))


def test_double_backward_is_a_clear_error(gelu_op):
    x = torch.randn(4, device="tpu", requires_grad=True)
    (grad,) = torch.autograd.grad(gelu_op(x, x, 1.0).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        grad.sum().backward()


def test_x64_is_off_in_kernels_by_default():
    def halve(x: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x / 2, n + 1

    narrow = torch.tpu.pallas.jax_op(_name("halve"), halve)
    wide = torch.tpu.pallas.jax_op(_name("halve64"), halve, x64=True)
    x = torch.tensor([1.0, 3.0], dtype=torch.float64)
    n = torch.tensor([2**40, 5])
    half, count = narrow(x.to("tpu"), torch.tensor([7, 5], device="tpu"))
    assert (half.dtype, count.dtype) == (torch.float32, torch.int32)  # as JAX with x64 off computes
    assert half.cpu().tolist() == [0.5, 1.5] and count.cpu().tolist() == [8, 6]
    half, count = wide(x.to("tpu"), n.to("tpu"))
    assert (half.dtype, count.dtype) == (torch.float64, torch.int64)
    assert count.cpu().tolist() == [2**40 + 1, 6]


def test_bad_annotations_are_refused_naming_the_parameter():
    def untyped(x, y: jax.Array) -> jax.Array:
        return x

    def dict_arg(x: jax.Array, table: dict) -> jax.Array:
        return x

    def no_return(x: jax.Array):
        return x

    def bad_default(x: jax.Array, y: jax.Array = 1.0) -> jax.Array:
        return x

    with pytest.raises(TypeError, match="parameter 'x' has no annotation"):
        torch.tpu.pallas.jax_op(_name("untyped"), untyped)
    with pytest.raises(TypeError, match="parameter 'table': annotation .*dict.* is not supported"):
        torch.tpu.pallas.jax_op(_name("dict_arg"), dict_arg)
    with pytest.raises(TypeError, match="no return annotation"):
        torch.tpu.pallas.jax_op(_name("no_return"), no_return)
    with pytest.raises(TypeError, match="parameter 'y': a tensor argument's only default is None"):
        torch.tpu.pallas.jax_op(_name("bad_default"), bad_default)
    with pytest.raises(ValueError, match="must be 'namespace::name'"):
        torch.tpu.pallas.jax_op("no_namespace", scaled_gelu)
    with pytest.raises(TypeError, match="mesh= must be a DeviceMesh or a jax.sharding.Mesh"):
        torch.tpu.pallas.jax_op(_name("meshed"), scaled_gelu, mesh=object())
    with pytest.raises(ValueError, match="donate_argnums 2 is not a tensor argument"):
        torch.tpu.pallas.jax_op(_name("donated"), scaled_gelu, donate_argnums=(2,))


def test_wrong_dtype_is_a_clear_error():
    def low_bits(x: jax.Array) -> jax.Array:
        return jnp.bitwise_and(x, 1)

    op = torch.tpu.pallas.jax_op(_name("low_bits"), low_bits)
    assert op(torch.tensor([3, 4], device="tpu")).cpu().tolist() == [1, 0]
    with pytest.raises(KernelError, match=r"low_bits_\d+' cannot trace for \(x: float32\[2\]\)"):
        op(torch.tensor([3.0, 4.0], device="tpu"))


def test_register_lowering_for_a_users_custom_op():
    name = _name("triple")

    @torch.library.custom_op(name, mutates_args=())
    def triple(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    triple.register_fake(lambda x: torch.empty_like(x))
    torch.tpu.pallas.register_lowering(triple, lambda x: x * 3)
    x = torch.randn(6)
    torch.testing.assert_close(triple(x.to("tpu")).cpu(), x * 3)
    compiled = torch.compile(lambda t: triple(t) + 1, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), x * 3 + 1)
    with pytest.raises(ValueError, match="registered twice"):
        torch.tpu.pallas.register_lowering(triple, lambda x: x * 3)


SCRIPT = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import userkernel
op = torch.tpu.pallas.jax_op("user::k", userkernel.k)
x = torch.ones(2, 4, device="tpu")
compiled = torch.compile(lambda t: op(t) + 0, backend="tpu", fullgraph=True)
result = {"eager": op(x).cpu().tolist(), "compiled": compiled(x).cpu().tolist()}
if len(sys.argv) > 2:  # the compiled gradient too
    leaf = x.clone().requires_grad_()
    torch.compile(lambda t: op(t).sum(), backend="tpu", fullgraph=True)(leaf).backward()
    result["grad"] = leaf.grad.cpu().tolist()
print(json.dumps({**result, "stats": torch.tpu._get_cache_stats()["persistent"]}))
"""


def _run_kernel(tmp_path: pathlib.Path, body: str, grad: bool = False) -> dict:
    """SCRIPT in a fresh process, with kernel `k` returning `body`, the cache directories shared under tmp_path."""
    env = child_env(
        root=ROOT,
        TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    folder = tmp_path / f"kernel{next(_names)}"
    folder.mkdir()
    (folder / "userkernel.py").write_text(f"import jax\n\ndef k(x: jax.Array) -> jax.Array:\n    return {body}\n")
    command = [sys.executable, "-c", SCRIPT, str(folder), *(["grad"] if grad else [])]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.children
def test_changed_kernel_computes_with_its_new_body_in_a_later_process(tmp_path):
    first = _run_kernel(tmp_path, "x * 2")
    assert first["eager"] == first["compiled"] == [[2.0] * 4] * 2
    changed = _run_kernel(tmp_path, "x * 3")
    assert changed["eager"] == changed["compiled"] == [[3.0] * 4] * 2


@pytest.mark.children
@pytest.mark.slow
def test_kernel_with_a_new_output_shape_misses_every_warm_layer(tmp_path):
    first = _run_kernel(tmp_path, "x * 2", grad=True)
    assert first["grad"] == [[2.0] * 4] * 2
    reshaped = _run_kernel(tmp_path, "x.sum(-1) * 5", grad=True)  # AOTAutograd's cached ATen graph must miss too
    assert reshaped["eager"] == reshaped["compiled"] == [20.0, 20.0] and reshaped["grad"] == [[5.0] * 4] * 2
    again = _run_kernel(tmp_path, "x.sum(-1) * 5", grad=True)  # the same kernel again: served from the cache
    assert again["stats"]["misses"] == 0 and again["stats"]["graph_hits"] > 0
    assert again["compiled"] == [20.0, 20.0]
