"""`torch-tpu serve`: probes, batching, padding to the catalogue (no compile in traffic), bad requests, SIGTERM drain.

One in-process server (uvicorn on a free loopback port, in a thread) serves the tiny workload for most tests; the
drain test runs the real command in a subprocess under a hard timeout, since it needs a signal and an exit status.
Batching is observed deterministically: with a max wait far longer than the test, a batch leaves only when full.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

from tests.kit import kit_workloads  # noqa: E402
from torch_tpu.distributed import launch_env  # noqa: E402
from torch_tpu.kit import checks, serve  # noqa: E402
from torch_tpu.testing.processes import child_env  # noqa: E402

SPEC = "tests.kit.kit_workloads:tiny"  # catalogue: batches 8 and 16 of 8 float32 features
DEADLINE = 120.0


def _request(port: int, method: str, path: str, body: bytes | str | None = None) -> tuple[int, dict | str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read().decode()
    finally:
        connection.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, data


def _predict(port: int, instances, name: str = "tiny") -> tuple[int, dict]:
    return _request(port, "POST", f"/v1/models/{name}:predict", json.dumps({"instances": instances}))


def _wait(predicate, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class _Running:
    """A `serve.Server` under uvicorn in a daemon thread, on a free port (port 0: the OS picks)."""

    def __init__(self, server: serve.Server) -> None:
        self.server = server
        self.uvicorn = serve._Uvicorn(serve.config(server, port=0, host="127.0.0.1"), server)
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        _wait(lambda: self.uvicorn.started, "uvicorn to start", 60)
        self.port = self.uvicorn.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def running():
    server = serve.Server(serve.Options(workload=SPEC, max_wait_ms=1.0), warm_on_start=False)
    handle = _Running(server)
    yield handle
    handle.stop()


def _ready(port: int) -> bool:
    return _request(port, "GET", "/readyz")[0] == 200


@pytest.fixture(scope="module")
def warm(running):
    """Readiness is checked before warm-up (not ready, requests refused) and after (ready)."""
    port = running.port
    status, body = _request(port, "GET", "/readyz")
    assert status == 503 and body["ready"] is False and body["state"] == "loading"
    assert _request(port, "GET", "/healthz")[0] == 200  # alive while not ready: no restart during compilation
    status, body = _predict(port, [[0.0] * 8])
    assert status == 503 and "not ready" in body["error"]
    running.server.start_warmup()
    _wait(lambda: _ready(port), "readiness after warm-up")
    return running


def test_probes_and_status_after_warmup(warm):
    port = warm.port
    status, body = _request(port, "GET", "/readyz")
    assert status == 200 and body["ready"] is True
    status, body = _request(port, "GET", "/healthz")
    assert status == 200 and body["alive"] is True
    status, body = _request(port, "GET", "/v1/models/tiny")
    assert status == 200 and body["ready"] is True and body["name"] == "tiny"
    assert body["catalogue"] == [{"instance_shape": [8], "batches": [8, 16]}]
    assert [w["shape"] for w in body["warmup"]] == [[8, 8], [16, 8]]
    assert _request(port, "GET", "/v1/models")[1] == {"models": ["tiny"]}


def test_predictions_match_cpu_without_compiling_after_warmup(warm):
    """Every batch size 1..16 runs padded to a catalogued shape (8 or 16): no new program after warm-up, and the
    predictions equal the CPU model's within the fp32 output policy (rtol 1e-4, atol 1e-5)."""
    work = kit_workloads.tiny()
    reference = work.make_model(0).eval()
    before = serve._programs()
    generator = torch.Generator().manual_seed(0)
    for count in range(1, 17):
        inputs = torch.randn(count, 8, generator=generator)
        status, body = _predict(warm.port, inputs.tolist())
        assert status == 200, body
        with torch.no_grad():
            expected = reference(inputs)
        result = checks.compare(torch.tensor(body["predictions"]), expected, checks.policy("float32")["outputs"])
        assert result["passed"], (count, result)
    assert serve._programs() == before
    text = _request(warm.port, "GET", "/metrics")[1]
    samples = {s.name: s.value for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples}
    assert samples["torch_tpu_serve_programs_since_ready"] == 0


def test_concurrent_requests_are_batched(warm):
    """16 one-instance requests with a max wait no test reaches: the batch leaves only when full, so the device
    sees one batch of 16 (and the sequential batches before it kept their own sizes)."""
    server = warm.server
    server.options.max_wait_ms = 600_000.0
    try:
        start = len(server.batch_sizes)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            rows = [[float(i)] * 8 for i in range(16)]
            results = list(pool.map(lambda row: _predict(warm.port, [row]), rows))
    finally:
        server.options.max_wait_ms = 1.0
    assert all(status == 200 and len(body["predictions"]) == 1 for status, body in results)
    assert server.batch_sizes[start:] == [16]
    # each request got its own row back: identical rows give identical predictions, distinct ones differ
    assert len({json.dumps(body["predictions"]) for _, body in results}) == 16


@pytest.mark.parametrize(
    "body,status,message",
    [
        ("{not json", 400, "malformed JSON"),
        (json.dumps([1, 2]), 400, "KServe V1"),
        (json.dumps({"instances": []}), 400, "non-empty"),
        (json.dumps({"instances": [[0.0] * 7]}), 400, "wrong shape: each instance must have shape [8], got [7]"),
        (json.dumps({"instances": [[0.0] * 8, [0.0] * 7]}), 400, "ragged"),
        (json.dumps({"instances": [["a"] * 8]}), 400, "wrong dtype"),
        (json.dumps({"instances": [[True] * 8]}), 400, "wrong dtype"),
        ('{"instances": [[NaN, 0, 0, 0, 0, 0, 0, 0]]}', 400, "non-finite"),
        (json.dumps({"instances": [[0.0] * 8] * 17}), 413, "at most 16 per request"),
    ],
)
def test_bad_requests_get_a_clear_4xx_and_do_not_poison(warm, body, status, message):
    got, answer = _request(warm.port, "POST", "/v1/models/tiny:predict", body)
    assert got == status and message in answer["error"], answer
    good, answer = _predict(warm.port, [[1.0] * 8])
    assert good == 200 and len(answer["predictions"]) == 1


def test_unknown_model_is_404(warm):
    status, body = _predict(warm.port, [[0.0] * 8], name="other")
    assert status == 404 and "not found" in body["error"] and "'tiny'" in body["error"]
    assert _request(warm.port, "GET", "/v1/models/other")[0] == 404


@pytest.fixture(scope="module")
def tokens():
    """A token model (int64 inputs, an embedding of 10 ids), batch 4 of 6 tokens, a batch leaving only when full."""
    server = serve.Server(serve.Options(workload="tests.kit.kit_workloads:tiny_tokens", max_wait_ms=600_000.0))
    handle = _Running(server)
    _wait(lambda: _ready(handle.port), "the token server's readiness")
    yield handle
    handle.stop()


def test_integer_inputs_are_checked_for_dtype_and_range(tokens):
    for instances, message in (
        ([[0.5] * 6], "wrong dtype: the model takes int64, got floats"),
        ([[2**63] * 6], "values out of range for torch.int64"),
        ([[1] * 5], "wrong shape: each instance must have shape [6], got [5]"),
    ):
        status, body = _predict(tokens.port, instances, name="tiny_tokens")
        assert status == 400 and message in body["error"], body


def test_a_request_the_model_fails_on_does_not_fail_its_batch(tokens):
    """Three good requests and one with an out-of-range id (11, the embedding has 10) in one batch of 4: the bad
    one gets a 422 naming the model's error, the good ones their predictions (equal to CPU), and the server goes on."""
    reference = kit_workloads.tiny_tokens().make_model(0).eval()
    rows = [[1, 2, 3, 4, 5, 6], [0] * 6, [11] * 6, [9, 8, 7, 6, 5, 4]]
    start = len(tokens.server.batch_sizes)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda row: _predict(tokens.port, [row], name="tiny_tokens"), rows))
    assert tokens.server.batch_sizes[start] == 4
    status, body = results[2]
    assert status == 422 and "IndexError" in body["error"], body
    tolerance = checks.policy("float32")["outputs"]
    for row, (status, body) in zip(rows, results, strict=True):
        if row[0] == 11:
            continue
        assert status == 200, body
        with torch.no_grad():
            expected = reference(torch.tensor([row]))
        assert checks.compare(torch.tensor(body["predictions"]), expected, tolerance)["passed"]
    status, body = _predict(tokens.port, [row for row in rows if row[0] != 11] + [[2] * 6], name="tiny_tokens")
    assert status == 200 and len(body["predictions"]) == 4  # a full batch after the failure


def test_eager_mode_also_runs_only_catalogue_shapes():
    """--mode eager: per-op executables, each compiled at warm-up for the catalogue shapes; traffic adds none."""
    handle = _Running(serve.Server(serve.Options(workload=SPEC, mode="eager", max_wait_ms=1.0)))
    try:
        _wait(lambda: _ready(handle.port), "the eager server's readiness")
        before = serve._programs()
        for count in (1, 5, 9, 16):
            status, body = _predict(handle.port, [[0.1] * 8] * count)
            assert status == 200 and len(body["predictions"]) == count
        assert serve._programs() == before
    finally:
        handle.stop()


def test_sigterm_drains_in_flight_requests_then_exits_0():
    """A request waiting in the batcher (max wait of 10 minutes) when SIGTERM arrives is answered, then exit 0."""
    port = launch_env.free_port()
    env = child_env(root=os.getcwd())
    command = [sys.executable, "-m", "torch_tpu.kit.cli", "serve", SPEC, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--max-wait-ms", "600000"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait(lambda: _alive_ready(port, process), "the subprocess to be ready")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(_predict, port, [[1.0] * 8])
            _wait(lambda: _metric(port, "torch_tpu_serve_queue_instances") == 1, "the request to be queued")
            process.send_signal(signal.SIGTERM)
            status, body = answer.result(timeout=60)
        assert status == 200 and len(body["predictions"]) == 1
        assert process.wait(timeout=60) == 0
        output = process.stdout.read()
        assert "drained and stopped (SIGTERM)" in output, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _alive_ready(port: int, process: subprocess.Popen) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"serve exited with {process.returncode}: {process.stdout.read()}")
    try:
        return _ready(port)
    except OSError:
        return False


def _metric(port: int, name: str) -> float:
    text = _request(port, "GET", "/metrics")[1]
    return next(
        s.value for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples if s.name == name
    )
