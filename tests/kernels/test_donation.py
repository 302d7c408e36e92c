"""`jax_op(..., donate_argnums=...)`: the donated tensor's memory becomes the output's, and the tensor is consumed."""

from __future__ import annotations

import itertools
import subprocess
import sys
import warnings

import jax
import pytest
import torch

import torch_tpu
from tests.helpers import ROOT
from torch_tpu.testing.compare import EAGER_MODES as MODES
from torch_tpu.testing.processes import child_env

_names = itertools.count()
CONSUMED = r"donated to jax_op 'donation_test::axpy_\d+' \(argument 'x'\)"


def _name(base: str) -> str:
    return f"donation_test::{base}_{next(_names)}"


def axpy(x: jax.Array, y: jax.Array, a: float) -> jax.Array:
    return x * a + y


def total(x: jax.Array) -> jax.Array:
    return x.sum()


def identity(x: jax.Array) -> jax.Array:
    return x


@pytest.fixture(scope="module")
def donating():
    return torch.tpu.pallas.jax_op(_name("axpy"), axpy, donate_argnums=0)


@pytest.fixture(scope="module")
def plain():
    return torch.tpu.pallas.jax_op(_name("axpy"), axpy)


def _pointer(tensor: torch.Tensor) -> int:
    """The device address of the tensor's buffer (held by nothing but the buffer afterwards)."""
    return torch_tpu.to_jax(tensor).unsafe_buffer_pointer()  # (computed: a cold op's value may still be queued)


@pytest.mark.parametrize("mode", MODES)
def test_donated_buffer_becomes_the_output_and_the_input_is_consumed(donating, plain, mode):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    with torch.tpu.set_eager_mode(MODES[mode]):
        for _ in range(2):  # the compiling call, then the cached executable
            # computed on the device: a transferred array may alias host memory, which XLA cannot donate
            x, y = a.to("tpu") * 1.0, b.to("tpu")
            torch.tpu.synchronize()
            address = _pointer(x)
            out = donating(x, y, 0.5)
            torch.testing.assert_close(out.cpu(), a * 0.5 + b)
            assert _pointer(out) == address  # XLA wrote the result into the donated memory
            with pytest.raises(RuntimeError, match=CONSUMED):
                x.cpu()
            with pytest.raises(RuntimeError, match=CONSUMED):
                (x + 1).cpu()
            torch.testing.assert_close(y.cpu(), b)  # not donated
    x = a.to("tpu") * 1.0
    address = _pointer(x)
    assert _pointer(plain(x, b.to("tpu"), 0.5)) != address  # without donation the output is new memory
    torch.testing.assert_close(x.cpu(), a)


def test_a_consumed_tensor_written_whole_is_valid_again(donating):
    x, y = torch.ones(3, device="tpu"), torch.ones(3, device="tpu")
    donating(x, y, 2.0)
    x.copy_(torch.arange(3.0))
    torch.testing.assert_close((x * 2).cpu(), torch.arange(3.0) * 2)


def test_unusable_donation_still_consumes_without_a_warning():
    op = torch.tpu.pallas.jax_op(_name("total"), total, donate_argnums=(0,))
    x = torch.arange(6.0, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # JAX's "Some donated buffers were not usable" is not the user's business
        assert op(x).item() == 15.0
    with pytest.raises(RuntimeError, match="donated to jax_op 'donation_test::total_"):
        x.cpu()


def test_identity_kernel_keeps_its_output_and_consumes_its_input():
    op = torch.tpu.pallas.jax_op(_name("identity"), identity, donate_argnums=0)
    x = torch.arange(4.0, device="tpu")
    out = op(x)
    torch.testing.assert_close(out.cpu(), torch.arange(4.0))
    with pytest.raises(RuntimeError, match="donated to jax_op"):
        x.cpu()


def test_an_array_another_tensor_shares_is_copied_not_deleted(donating):
    a = torch.randn(5)
    source = a.to("tpu")
    alias = torch.empty(5, device="tpu")
    alias.copy_(source)  # both storages now hold one jax.Array
    torch.testing.assert_close(donating(alias, torch.ones(5, device="tpu"), 3.0).cpu(), a * 3 + 1)
    torch.testing.assert_close(source.cpu(), a)


def test_refused_donations_name_the_argument_and_leave_the_tensor_intact(donating):
    y = torch.ones(2, 3, device="tpu")
    w = torch.ones(2, 3, device="tpu", requires_grad=True)
    base = torch.arange(12.0, device="tpu").reshape(4, 3)
    x = torch.full((2, 3), 2.0, device="tpu")
    alias = x.view(6)
    cases = [
        (lambda: donating(torch.ones(2, 3, device="tpu", requires_grad=True), y, 1.0), "'x'.*requires grad"),
        (lambda: donating(torch.ones(2, 3, device="tpu"), w, 1.0), "argument 'y' requires grad"),
        (lambda: donating(base[1:3], y, 1.0), "view of part of its storage"),
        (lambda: donating(x, y, 1.0), "shared with another tensor"),
        (lambda: donating(y, y, 1.0), "shared with argument 'y'"),
        (lambda: donating(torch.ones(2, 3), y, 1.0), "cpu tensor"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=f"cannot donate argument 'x'.*{message}"):
            call()
    torch.testing.assert_close(base.cpu(), torch.arange(12.0).reshape(4, 3))
    torch.testing.assert_close(alias.cpu(), torch.full((6,), 2.0))
    torch.testing.assert_close(y.cpu(), torch.ones(2, 3))


def test_backward_reading_a_consumed_input_is_a_clear_error(donating):
    x = torch.randn(3, device="tpu")
    w = torch.randn(3, device="tpu", requires_grad=True)
    product = x * w  # saves x for w's gradient
    donating(x, torch.zeros(3, device="tpu"), 1.0)
    with pytest.raises(RuntimeError, match=CONSUMED):
        product.sum().backward()


def test_compiled_graphs_and_cpu_tensors_donate_nothing(donating):
    a, b = torch.randn(6), torch.randn(6)
    kept = a.clone()
    compiled = torch.compile(lambda x, y: donating(x, y, 2.0) + 1, backend="tpu", fullgraph=True)
    x, y = a.to("tpu"), b.to("tpu")
    torch.testing.assert_close(compiled(x, y).cpu(), a * 2 + b + 1)
    torch.testing.assert_close(x.cpu(), a)
    torch.testing.assert_close(donating(a, b, 2.0), a * 2 + b)
    torch.testing.assert_close(a, kept)


def test_bad_donate_argnums_are_refused():
    for bad in (2, (0, 5), True, -1):
        with pytest.raises(ValueError, match="is not a tensor argument's index"):
            torch.tpu.pallas.jax_op(_name("bad"), axpy, donate_argnums=bad)


_SCRIPT = """
import jax, torch, torch_tpu
def axpy(x: jax.Array, y: jax.Array, a: float) -> jax.Array:
    return x * a + y
op = torch.tpu.pallas.jax_op("donation_test::axpy", axpy, donate_argnums=0)
x, y = torch.arange(20.0).reshape(4, 5).to("tpu") * 1.0, torch.ones(4, 5).to("tpu")
torch.tpu.synchronize()
address = x.untyped_storage()._tpu_buffer._array.unsafe_buffer_pointer()
out = op(x, y, 2.0)
assert torch.equal(out.cpu(), torch.arange(20.0).reshape(4, 5) * 2 + 1)
sources = [e["source"] for e in torch.tpu._get_cache_stats()["per_entry_stats"] if "axpy" in e["name"]]
print(out.untyped_storage()._tpu_buffer._array.unsafe_buffer_pointer() == address, sources)
"""


def test_a_donating_executable_loaded_from_disk_still_donates(tmp_path):
    environment = child_env(root=ROOT, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=str(tmp_path))
    runs = [
        subprocess.run([sys.executable, "-c", _SCRIPT], env=environment, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    assert [r.stdout.strip().splitlines()[-1] for r in runs] == ["True ['compiled']", "True ['disk']"]
