"""Load test of `torch-tpu serve` on loopback: latency percentiles and throughput at fixed concurrency levels, and the
SLO-bounded throughput (the guide's inference contract: the highest throughput whose p99 stays within the SLO).

    python bench/serve_load.py [--workload examples.workloads:mlp] [--levels 1,2,4,8,16,32] [--slo-ms 50]

The server runs as the real command in a subprocess (its own session, killed by PID at --timeout); each client is
a thread with one keep-alive connection sending one-instance predict requests back to back (a closed loop, so
offered load grows with concurrency). Per level: p50/p90/p99 latency, requests per second, the mean device batch
(from the server's batch histogram: what batching gathered) and the speedup over concurrency 1 in the same run.
The client threads share the machine with the server: on few cores the figures are a floor.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from jobs import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _get(port: int, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def _metric(port: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = _get(port, "/metrics")[1]
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _client(port: int, model: str, body: bytes, count: int) -> list[float]:
    """`count` requests on one keep-alive connection; their latencies in seconds."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            connection.request("POST", f"/v1/models/{model}:predict", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"predict answered {response.status}")
            latencies.append(time.perf_counter() - start)
    finally:
        connection.close()
    return latencies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def level(port: int, model: str, body: bytes, concurrency: int, requests: int) -> dict:
    batches, batched = (
        _metric(port, "torch_tpu_serve_batch_instances_count"),
        _metric(port, "torch_tpu_serve_batch_instances_sum"),
    )
    per_client = max(1, requests // concurrency)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        latencies = [
            x for r in pool.map(lambda _: _client(port, model, body, per_client), range(concurrency)) for x in r
        ]
    wall = time.perf_counter() - start
    batches = _metric(port, "torch_tpu_serve_batch_instances_count") - batches
    batched = _metric(port, "torch_tpu_serve_batch_instances_sum") - batched
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p90_ms": _percentile(latencies, 0.90) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "requests_per_second": len(latencies) / wall,
        "mean_batch": batched / batches if batches else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="examples.workloads:mlp")
    parser.add_argument("--mode", default="compiled", choices=("compiled", "eager"))
    parser.add_argument("--levels", default="1,2,4,8,16,32")
    parser.add_argument("--requests", type=int, default=400, help="requests per level")
    parser.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency SLO for the bounded throughput")
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=540.0, help="hard limit for the whole run, seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout

    port = free_port()
    command = [sys.executable, "-m", "torch_tpu.kit.cli", "serve", args.workload, "--mode", args.mode]
    command += ["--host", "127.0.0.1", "--port", str(port), "--max-wait-ms", str(args.max_wait_ms)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not become ready (exit status {server.poll()})")
            try:
                if _get(port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        status = json.loads(_get(port, "/v1/models")[1])
        model = status["models"][0]
        info = json.loads(_get(port, f"/v1/models/{model}")[1])
        features = info["catalogue"][0]["instance_shape"]
        instance = [0.5] * features[0] if len(features) == 1 else [[1] * features[1]] * features[0]
        body = json.dumps({"instances": [instance]}).encode()
        _client(port, model, body, 20)  # the first requests after readiness, untimed
        results = []
        for concurrency in [int(c) for c in args.levels.split(",")]:
            if time.monotonic() > deadline:
                raise RuntimeError("out of time before every level ran")
            results.append(level(port, model, body, concurrency, args.requests))
        compiled_in_traffic = _metric(port, "torch_tpu_serve_programs_since_ready")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()

    base = results[0]["requests_per_second"]
    within = [r for r in results if r["p99_ms"] <= args.slo_ms]
    bounded = max(within, key=lambda r: r["requests_per_second"]) if within else None
    print(
        f"{args.workload} ({args.mode}), catalogue {info['catalogue']}, max wait {args.max_wait_ms} ms, "
        f"warm-up {info['warmup_seconds']:.1f} s, one-instance requests"
    )
    print(f"{'clients':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'req/s':>8} {'vs 1':>6} {'batch':>6}")
    for r in results:
        print(
            f"{r['concurrency']:>7} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['requests_per_second']:>8.1f} {r['requests_per_second'] / base:>5.2f}x {r['mean_batch']:>6.2f}"
        )
    print(
        f"SLO-bounded throughput (p99 <= {args.slo_ms} ms): "
        + (f"{bounded['requests_per_second']:.1f} req/s at {bounded['concurrency']} clients" if bounded else "none")
    )
    print(f"device programs created during the load: {compiled_in_traffic:.0f}")
    print(json.dumps({"levels": results, "slo_ms": args.slo_ms, "slo_bounded": bounded}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
