"""The supported torch/JAX releases (runtime/compat.py): the import-time check, what a user with an unsupported
release sees, and the private APIs found in one place (docs/compatibility.md has the tested pairs)."""

import re
import subprocess
import sys
import tomllib

import pytest
import torch

from tests.helpers import ROOT
from torch_tpu.runtime import compat, storage
from torch_tpu.testing.processes import child_env


def _declared() -> dict[str, str]:
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.match(r"[\w-]+", r).group(0): r for r in requirements}


def test_pyproject_declares_the_ranges_the_import_check_enforces():
    declared = _declared()
    for name in compat.SUPPORTED:
        assert declared[name] == f"{name}{compat.supported_range(name)}"


@pytest.mark.parametrize(
    ("found", "ok"),
    [
        ("2.11.0+cu130", True),
        ("2.13.0+cpu", True),
        ("2.14.1", True),
        ("2.10.2", False),
        ("2.15.0", False),
        ("2.15.0.dev20260101+cpu", False),
    ],
)
def test_torch_release_range(monkeypatch, found, ok):
    real = compat.metadata.version
    monkeypatch.setattr(compat.metadata, "version", lambda name: found if name == "torch" else real(name))
    problem = compat.version_problem()
    assert (problem is None) is ok
    if not ok:
        assert f"found torch {found}" in problem and "torch>=2.11,<2.15" in problem and "jax>=0.10.2,<0.12" in problem


@pytest.mark.parametrize(("found", "ok"), [("0.10.2", True), ("0.11.2", True), ("0.10.1", False), ("0.12.0", False)])
def test_jaxlib_release_range(monkeypatch, found, ok):
    real = compat.metadata.version
    monkeypatch.setattr(compat.metadata, "version", lambda name: found if name == "jaxlib" else real(name))
    assert (compat.version_problem() is None) is ok


def test_the_check_can_be_skipped_on_purpose(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", lambda name: "9.0")
    assert compat.version_problem() is not None
    monkeypatch.setenv(compat.SKIP_CHECK_ENV, "1")
    assert compat.version_problem() is None


_UNSUPPORTED_TORCH = """
import importlib.metadata as md, warnings
real = md.version
md.version = lambda name: {fake!r} if name == {name!r} else real(name)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
print("WARNING:", [str(w.message) for w in caught if "torch_tpu" in str(w.message)])
print("REGISTERED:", hasattr(torch, "tpu"), torch._C._get_privateuse1_backend_name())
print("CPU:", (torch.ones(2) + 1).tolist())
try:
    import torch_tpu
except ImportError as error:
    print("IMPORT ERROR:", error)
"""


def _run_unsupported(name: str, fake: str) -> str:
    env = child_env(root=ROOT)
    env.pop(compat.SKIP_CHECK_ENV, None)
    out = subprocess.run(
        [sys.executable, "-c", _UNSUPPORTED_TORCH.format(name=name, fake=fake)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize(("name", "fake"), [("torch", "2.15.0"), ("jax", "0.12.0")])
def test_unsupported_release_keeps_import_torch_working_and_import_torch_tpu_says_why(name, fake):
    stdout = _run_unsupported(name, fake)
    expected = f"torch_tpu supports torch>=2.11,<2.15, jax>=0.10.2,<0.12, jaxlib>=0.10.2,<0.12; found {name} {fake}."
    # `import torch` autoloads us: a warning naming the release and the range, torch usable, no tpu device.
    assert "WARNING: ['" + expected in stdout and "The tpu device is not registered." in stdout
    assert "REGISTERED: False privateuseone" in stdout
    assert "CPU: [2.0, 2.0]" in stdout
    # An explicit import fails with the same reason, not with whatever private API the release lacks.
    assert "IMPORT ERROR: " + expected in stdout


def test_import_torch_tpu_before_torch_registers_the_device():
    """`import torch_tpu` first: torch's autoload runs while torch_tpu is still importing torch (it raised an
    AttributeError on the half-imported package, so no script could import us first)."""
    code = "import torch_tpu, torch; print(torch.arange(3.0, device='tpu').mul(2).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(torch.arange(3.0).mul(2).tolist())


def test_a_missing_private_api_fails_where_it_is_used_and_names_it():
    missing = compat._first("torch._C._no_such_api", lambda: torch._C._no_such_api)
    with pytest.raises(RuntimeError, match=r"this release has no torch\._C\._no_such_api \(torch 2\.\d+"):
        missing()


def test_fresh_tensors_without_the_in_place_storage_swap(monkeypatch):
    """torch 2.11 has no `UntypedStorage._swap_data_ptr_`: op results then get their storage through `set_`."""
    monkeypatch.setattr(storage, "_CAN_SWAP_POINTER", False)
    a = torch.arange(12.0).reshape(3, 4)
    t = a.to("tpu")
    result = (t * 2 + 1).t()
    assert result.untyped_storage().nbytes() == 48 and result.stride() == (1, 4)
    torch.testing.assert_close(result.cpu(), (a * 2 + 1).t(), rtol=0, atol=0)
    result.add_(1)  # the new storage is written in place and read back
    torch.testing.assert_close(result.cpu(), (a * 2 + 2).t(), rtol=0, atol=0)


# Private APIs whose home moves between releases: only runtime/compat.py may name them.
_PRIVATE = ("jax._src", "torch._C._acc", "_construct_storage_from_data_pointer", "import serialize_executable")


def test_version_dependent_private_apis_are_named_only_in_compat():
    offenders = []
    for path in (ROOT / "torch_tpu").rglob("*.py"):
        if path.name == "compat.py":
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {name}" for name in _PRIVATE if name in text]
    assert offenders == []


def test_an_op_this_torch_lacks_registers_nothing():
    """torch 2.14 dropped `aten.cholesky`: the op tables must still import, registering what exists."""
    from torch_tpu.ops import registry

    assert compat.aten.add.Tensor is torch.ops.aten.add.Tensor
    assert compat.aten.__lshift__.Tensor is torch.ops.aten.__lshift__.Tensor  # aten's dunder-named ops
    absent = compat.aten.no_such_op_in_any_torch.default
    assert isinstance(absent, compat.AbsentOp) and "no_such_op_in_any_torch.default" in repr(absent)
    before = (len(registry.LOWERINGS), len(registry.KERNELS), len(registry.GRAPH_LOWERINGS))
    registry.lower(absent)(lambda x: x)
    registry.kernel(absent)(lambda x: x)
    registry.lower_in_graphs(absent)(lambda x: x)
    assert (len(registry.LOWERINGS), len(registry.KERNELS), len(registry.GRAPH_LOWERINGS)) == before
    with pytest.raises(AttributeError):
        getattr(compat.aten, "__no_such_dunder__")  # noqa: B009  (an attribute lookup is what is tested)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool"])
@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_put_copy_is_device_put_of_a_private_copy(dtype, shape):
    """`put_copy` (the distributed path's result writes) reaches the private transfer on this release, not the
    stand-in, and gives device_put's array: same value, shape and dtype, unaffected by later writes to the source."""
    import jax
    import ml_dtypes
    import numpy as np

    from torch_tpu.runtime import platform

    assert getattr(compat._batched_device_put, "__name__", "") != "missing"
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    source = (np.arange(int(np.prod(shape))) % 2 + 1.5).astype(np_dtype).reshape(shape)
    expected = jax.device_put(source.copy(), platform.device())
    array = compat.put_copy(source, platform.device())
    source[...] = 0
    assert array.shape == expected.shape and array.dtype == expected.dtype
    assert np.array_equal(np.asarray(array), np.asarray(expected))


def test_inplace_casts_are_checked_where_meta_kernels_do_not():
    """torch < 2.13's meta kernels let `int_tensor.div_(2)` through (the result would be truncated into the
    integer tensor); `validation.check_inplace_dtype` raises CPU's error for such a call and writes nothing."""
    from torch_tpu.eager import dispatch, validation
    from torch_tpu.runtime import compat

    assert compat.META_REFUSES_INPLACE_CASTS == (torch.__version__ >= "2.13")
    aten = torch.ops.aten
    ints = torch.arange(-3, 3, device="tpu")
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        validation.check_inplace_dtype(aten.div.Scalar, aten.div_.Scalar, (ints, 2), {}, dispatch._to_meta)
    assert ints.cpu().tolist() == [-3, -2, -1, 0, 1, 2]
    floats, doubles = torch.ones(3, device="tpu"), torch.ones(3, dtype=torch.float64, device="tpu")
    validation.check_inplace_dtype(aten.add.Tensor, aten.add_.Tensor, (floats, doubles), {}, dispatch._to_meta)
    validation.check_inplace_dtype(aten.mul.Scalar, aten.mul_.Scalar, (ints, 2), {}, dispatch._to_meta)


def test_storage_resize_without_pointer_swaps_is_a_clear_error(monkeypatch):
    """torch 2.11 cannot change a storage's size from Python: resize_ of a tpu storage says so, changing nothing."""
    from torch_tpu.runtime import storage

    monkeypatch.setattr(storage, "_CAN_SWAP_POINTER", False)
    x = torch.ones(4, device="tpu")
    with pytest.raises(NotImplementedError, match="resize_ of a tpu storage needs torch >= 2.12"):
        x.untyped_storage().resize_(0)
    assert x.untyped_storage().nbytes() == 16 and x.cpu().tolist() == [1.0] * 4
