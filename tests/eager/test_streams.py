"""`torch.tpu.Stream` and `torch.tpu.Event`: `torch.Stream`/`torch.Event` subclasses (what FSDP2 and
`Tensor.record_stream` take), and events that mark work without synchronising the whole device."""

import jax
import pytest
import torch

import torch_tpu.tpu as tpu_module
from torch_tpu.runtime import deferred, storage

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


@pytest.fixture
def device_syncs(monkeypatch):
    """The number of whole-device synchronisations (`torch.tpu.synchronize`) made while the test runs."""
    calls = []
    original = tpu_module.synchronize
    monkeypatch.setattr(tpu_module, "synchronize", lambda *args: calls.append(args) or original(*args))
    return calls


def _slow_result() -> torch.Tensor:
    """A result that takes the device a while (a chain of 256x256 float64 products)."""
    x = torch.rand(256, 256, dtype=torch.float64, device="tpu") / 256
    for _ in range(8):
        x = x @ x + 1
    return x


def test_streams_are_torch_streams_of_the_tpu_device_with_their_own_ids():
    first, second = torch.tpu.Stream(), torch.tpu.Stream(priority=-1)
    assert isinstance(first, torch.Stream) and first.device == torch.device("tpu", 0)
    assert first != second and len({first, second, torch.tpu.default_stream()}) == 3
    assert torch.tpu.current_stream() == torch.tpu.default_stream() == torch.accelerator.current_stream()


def test_record_stream_accepts_a_tpu_stream():
    x = torch.ones(4, device="tpu")
    x.record_stream(torch.tpu.Stream())
    x.record_stream(torch.tpu.current_stream())
    assert x.cpu().tolist() == [1.0] * 4


def test_stream_context_selects_the_current_stream_and_restores_it():
    outer, inner = torch.tpu.Stream(), torch.tpu.Stream()
    with torch.tpu.stream(outer):
        assert torch.tpu.current_stream() is outer
        with inner:
            assert torch.tpu.current_stream() is inner
        assert torch.tpu.current_stream() is outer
        with torch.tpu.stream(None):
            assert torch.tpu.current_stream() is outer
    assert torch.tpu.current_stream() == torch.tpu.default_stream()


def test_event_record_does_not_synchronise_the_device(device_syncs):
    result = _slow_result()
    event = torch.tpu.Event()
    assert isinstance(event, torch.Event) and event.query()  # nothing recorded yet: nothing to wait for
    event.record()
    assert not device_syncs, "Event.record synchronised the whole device"
    event.synchronize()  # waits for the work issued before the record (a cold op's queued: run by now)
    assert storage.buffer_of(result)._array.is_ready() and event.query() and not device_syncs
    torch.tpu.current_stream().wait_event(event)
    torch.accelerator.current_stream().wait_event(event)  # torch's own Stream accepts the event too
    event.wait()
    assert not device_syncs


def test_stream_record_event_and_synchronize():
    stream = torch.tpu.Stream()
    result = _slow_result()
    event = stream.record_event()
    event.synchronize()
    assert storage.buffer_of(result)._array.is_ready()
    stream.wait_event(event)
    stream.wait_stream(torch.tpu.current_stream())
    stream.synchronize()
    assert stream.query()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        pending = torch.ones(3, device="tpu") * 2
        assert not stream.query()  # recorded work not run yet
        stream.synchronize()
        assert stream.query() and pending.cpu().tolist() == [2.0] * 3


def test_event_in_fused_mode_runs_the_recorded_work_when_waited_for(device_syncs):
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        x = torch.arange(6, dtype=torch.float32, device="tpu") * 2 + 1
        assert deferred.is_pending(storage.buffer_of(x)._array)
        event = torch.tpu.Event()
        event.record()
        assert not event.query() and deferred.is_pending(storage.buffer_of(x)._array)
        event.synchronize()
        array = storage.buffer_of(x)._array
        assert not deferred.is_pending(array) and isinstance(array, jax.Array) and event.query()
    assert x.cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert not device_syncs


def test_timing_events_measure_the_work_between_them():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    result = _slow_result()
    end.record()
    assert storage.buffer_of(result)._array.is_ready()  # a timing event waits for its work when recorded
    assert start.elapsed_time(end) > 0.0


def test_elapsed_time_without_timing_raises():
    start, end = torch.tpu.Event(), torch.tpu.Event()
    start.record()
    end.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        start.elapsed_time(end)
