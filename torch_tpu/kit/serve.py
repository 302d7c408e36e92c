"""`torch-tpu serve`: a workload's model behind an HTTP inference server (KServe V1 protocol) on tpu.

    torch-tpu serve examples.workloads:mlp --mode compiled --port 8080

Traffic must never compile: XLA compiles one program per shape, and a compile on the request path is a latency
spike of seconds. So the server only ever runs the shapes of the workload's catalogue (for the serving dtype):
concurrent requests are batched (up to the largest catalogued batch, or `max_batch`, waiting at most
`max_wait_ms` for more), the batch is padded on the host to the smallest catalogued batch that holds it (repeating
its last instance, a valid input), and the padding rows are dropped from the outputs. Padding assumes what eval-mode
inference gives: each instance's output depends on that instance only.

Probes follow the guide (§6): `/readyz` answers 200 only once the model is loaded and every catalogue shape has been
compiled and run warm (a repeat call that compiled nothing), and 503 again while draining; `/healthz` is liveness:
the process answers, and once warm the device runs a probe op within `liveness_timeout_s` (during warm-up the
device is busy compiling, which must not get the replica restarted: that is the startupProbe's window).
SIGTERM drains: uvicorn stops accepting connections, the batcher flushes what is queued without waiting, in-flight
requests get their answers, then the process exits 0.

All device work runs on one worker thread (compiles, batches, probes), so the event loop stays responsive and the
device sees one caller. Bad requests get a 4xx with `{"error": ...}` naming what was wrong; they are rejected
before reaching the batcher, so they cannot poison a batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import torch
import uvicorn
from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from torch_tpu.kit import metrics
from torch_tpu.kit import workload as workload_mod

log = logging.getLogger("torch_tpu.serve")
_DRAIN = object()  # queued by `begin_drain`: flush the batch being gathered now


@dataclasses.dataclass
class Options:
    workload: str
    mode: str = "compiled"
    host: str = "0.0.0.0"
    port: int = 8080
    dtype: str | None = None  # default: the catalogue's first shape's dtype
    max_batch: int | None = None  # default: the largest catalogued batch
    max_wait_ms: float = 5.0
    max_body_bytes: int = 16 << 20
    liveness_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    name: str | None = None  # default: the workload's name


class RequestError(Exception):
    """A request the server refuses, with the HTTP status and the message the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Catalogue:
    """The shapes traffic may run: per instance shape, the catalogued batch sizes of the serving dtype."""

    def __init__(self, work: workload_mod.Workload, dtype: str) -> None:
        shapes = [s for s in work.shapes if s.dtype == dtype]
        if not shapes:
            raise workload_mod.WorkloadError(f"the catalogue of {work.name!r} has no shape of dtype {dtype}")
        self.dtype = getattr(torch, dtype)
        self.batches: dict[tuple[int, ...], list[int]] = {}
        self.examples: dict[tuple[int, ...], torch.Tensor] = {}  # (batch, *instance shape)
        self.input_dtype: torch.dtype | None = None
        for shape in shapes:
            inputs, _ = work.make_batch(shape, 0)
            if not isinstance(inputs, torch.Tensor):
                raise workload_mod.WorkloadError(
                    f"serve needs a single tensor input; {work.name!r} makes {type(inputs).__name__}"
                )
            if self.input_dtype not in (None, inputs.dtype):
                raise workload_mod.WorkloadError(
                    f"{work.name!r} makes inputs of dtypes {self.input_dtype}, {inputs.dtype}"
                )
            self.input_dtype = inputs.dtype
            key = tuple(inputs.shape[1:])
            self.batches.setdefault(key, []).append(shape.batch)
            self.examples[(shape.batch, *key)] = self.cast(inputs)
        for sizes in self.batches.values():
            sizes.sort()

    @property
    def floating(self) -> bool:
        return self.input_dtype is not None and self.input_dtype.is_floating_point

    def cast(self, inputs: torch.Tensor) -> torch.Tensor:
        """Inputs as the model takes them: floating ones in the serving dtype (on the host, so tpu sees no cast)."""
        return inputs.to(self.dtype) if inputs.is_floating_point() else inputs

    def bucket(self, key: tuple[int, ...], count: int) -> int:
        """The smallest catalogued batch for `key` that holds `count` instances."""
        return next(size for size in self.batches[key] if size >= count)

    def describe(self) -> list[dict[str, Any]]:
        return [{"instance_shape": list(k), "batches": v} for k, v in self.batches.items()]


class Model:
    """The model on tpu and everything that touches the device; its methods run on the device thread only."""

    def __init__(self, work: workload_mod.Workload, catalogue: Catalogue, mode: str) -> None:
        self.work, self.catalogue, self.mode = work, catalogue, mode
        self.runner: Any = None

    def load(self) -> None:
        model = self.work.make_model(0).to(device="tpu", dtype=self.catalogue.dtype).eval()
        self.runner = torch.compile(model, backend="tpu", dynamic=False) if self.mode == "compiled" else model
        self.probe()  # its ops compile now, not on the first liveness check after warm-up

    def warm(self, batch: int, key: tuple[int, ...]) -> dict[str, Any]:
        """Compile one catalogue shape, then run it again: the repeat must compile nothing."""
        example = self.catalogue.examples[(batch, *key)]
        start = time.perf_counter()
        self.infer(example)
        first = time.perf_counter() - start
        before = _programs()
        self.infer(example)
        if _programs() != before:
            raise RuntimeError(f"shape {[batch, *key]} compiled again on its repeat call: it would compile in traffic")
        return {"shape": [batch, *key], "first_call_seconds": first}

    def infer(self, inputs: torch.Tensor) -> torch.Tensor:
        """Outputs for `inputs` (on the host, a catalogued shape or smaller), padded to its bucket on the host."""
        count, key = inputs.shape[0], tuple(inputs.shape[1:])
        size = self.catalogue.bucket(key, count)
        if size != count:
            inputs = torch.cat([inputs, inputs[-1:].expand(size - count, *key)])
        with torch.inference_mode():
            output = self.runner(inputs.to("tpu"))
            if not isinstance(output, torch.Tensor):
                raise TypeError(f"serve needs a tensor output; the model returned {type(output).__name__}")
            return output.cpu()[:count]

    def probe(self) -> None:
        """A tiny op on the device, read back: the device answers."""
        if float(torch.ones(2, device="tpu").add(1).sum().cpu()) != 4.0:
            raise RuntimeError("the device probe computed a wrong value")


def _programs() -> int:
    """New device programs so far (executables and torch.compile graphs): what must stay flat in traffic."""
    values = metrics.runtime_values()
    return values["executables"] + values["graphs"]


@dataclasses.dataclass
class _Pending:
    key: tuple[int, ...]
    inputs: torch.Tensor
    future: asyncio.Future


class Server:
    """The HTTP side: request parsing, the batcher, probes and metrics around one `Model`."""

    def __init__(self, options: Options, warm_on_start: bool = True) -> None:
        self.options = options
        self.work = workload_mod.load(options.workload)
        self.name = options.name or self.work.name
        self.catalogue = Catalogue(self.work, options.dtype or self.work.shapes[0].dtype)
        largest = max(max(sizes) for sizes in self.catalogue.batches.values())
        self.max_batch = options.max_batch or largest
        if not 1 <= self.max_batch <= largest:
            raise ValueError(f"max batch {self.max_batch} must be in [1, {largest}], the largest catalogued batch")
        self.model = Model(self.work, self.catalogue, options.mode)
        self.warm_on_start = warm_on_start
        self.state, self.reason = "loading", "the model is loading"
        self.warmup: list[dict[str, Any]] = []
        self.warmup_seconds = 0.0
        self.batch_sizes: list[int] = []  # instances per device batch, in order (tests and the status read them)
        self.programs_at_ready: int | None = None
        self.device = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch_tpu_device")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue: asyncio.Queue | None = None
        self.draining = False
        self._init_metrics()

    def _init_metrics(self) -> None:
        self.registry = metrics.registry(training=False)
        r = self.registry
        self.requests = Counter("torch_tpu_serve_requests", "Predict requests, per status code", ["code"], registry=r)
        self.latency = Histogram(
            "torch_tpu_serve_request_seconds",
            "Predict request latency",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        powers = sorted({min(2**i, self.max_batch) for i in range(self.max_batch.bit_length() + 1)})
        self.batch_histogram = Histogram(
            "torch_tpu_serve_batch_instances", "Real instances per device batch", buckets=powers, registry=r
        )
        self.padding = Counter("torch_tpu_serve_padding_instances", "Padding rows run on the device", registry=r)
        self.queued = Gauge("torch_tpu_serve_queue_instances", "Instances waiting for a batch", registry=r)
        self.inflight = Gauge("torch_tpu_serve_inflight_requests", "Predict requests being answered", registry=r)
        Gauge("torch_tpu_serve_ready", "1 when /readyz is ready", registry=r).set_function(
            lambda: float(self.state == "ready")
        )
        Gauge("torch_tpu_serve_warmup_seconds", "Load and warm-up wall time", registry=r).set_function(
            lambda: self.warmup_seconds
        )
        Gauge(
            "torch_tpu_serve_programs_since_ready", "Device programs created after warm-up (should stay 0)", registry=r
        ).set_function(lambda: _programs() - self.programs_at_ready if self.programs_at_ready is not None else 0)

    # --- lifecycle ------------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        batcher = asyncio.create_task(self._batch_loop())
        warming = asyncio.create_task(self.warm()) if self.warm_on_start else None
        yield
        for task in (batcher, warming):
            if task is not None:
                task.cancel()
        self.device.shutdown(wait=True)

    async def warm(self) -> None:
        """Load the model, then compile and warm every catalogue shape; ready only when all are done."""
        assert self.loop is not None
        start = time.perf_counter()
        try:
            await self.loop.run_in_executor(self.device, self.model.load)
            shapes = [(b, k) for k, sizes in self.catalogue.batches.items() for b in sizes]
            for done, (batch, key) in enumerate(shapes):
                self.state, self.reason = "warming", f"warming up: {done}/{len(shapes)} catalogue shapes compiled"
                self.warmup.append(await self.loop.run_in_executor(self.device, self.model.warm, batch, key))
        except Exception as exc:  # a replica that cannot warm up must say why, on both probes
            self.state, self.reason = "failed", f"warm-up failed: {type(exc).__name__}: {exc}"
            log.error(self.reason)
            return
        self.warmup_seconds = time.perf_counter() - start
        self.programs_at_ready = await self.loop.run_in_executor(self.device, _programs)
        if not self.draining:
            self.state, self.reason = "ready", "model loaded and every catalogue shape compiled and warm"
        log.info("ready after %.1f s: %s", self.warmup_seconds, self.catalogue.describe())

    def start_warmup(self) -> None:
        """Begin warm-up from another thread (a server built with warm_on_start=False)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.warm()))

    def begin_drain(self) -> None:
        """Stop being ready and flush the batch being gathered (on SIGTERM; runs on the event loop)."""
        self.draining = True
        self.state, self.reason = "draining", "shutting down: finishing in-flight requests"
        if self.queue is not None:
            self.queue.put_nowait(_DRAIN)

    # --- batching -------------------------------------------------------------------------------------------------

    async def _batch_loop(self) -> None:
        """Gather queued requests of one instance shape into a batch (max batch, max wait), run it, repeat."""
        assert self.queue is not None and self.loop is not None
        carry: _Pending | None = None
        while True:
            first = carry if carry is not None else await self.queue.get()
            carry = None
            if first is _DRAIN:
                continue
            items, count = [first], first.inputs.shape[0]
            deadline = self.loop.time() + self.options.max_wait_ms / 1000
            while count < self.max_batch:
                wait = 0.0 if self.draining else deadline - self.loop.time()
                try:
                    item = self.queue.get_nowait() if wait <= 0 else await asyncio.wait_for(self.queue.get(), wait)
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if item is _DRAIN:
                    break
                if item.key != first.key or count + item.inputs.shape[0] > self.max_batch:
                    carry = item
                    break
                items.append(item)
                count += item.inputs.shape[0]
            self.queued.dec(count)
            await self._run(items, count)

    async def _run(self, items: list[_Pending], count: int) -> None:
        """Run one batch; if it fails, run each of its requests alone, so that only the one whose instances the
        model fails on (an out-of-range token id, say) gets the error and the others their predictions."""
        assert self.loop is not None
        self.batch_sizes.append(count)
        self.batch_histogram.observe(count)
        self.padding.inc(self.catalogue.bucket(items[0].key, count) - count)
        try:
            outputs = await self.loop.run_in_executor(
                self.device, self.model.infer, torch.cat([item.inputs for item in items])
            )
        except Exception as exc:
            if len(items) > 1:
                for item in items:
                    await self._run([item], item.inputs.shape[0])
                return
            # Warm-up ran the model on every catalogue shape, so a failure on one request's values is its input's.
            log.warning("the model failed on a request: %s: %s", type(exc).__name__, exc)
            message = f"the model failed on these instances: {type(exc).__name__}: {exc}"
            if not items[0].future.done():  # done: its handler was cancelled (a drain past its timeout)
                items[0].future.set_exception(RequestError(422, message))
            return
        start = 0
        for item in items:
            end = start + item.inputs.shape[0]
            if not item.future.done():
                item.future.set_result(outputs[start:end])
            start = end

    # --- requests -------------------------------------------------------------------------------------------------

    def parse(self, body: bytes) -> torch.Tensor:
        """The instances of a KServe V1 predict body as one host tensor, or RequestError saying what is wrong."""
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"malformed JSON: {exc}") from None
        if not isinstance(payload, dict) or "instances" not in payload:
            raise RequestError(400, 'the body must be a JSON object {"instances": [...]} (KServe V1 predict)')
        instances = payload["instances"]
        if not isinstance(instances, list) or not instances:
            raise RequestError(400, '"instances" must be a non-empty list')
        if len(instances) > self.max_batch:
            raise RequestError(413, f"{len(instances)} instances: at most {self.max_batch} per request")
        expected = " or ".join(str(list(k)) for k in self.catalogue.batches)
        try:
            array = np.asarray(instances)
        except (ValueError, OverflowError):
            raise RequestError(400, f"wrong shape: instances are ragged; each must have shape {expected}") from None
        if array.dtype == object:
            raise RequestError(400, f"wrong shape or dtype: instances must be numbers of shape {expected}")
        if tuple(array.shape[1:]) not in self.catalogue.batches:
            raise RequestError(
                400, f"wrong shape: each instance must have shape {expected}, got {list(array.shape[1:])}"
            )
        want = self.catalogue.input_dtype
        kinds = "iuf" if self.catalogue.floating else "iu"
        if array.dtype.kind not in kinds:
            got = {"f": "floats", "b": "booleans", "U": "strings"}.get(array.dtype.kind, str(array.dtype))
            raise RequestError(400, f"wrong dtype: the model takes {str(want).removeprefix('torch.')}, got {got}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise RequestError(400, "instances hold non-finite values (NaN or infinity)")
        if array.dtype.kind in "iu" and not self.catalogue.floating:
            info = torch.iinfo(want)
            if array.min() < info.min or array.max() > info.max:
                raise RequestError(400, f"values out of range for {want}")
        return self.catalogue.cast(torch.from_numpy(np.ascontiguousarray(array)).to(want))

    async def _body(self, request: Request) -> bytes:
        limit = self.options.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise RequestError(413, f"body of {length} bytes: at most {limit}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, f"body over {limit} bytes")
        return bytes(body)

    def _check_model(self, name: str) -> None:
        if name != self.name:
            raise RequestError(404, f"model {name!r} not found; this server serves {self.name!r}")

    async def predict(self, request: Request) -> Response:
        start = time.perf_counter()
        self.inflight.inc()
        try:
            self._check_model(request.path_params["name"])
            if self.state != "ready":
                raise RequestError(503, f"model {self.name!r} is not ready: {self.reason}")
            inputs = self.parse(await self._body(request))
            assert self.loop is not None and self.queue is not None
            pending = _Pending(tuple(inputs.shape[1:]), inputs, self.loop.create_future())
            self.queued.inc(inputs.shape[0])
            self.queue.put_nowait(pending)
            outputs = await pending.future
            if outputs.is_floating_point() and not torch.isfinite(outputs).all():
                raise RuntimeError("the model produced non-finite outputs")
            response = JSONResponse({"predictions": outputs.float().tolist()})
        except RequestError as exc:
            response = JSONResponse({"error": str(exc)}, status_code=exc.status)
        except Exception as exc:  # the model's failure on a valid request: 500, and the server goes on
            response = JSONResponse({"error": f"inference failed: {type(exc).__name__}: {exc}"}, status_code=500)
        finally:
            self.inflight.dec()
        self.requests.labels(str(response.status_code)).inc()
        self.latency.observe(time.perf_counter() - start)
        return response

    async def status(self, request: Request) -> Response:
        try:
            self._check_model(request.path_params["name"])
        except RequestError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return JSONResponse(
            {
                "name": self.name,
                "ready": self.state == "ready",
                "state": self.state,
                "reason": self.reason,
                "mode": self.options.mode,
                "dtype": str(self.catalogue.dtype).removeprefix("torch."),
                "max_batch": self.max_batch,
                "max_wait_ms": self.options.max_wait_ms,
                "catalogue": self.catalogue.describe(),
                "warmup": self.warmup,
                "warmup_seconds": self.warmup_seconds,
            }
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse({"models": [self.name]})

    async def readyz(self, request: Request) -> Response:
        ready = self.state == "ready"
        return JSONResponse(
            {"ready": ready, "state": self.state, "reason": self.reason}, status_code=200 if ready else 503
        )

    async def healthz(self, request: Request) -> Response:
        if self.state == "failed":
            return JSONResponse({"alive": False, "reason": self.reason}, status_code=503)
        if self.state != "ready":  # the device is busy compiling: alive as long as the process answers
            return JSONResponse({"alive": True, "state": self.state})
        assert self.loop is not None
        try:
            probe = self.loop.run_in_executor(self.device, self.model.probe)
            await asyncio.wait_for(probe, self.options.liveness_timeout_s)
        except Exception as exc:
            reason = f"device probe failed: {type(exc).__name__}: {exc}"
            return JSONResponse({"alive": False, "reason": reason}, status_code=503)
        return JSONResponse({"alive": True, "state": self.state})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    def app(self) -> Starlette:
        routes = [
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.metrics_endpoint),
            Route("/v1/models", self.models),
            Route("/v1/models/{name}:predict", self.predict, methods=["POST"]),
            Route("/v1/models/{name}", self.status),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling ours when a signal starts its graceful shutdown."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.torch_tpu_server = server

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        loop = self.torch_tpu_server.loop
        if loop is not None:
            loop.call_soon_threadsafe(self.torch_tpu_server.begin_drain)


def config(server: Server, port: int | None = None, host: str | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        server.app(),
        host=host or server.options.host,
        port=server.options.port if port is None else port,
        log_level="info",
        access_log=False,  # a line per request costs the event loop; /metrics counts requests by status
        timeout_graceful_shutdown=server.options.drain_timeout_s,
        lifespan="on",
    )


def run(options: Options) -> int:
    """Serve until SIGTERM or SIGINT, drain, return 0 (uvicorn re-raises the signal after its graceful shutdown:
    the handler installed here turns that into a normal exit)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    server = Server(options)
    drained = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, frame: drained.append(number))
    _Uvicorn(config(server), server).run()
    log.info("drained and stopped (%s)", ", ".join(signal.Signals(s).name for s in drained) or "no signal")
    return 0
