"""A fill of a storage never written makes its array without an op (`runtime/fills.py`): the values CPU gives,
shared 0-d arrays that in-place ops do not leak through, and the op's own path (its rounding and its errors)
wherever the fast one does not apply."""

import math
import threading

import jax
import numpy as np
import pytest
import torch

from torch_tpu.eager.cache import executables
from torch_tpu.runtime import fills, helpers, storage

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

FACTORIES = {
    "zeros": lambda device: torch.zeros(3, 7, device=device),
    "ones_int64": lambda device: torch.ones(5, dtype=torch.int64, device=device),
    "full_bool": lambda device: torch.full((4,), True, device=device),
    "full_bfloat16": lambda device: torch.full((2, 3), -2.5, dtype=torch.bfloat16, device=device),
    "ones_0d": lambda device: torch.ones((), device=device),
    "minus_zero_0d": lambda device: torch.full((), -0.0, device=device),
    "int64_beyond_float": lambda device: torch.full((3,), 2**60 + 1, dtype=torch.int64, device=device),
    "int64_beyond_float_0d": lambda device: torch.full((), 2**60 + 1, dtype=torch.int64, device=device),
    "inf": lambda device: torch.full((2,), -math.inf, device=device),
    "zeros_like": lambda device: torch.zeros_like(torch.empty(6, 2, device=device)),
}


@pytest.mark.parametrize("name", FACTORIES)
def test_a_fresh_fill_equals_cpu_and_runs_no_op(name):
    before = len(executables.entries)
    ours = FACTORIES[name]("tpu").cpu()
    assert len(executables.entries) == before  # no op compiled or run: the array was made directly
    expected = FACTORIES[name]("cpu")
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)
    assert torch.equal(torch.signbit(ours.float()), torch.signbit(expected.float()))  # -0.0 stays -0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda device: torch.full((3,), 0.1, device=device),  # float32 rounds 0.1: the op's cast
        lambda device: torch.full((3,), 1.5, dtype=torch.int32, device=device),  # truncated, as CPU does
        lambda device: torch.full((2,), math.nan, device=device),
        lambda device: torch.full((2,), 16777217, device=device),  # beyond float32's integers
    ],
)
def test_values_the_dtype_does_not_hold_take_the_ops_path(make):
    torch.testing.assert_close(make("tpu").cpu(), make("cpu"), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(1e10, torch.float16), (1e39, torch.bfloat16), (300, torch.uint8), (-256, torch.uint8), (-129, torch.int8),
     (2**40, torch.int32), (math.nan, torch.int32)],
)  # fmt: skip
def test_a_fill_value_the_dtype_cannot_hold_raises_as_on_cpu(value, dtype):
    with pytest.raises(RuntimeError, match="overflow"):
        torch.full((2,), value, dtype=dtype)
    with pytest.raises(RuntimeError, match=f"fill_: value .* {dtype} without overflow"):
        torch.full((2,), value, dtype=dtype, device="tpu")


@pytest.mark.parametrize(("value", "dtype"), [(math.inf, torch.float16), (-1, torch.uint8), (-255, torch.uint8)])
def test_values_cpu_accepts_at_the_edges_fill_as_on_cpu(value, dtype):
    expected = torch.full((2,), value, dtype=dtype)
    torch.testing.assert_close(torch.full((2,), value, dtype=dtype, device="tpu").cpu(), expected, rtol=0, atol=0)


def test_shared_0d_values_do_not_leak_through_in_place_ops():
    a, b = torch.ones((), device="tpu"), torch.ones((), device="tpu")
    assert storage.read(a) is storage.read(b)  # one cached array, as JAX arrays are immutable
    a.add_(41)
    assert a.item() == 42 and b.item() == 1 and torch.ones((), device="tpu").item() == 1


def test_fills_of_written_storages_and_views_are_ops_as_before():
    x = torch.arange(6.0, device="tpu")
    x[2:4].fill_(-1.0)
    x.view(2, 3)[1].zero_()
    expected = torch.arange(6.0)
    expected[2:4] = -1.0
    expected[3:] = 0.0
    torch.testing.assert_close(x.cpu(), expected, rtol=0, atol=0)


def test_a_cold_fill_is_a_transfer_while_its_program_compiles_on_a_thread(tmp_path, monkeypatch):
    """A fill whose program is neither compiled nor in the persistent tier makes its array on the host: no compile
    on the calling thread (a cold first step waited for one per optimizer-state shape); the program compiles on a
    thread, is stored in the tier, and the calls after it take it."""
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path))
    on_this_thread = []

    def listener(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            on_this_thread.append(threading.current_thread() is threading.main_thread())

    make = lambda device: torch.full((3, 11, 13), -1.75, device=device)  # a shape no other test fills
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        cold = make("tpu")
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert True not in on_this_thread
    torch.testing.assert_close(cold.cpu(), make("cpu"), rtol=0, atol=0)
    key = ((3, 11, 13), np.dtype(np.float32), ((), np.dtype(np.float32), None))
    helpers._compiles[fills._full_jit, key].result()  # the program, compiled on the thread
    assert list(tmp_path.rglob("*")) and key not in fills._full_jit._calls
    torch.testing.assert_close(make("tpu").cpu(), make("cpu"), rtol=0, atol=0)
    assert key in fills._full_jit._calls  # the second call took the program


def test_a_fill_too_large_for_the_host_path_takes_its_program(monkeypatch):
    monkeypatch.setattr(helpers, "HOST_FILL_MAX_BYTES", 64)
    made = torch.zeros(5, 17, device="tpu")  # 340 bytes
    assert ((5, 17), np.dtype(np.float32), ((), np.dtype(np.float32), None)) in fills._full_jit._calls
    torch.testing.assert_close(made.cpu(), torch.zeros(5, 17), rtol=0, atol=0)
