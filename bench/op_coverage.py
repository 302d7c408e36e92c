"""OpInfo coverage: every op in PyTorch's `op_db`, every sample input, on `tpu` against CPU PyTorch.

For each op and each dtype of float32, bfloat16, int64 and bool that the OpInfo supports on CPU, every sample's
forward outputs are compared with CPU PyTorch (tolerances: `torch_tpu.testing.compare.TOLERANCES`), and for
differentiable ops in float32 also the gradients w.r.t. the sample's tensor inputs. Random ops (outputs that
differ between two CPU runs with different seeds) are checked for shapes and dtypes only.

CPU's float32 result is not exact either: where a long reduction (a convolution's gradient, `matrix_exp`) makes
the two devices' rounding differ by more than the fixed tolerance, the sample is judged against a float64 CPU
reference instead: it passes if the `tpu` error is within the fixed tolerance plus twice CPU's own largest error
(`torch_tpu.testing.compare.assert_as_accurate_as_cpu`), i.e. if `tpu` is as accurate as CPU PyTorch.

Each (op, dtype) runs in a worker subprocess (spawned; restarted after a crash, or a hang: a sample running past
`--timeout`), so a crash or hang counts against that op only. The CPU fallback is on: an op that used it is
classed `fallback`, never `passed`; PyTorch decompositions (`torch_tpu.metrics.decompositions`) are counted
separately.

Usage: python bench/op_coverage.py [--ops name1,name2] [--jobs 2] [--timeout 180] [--doc docs/op_coverage.md]
`--ops` takes OpInfo names (`linalg.svd`) or names with variants (`linalg.svd` runs all its variants,
`nn.functional.pad.reflect` one). Without `--ops`, the whole op_db runs and the doc is written, with the raw
results beside it (docs/op_coverage.json). `--rerun-failing` re-runs only the OpInfos that did not pass in that
JSON (after fixes; with `--ops`, those too) and rewrites both, saying in the doc which OpInfos come from the re-run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from typing import Any

DTYPES = ("float32", "bfloat16", "int64", "bool")
STATUSES = ("passed", "wrong", "error", "fallback", "skipped")
_SEVERITY = {"error": 4, "wrong": 3, "fallback": 2, "passed": 1}
_WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "TORCH_TPU_CPU_FALLBACK": "1",
}
# Ops whose outputs are unique only up to a gauge (signs or phases of singular vectors and eigenvectors): they
# match when CPU's and tpu's outputs agree after the OpInfo's own `output_process_fn_grad`, which removes it.
GAUGE_FREE = {"svd", "linalg.svd", "linalg.eig", "linalg.eigh", "svd_lowrank", "pca_lowrank"}
_TASKS_PER_WORKER = 150  # restart workers now and then: executables and traced functions pile up


def op_key(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def one_line(error: BaseException) -> str:
    """`Type: message`, squeezed onto one short line (assert_close's mismatch summary kept)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, AssertionError) and len(lines) > 1 and lines[0].startswith(("Tensor-likes", "Scalars")):
        lines = [lines[0]] + [line for line in lines[1:] if line.startswith(("Mismatched", "Greatest"))]
    text = " ".join(lines)[:300]
    return f"{type(error).__name__}: {text}"


# ---------------------------------------------------------------- worker side


class Tally:
    """Sample outcomes of one (op, dtype) forward or gradient check."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.first: dict[str, str] = {}
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.decompositions: collections.Counter[str] = collections.Counter()

    def add(self, outcome: str, message: str = "") -> None:
        self.counts[outcome] += 1
        if message and outcome not in self.first:
            self.first[outcome] = message

    def record(self, note: str = "") -> dict[str, Any]:
        ran = {k: v for k, v in self.counts.items() if k in _SEVERITY}
        if not ran:
            status, message = "skipped", note or self.first.get("cpu_error", "no sample runs on CPU")
        else:
            status = max(ran, key=_SEVERITY.get)
            message = self.first.get(status, "")
            if status == "fallback":
                message = "CPU fallback: " + ", ".join(sorted(self.fallbacks))
        return {
            "status": status,
            "message": message,
            "samples": dict(self.counts),
            "fallbacks": dict(self.fallbacks),
            "decompositions": dict(self.decompositions),
        }


def _leaves(value: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(value)


def _walk(value: Any, twin: Any, fn: Any) -> Any:
    """`fn(leaf, twin leaf)` over `value`'s lists, tuples and dicts; `twin` has the same structure, else None."""
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        twins = twin if isinstance(twin, (list, tuple)) and len(twin) == len(value) else [None] * len(value)
        return type(value)(_walk(v, t, fn) for v, t in zip(value, twins, strict=True))
    if isinstance(value, dict):
        twins = twin if isinstance(twin, dict) and twin.keys() == value.keys() else dict.fromkeys(value)
        return {k: _walk(v, twins[k], fn) for k, v in value.items()}
    return fn(value, twin)


def _placements(op: Any, dtype: Any, requires_grad: bool, count: int) -> list[Any]:
    """The samples again, generated on the meta device: where a sample function puts a tensor or device on CPU
    on purpose (tensor_split's indices, `to("cpu")`), its twin is on CPU rather than on the test device (meta).
    None for each sample when generation on meta fails or gives other samples."""
    try:
        twins = list(op.sample_inputs("meta", dtype, requires_grad=requires_grad))
    except Exception:
        return [None] * count
    return twins if len(twins) == count else [None] * count


def _on_test_device(twin_device: Any) -> bool:
    """Whether a tensor or device of a CPU sample stands for the test device: its twin's device (or device
    string) is meta, or there is no twin to tell."""
    return twin_device is None or str(twin_device).startswith("meta")


def _copy(tensor: Any, device: str) -> Any:
    """A copy of `tensor` on `device` with the same strides and storage offset: its whole storage is copied (some
    samples are views that reach outside their own elements, e.g. as_strided's)."""
    import torch

    tensor = tensor.detach()
    if tensor.layout != torch.strided or tensor.is_conj() or tensor.is_neg():
        return tensor.to(device, copy=True)
    length = tensor.untyped_storage().nbytes() // tensor.element_size()
    if tensor.is_contiguous() and tensor.storage_offset() == 0 and length == tensor.numel():
        return tensor.to(device, copy=True)
    whole = torch.empty(0, dtype=tensor.dtype).set_(tensor.untyped_storage(), 0, (length,), (1,))
    return whole.to(device, copy=True).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _moved(sample: Any, to_device: bool, placement: Any = None) -> Any:
    """`sample` with its tensors copied: to `tpu` (keeping requires_grad; CPU devices become `tpu`), except
    where the `placement` twin (see `_placements`) shows CPU on purpose; or cloned on CPU without grad."""
    import torch
    from torch.testing._internal.opinfo.core import SampleInput

    def move(value: Any, twin: Any) -> Any:
        if isinstance(value, torch.Tensor):
            twin_device = twin.device if isinstance(twin, torch.Tensor) else None
            device = "tpu" if to_device and _on_test_device(twin_device) else "cpu"
            with torch.no_grad():
                return _copy(value, device).requires_grad_(value.requires_grad and to_device)
        if to_device and _is_cpu_device(value) and _on_test_device(twin):
            return torch.device("tpu") if isinstance(value, torch.device) else "tpu"
        return value

    twin = placement or SampleInput(None)
    return SampleInput(
        _walk(sample.input, twin.input, move),
        args=_walk(sample.args, twin.args, move),
        kwargs=_walk(sample.kwargs, twin.kwargs, move),
        output_process_fn_grad=sample.output_process_fn_grad,
        broadcasts_input=sample.broadcasts_input,
        name=sample.name,
    )


def _call(op: Any, sample: Any, device: str | None = None) -> Any:
    """`op` on `sample`; a factory call (no tensor in the sample) allocates on `device`."""
    import torch

    if device is None or any(isinstance(t, torch.Tensor) for t in _leaves((sample.input, sample.args, sample.kwargs))):
        return op(sample.input, *sample.args, **sample.kwargs)
    with torch.device(device):
        return op(sample.input, *sample.args, **sample.kwargs)


def _identical(a: Any, b: Any) -> bool:
    import torch

    flat_a, flat_b = _leaves(a), _leaves(b)
    if len(flat_a) != len(flat_b):
        return False
    for x, y in zip(flat_a, flat_b, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            try:
                torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
            except AssertionError:
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return False
    return True


@contextlib.contextmanager
def _unseeded(op: Any) -> Any:
    """OpInfos run random ops through `wrapper_set_seed`, which fixes the seed; lift that (True if it was there)."""
    namespace, code = getattr(op.op, "__globals__", {}), getattr(op.op, "__code__", None)
    original = namespace.get("wrapper_set_seed")
    if original is None or code is None or "wrapper_set_seed" not in code.co_names:
        yield False
        return
    namespace["wrapper_set_seed"] = lambda fn, *args, **kwargs: fn(*args, **kwargs)
    try:
        yield True
    finally:
        namespace["wrapper_set_seed"] = original


def _deterministic(op: Any, twin: Any, expected: Any) -> bool:
    """Whether CPU runs under other seeds reproduce `expected` (ops that fix their seed get three tries, as tiny
    random samples can agree by chance)."""
    import torch

    with _unseeded(op) as seeded, torch.no_grad():
        for seed in (1, 2, 3) if seeded else (1,):
            torch.manual_seed(seed)
            try:
                again = _call(op, _moved(twin, to_device=False))
            except Exception:  # cannot tell: compare values
                return True
            if not _identical(expected, again):
                return False
    return True


class Misplaced(AssertionError):
    """An output is not on `tpu` (no value check can rescue that)."""


def _is_cpu_device(value: Any) -> bool:
    """Whether `value` names the CPU device (a `torch.device` or the string)."""
    import torch

    return isinstance(value, torch.device) and value.type == "cpu" or isinstance(value, str) and value == "cpu"


def _names_cpu(sample: Any) -> bool:
    """Whether the sample asks for the CPU on purpose (`new_empty(..., device="cpu")`, a CPU `device` its meta
    twin kept): its outputs belong on the CPU."""
    return any(_is_cpu_device(value) for value in sample.kwargs.values())


def _check_outputs(actual: Any, expected: Any, values: bool, cpu_ok: bool = False) -> None:
    """Outputs on `tpu` (or anywhere, with `cpu_ok`) and equal to CPU's (shapes and dtypes only unless `values`)."""
    import torch

    from torch_tpu.testing import compare

    for value in _leaves(actual):
        if isinstance(value, torch.Tensor) and value.device.type != "tpu" and not cpu_ok:
            raise Misplaced(f"an output is on {value.device}, expected tpu")
    if values:
        compare.assert_close(actual, expected)
        return
    flat_a, flat_e = _leaves(compare.to_cpu(actual)), _leaves(expected)
    if len(flat_a) != len(flat_e):
        raise AssertionError(f"{len(flat_a)} outputs != {len(flat_e)}")
    for a, e in zip(flat_a, flat_e, strict=True):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype:
                raise AssertionError(
                    f"random output {getattr(a, 'shape', a)} {getattr(a, 'dtype', '')} != {e.shape} {e.dtype}"
                )


def _widened(value: Any) -> Any:
    """`value` with floating tensors as float64 (complex as complex128), requires_grad kept; others as they are."""
    import torch

    def widen(t: Any, _: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
            return t
        wide = torch.complex128 if t.is_complex() else torch.float64
        return t.detach().to(wide).requires_grad_(t.requires_grad)

    return _walk(value, None, widen)


def _reference64(op: Any, sample: Any) -> tuple[Any, Any]:
    """The sample in float64 and `op`'s outputs on it (on CPU)."""
    from torch.testing._internal.opinfo.core import SampleInput

    wide = SampleInput(
        _widened(sample.input),
        args=_widened(sample.args),
        kwargs=_widened(sample.kwargs),
        output_process_fn_grad=sample.output_process_fn_grad,
    )
    return wide, _call(op, wide)


def _as_accurate_as_cpu(actual: Any, expected: Any, reference: Any) -> bool:
    from torch_tpu.testing import compare

    try:
        compare.assert_as_accurate_as_cpu(actual, expected, reference)
    except AssertionError:
        return False
    return True


def _same_processed(sample: Any, actual: Any, expected: Any) -> bool:
    """Whether the outputs agree after the OpInfo's `output_process_fn_grad` (which fixes their gauge)."""
    try:
        _check_outputs(sample.output_process_fn_grad(actual), sample.output_process_fn_grad(expected), True)
    except Exception:
        return False
    return True


def _counters() -> tuple[collections.Counter, collections.Counter]:
    from torch_tpu import metrics

    return collections.Counter(metrics.cpu_fallbacks), collections.Counter(metrics.decompositions)


def _note_dispatch(tally: Tally, before: tuple) -> bool:
    """Add the fallbacks/decompositions since `before` to `tally`; True if anything fell back to the CPU."""
    fallbacks, decompositions = _counters()
    fell = fallbacks - before[0]
    tally.fallbacks.update(fell)
    tally.decompositions.update(decompositions - before[1])
    return bool(fell)


def _differentiable(outputs: Any) -> list[int]:
    import torch

    return [
        i
        for i, o in enumerate(outputs)
        if isinstance(o, torch.Tensor) and o.requires_grad and (o.is_floating_point() or o.is_complex())
    ]


def _run_sample(op: Any, sample: Any, placement: Any, forward: Tally, grad: Tally | None) -> None:
    import torch

    from torch_tpu.testing import compare

    device_sample = _moved(sample, to_device=True, placement=placement)
    twin = _moved(sample, to_device=False)
    torch.manual_seed(0)
    try:
        expected = _call(op, sample)
    except Exception as error:  # an invalid sample for this dtype on CPU: not the backend's failure
        forward.add("cpu_error", one_line(error))
        return
    random = op.has_nondeterministic_output or not _deterministic(op, twin, expected)
    before = _counters()
    torch.manual_seed(0)
    try:
        actual = _call(op, device_sample, "tpu")
        _leaves(compare.to_cpu(actual))  # wait for the device: errors surface here
    except Exception as error:
        _note_dispatch(forward, before)
        forward.add("error", one_line(error))
        if grad is not None:
            grad.add("error", "forward failed: " + one_line(error))
        return
    fell = _note_dispatch(forward, before)
    try:
        _check_outputs(actual, expected, values=not random, cpu_ok=_names_cpu(device_sample))
        forward.add("fallback" if fell else "passed")
    except Misplaced as error:
        forward.add("wrong", one_line(error))
    except Exception as error:
        if op.name in GAUGE_FREE and _same_processed(sample, actual, expected) or _accurate(op, twin, actual, expected):
            forward.add("fallback" if fell else "passed")
        else:
            forward.add("wrong", one_line(error))
    if grad is not None:
        _run_grad(op, sample, device_sample, expected, actual, random, grad)


def _accurate(op: Any, twin: Any, actual: Any, expected: Any) -> bool:
    """The float64 recheck of a forward result (see the module docstring)."""
    try:
        return _as_accurate_as_cpu(actual, expected, _reference64(op, twin)[1])
    except Exception:  # no float64 kernel, or other outputs: the fixed tolerance stands
        return False


def _run_grad(op: Any, sample: Any, device_sample: Any, expected: Any, actual: Any, random: bool, grad: Tally) -> None:
    import torch

    from torch_tpu.testing import compare

    tensors = _leaves((sample.input, sample.args, sample.kwargs))
    device_tensors = _leaves((device_sample.input, device_sample.args, device_sample.kwargs))
    wrt = [i for i, t in enumerate(tensors) if isinstance(t, torch.Tensor) and t.requires_grad]
    try:
        outputs = _leaves(sample.output_process_fn_grad(expected))
        picked = _differentiable(outputs)
        if not wrt or not picked:
            grad.add("no_grad")
            return
        seeds = [torch.randn_like(outputs[i]) for i in picked]
        expected_grads = torch.autograd.grad(
            [outputs[i] for i in picked], [tensors[i] for i in wrt], seeds, allow_unused=True
        )
    except Exception as error:
        grad.add("cpu_error", one_line(error))
        return
    before = _counters()
    try:
        device_outputs = _leaves(sample.output_process_fn_grad(actual))
        actual_grads = torch.autograd.grad(
            [device_outputs[i] for i in picked],
            [device_tensors[i] for i in wrt],
            compare.to_tpu(seeds),
            allow_unused=True,
        )
        actual_grads = list(actual_grads)
        compare.to_cpu(actual_grads)
    except Exception as error:
        _note_dispatch(grad, before)
        grad.add("error", one_line(error))
        return
    fell = _note_dispatch(grad, before)
    try:
        _check_outputs(actual_grads, list(expected_grads), values=not random)
        grad.add("fallback" if fell else "passed")
    except Exception as error:
        if not random and _accurate_grads(op, sample, picked, wrt, seeds, actual_grads, expected_grads):
            grad.add("fallback" if fell else "passed")
        else:
            grad.add("wrong", one_line(error))


def _accurate_grads(
    op: Any, sample: Any, picked: list[int], wrt: list[int], seeds: list[Any], actual: Any, expected: Any
) -> bool:
    """The float64 recheck of gradients: the same seeds through the same outputs of the float64 sample."""
    import torch

    try:
        wide, outputs = _reference64(op, sample)
        outputs = _leaves(sample.output_process_fn_grad(outputs))
        tensors = _leaves((wide.input, wide.args, wide.kwargs))
        reference = torch.autograd.grad(
            [outputs[i] for i in picked],
            [tensors[i] for i in wrt],
            [s.to(outputs[i].dtype) for s, i in zip(seeds, picked, strict=True)],
            allow_unused=True,
        )
        return _as_accurate_as_cpu(list(actual), list(expected), list(reference))
    except Exception:
        return False


def run_task(op: Any, dtype_name: str, progress: Any = None) -> dict[str, dict[str, Any]]:
    """Records for `op` in `dtype_name` (and, for differentiable ops in float32, for its gradients); `progress()`
    is called after each sample."""
    import torch

    dtype = getattr(torch, dtype_name)
    wants_grad = dtype == torch.float32 and op.supports_autograd
    forward, grad = Tally(), Tally() if wants_grad else None
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=wants_grad))
    except Exception as error:
        note = "sample_inputs failed: " + one_line(error)
        result = {dtype_name: Tally().record(note)}
        if wants_grad:
            result["grad"] = Tally().record(note)
        return result
    for sample, placement in zip(samples, _placements(op, dtype, wants_grad, len(samples)), strict=True):
        _run_sample(op, sample, placement, forward, grad)
        if progress is not None:
            progress()
    result = {dtype_name: forward.record()}
    if grad is not None:
        result["grad"] = grad.record("no differentiable output or input in the samples")
    return result


def worker(conn: multiprocessing.connection.Connection) -> None:
    """Receive (op key, dtype) tasks, send back records; None stops."""
    os.environ.update(_WORKER_ENV)
    import warnings

    warnings.simplefilter("ignore")
    import jax
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import torch_tpu
    from torch_tpu.eager.cache import executables

    torch_tpu.set_cpu_fallback(True)
    torch.set_num_threads(1)
    jax.config.update("jax_include_full_tracebacks_in_locations", False)  # faster tracing; no effect on results
    ops = {op_key(op): op for op in op_db}
    conn.send("ready")
    while (task := conn.recv()) is not None:
        key, dtype_name = task
        try:
            result = run_task(ops[key], dtype_name, progress=lambda: conn.send("tick"))
        except BaseException as error:  # a bug in the sweep itself: report it against the op, keep going
            result = {
                dtype_name: {
                    "status": "error",
                    "message": "sweep: " + one_line(error),
                    "trace": traceback.format_exc(limit=5),
                }
            }
        executables.clear()
        conn.send(result)


# ---------------------------------------------------------------- parent side


class Slot:
    """One worker process and the task it runs."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.start()

    def start(self) -> None:
        self.conn, child = self.context.Pipe()
        self.process = self.context.Process(target=worker, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.task: tuple[str, str] | None = None
        self.since = self.started = 0.0  # the last sign of progress; the task's start
        self.done = 0

    def restart(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()
        self.start()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()


def _failure_record(message: str) -> dict[str, Any]:
    return {"status": "error", "message": message, "samples": {}, "fallbacks": {}, "decompositions": {}}


def sweep(tasks: list[tuple[str, str]], jobs: int, timeout: float, grad_keys: set[str]) -> dict[str, dict]:
    """Run `tasks` on `jobs` workers; results[op key][dtype or "grad"] = record."""
    context = multiprocessing.get_context("spawn")
    slots = [Slot(context) for _ in range(min(jobs, len(tasks)))]
    pending = collections.deque(tasks)
    results: dict[str, dict] = collections.defaultdict(dict)
    try:
        _drive(slots, pending, results, timeout, len(tasks), grad_keys)
    finally:
        for slot in slots:
            slot.stop()
    return results


def _drive(
    slots: list[Slot], pending: collections.deque, results: dict, timeout: float, total: int, grad_keys: set[str]
) -> None:
    """Feed tasks to idle workers and collect results until every task has one."""
    finished = 0

    def lost(slot: Slot, why: str) -> None:
        nonlocal finished
        key, dtype_name = slot.task
        results[key][dtype_name] = _failure_record(why)
        if dtype_name == "float32" and key in grad_keys:
            results[key]["grad"] = _failure_record(why)
        finished += 1
        print(f"[{finished}/{total}] {key} {dtype_name}: {why}", flush=True)
        slot.restart()

    while pending or any(s.task for s in slots):
        for slot in slots:
            if slot.ready and slot.task is None and pending:
                slot.task = pending.popleft()
                slot.since = slot.started = time.monotonic()
                slot.conn.send(slot.task)
        waits = [slot.since + timeout - time.monotonic() for slot in slots if slot.task]
        handles = [s.conn for s in slots] + [s.process.sentinel for s in slots]
        multiprocessing.connection.wait(handles, timeout=max(min(waits, default=1.0), 0.01))
        for slot in slots:
            if slot.conn.poll():
                try:
                    message = slot.conn.recv()
                except (EOFError, OSError):
                    message = None
                if message == "ready":
                    slot.ready = True
                    continue
                if message == "tick":
                    slot.since = time.monotonic()
                    continue
                if isinstance(message, dict):
                    key = slot.task[0]
                    results[key].update(message)
                    finished += 1
                    status = message[slot.task[1]]["status"]
                    print(
                        f"[{finished}/{total}] {key} {slot.task[1]}: {status} ({time.monotonic() - slot.started:.1f}s)",
                        flush=True,
                    )
                    slot.task = None
                    slot.done += 1
                    if slot.done >= _TASKS_PER_WORKER:
                        slot.restart()
                    continue
            if not slot.process.is_alive():
                if slot.task:
                    lost(slot, f"worker died (exit code {slot.process.exitcode})")
                else:
                    slot.restart()
            elif slot.task and time.monotonic() - slot.since > timeout:
                lost(slot, f"timeout: a sample ran over {timeout:g}s")


# ---------------------------------------------------------------- report


def summarize(ops: list[Any], results: dict[str, dict]) -> dict[str, collections.Counter]:
    table: dict[str, collections.Counter] = {d: collections.Counter() for d in (*DTYPES, "grad")}
    for op in ops:
        for column, record in results.get(op_key(op), {}).items():
            table[column][record["status"]] += 1
    return table


def headline(ops: list[Any], results: dict[str, dict]) -> dict[str, tuple[int, int]]:
    """(passing, eligible) op counts for the float32 forward and gradient targets."""
    fwd = [results[op_key(op)]["float32"] for op in ops if "float32" in results.get(op_key(op), {})]
    grad = [results[op_key(op)]["grad"] for op in ops if "grad" in results.get(op_key(op), {})]
    fwd = [r for r in fwd if r["status"] != "skipped"]
    grad = [r for r in grad if r["status"] != "skipped"]
    return {
        "float32 forward": (sum(r["status"] == "passed" for r in fwd), len(fwd)),
        "float32 gradients": (sum(r["status"] == "passed" for r in grad), len(grad)),
    }


def table_lines(table: dict[str, collections.Counter]) -> list[str]:
    lines = ["| check | " + " | ".join(STATUSES) + " | pass rate |", "|---" * (len(STATUSES) + 2) + "|"]
    for column, counts in table.items():
        tested = sum(counts[s] for s in STATUSES if s != "skipped")
        rate = f"{100 * counts['passed'] / tested:.1f}%" if tested else "-"
        name = "float32 gradients" if column == "grad" else f"{column} forward"
        lines.append(f"| {name} | " + " | ".join(str(counts[s]) for s in STATUSES) + f" | {rate} |")
    return lines


def print_report(ops: list[Any], results: dict[str, dict], seconds: float) -> None:
    print()
    print("\n".join(table_lines(summarize(ops, results))))
    for name, (passing, eligible) in headline(ops, results).items():
        print(f"{name}: {passing}/{eligible} ops pass all samples ({100 * passing / max(eligible, 1):.1f}%)")
    print(f"{len(ops)} OpInfos in {seconds / 60:.1f} min")


def write_doc(path: str, ops: list[Any], results: dict[str, dict], seconds: float, jobs: int, rerun: list[str]) -> None:
    import torch

    lines = [
        "# Op coverage against PyTorch's OpInfo database",
        "",
        "<!-- Generated by bench/op_coverage.py: do not edit by hand; rerun "
        "`.venv/bin/python bench/op_coverage.py` to refresh. -->",
        "",
        "*This file is generated by `bench/op_coverage.py`.* Every OpInfo of "
        "`torch.testing._internal.common_methods_invocations.op_db` "
        f"(torch {torch.__version__}, {len(ops)} entries), every sample input, for float32, bfloat16, int64 and "
        "bool where the OpInfo supports the dtype on CPU: forward outputs on `tpu` against CPU PyTorch with the "
        "tolerances of `torch_tpu/testing/compare.py`, and for differentiable ops in float32 the gradients "
        "w.r.t. the sample's tensor inputs. Random ops are checked for shapes and dtypes only.",
        "",
        "A row counts OpInfos (one per op and variant): `passed` = every sample matches; `wrong` = a sample ran "
        "but differs; `error` = a sample raised, crashed or timed out; `fallback` = results matched but some "
        "ATen op ran on the CPU (`TORCH_TPU_CPU_FALLBACK`, never a pass); `skipped` = dtype unsupported on CPU, "
        "or no sample runs on CPU.",
        "",
        f"Sweep time: {seconds / 60:.1f} min with {jobs} worker processes on {os.cpu_count()} CPU cores "
        "(XLA CPU platform).",
        "",
        *(
            [
                f"After fixes, the {len(rerun)} OpInfos that had not passed were re-run (`--rerun-failing`); "
                "their rows come from that re-run, the others from the whole sweep. The CI subset "
                "(tests/test_opinfo.py) and the op tests guard the rest against regressions.",
                "",
            ]
            if rerun
            else []
        ),
        "## Summary",
        "",
        *table_lines(summarize(ops, results)),
        "",
    ]
    for name, (passing, eligible) in headline(ops, results).items():
        lines.append(
            f"- {name}: **{passing}/{eligible}** OpInfos pass every sample ({100 * passing / max(eligible, 1):.1f}%)."
        )
    decomposed: collections.Counter[str] = collections.Counter()
    fell_back: collections.Counter[str] = collections.Counter()
    for op in ops:
        for record in results.get(op_key(op), {}).values():
            decomposed.update(record.get("decompositions", {}))
            fell_back.update(record.get("fallbacks", {}))
    lines += [
        "",
        "## Failures",
        "",
        "One line per failing (OpInfo, check): the first failing sample's error.",
        "",
        "| OpInfo | check | status | first error |",
        "|---|---|---|---|",
    ]
    for op in sorted(ops, key=op_key):
        for column, record in sorted(results.get(op_key(op), {}).items()):
            if record["status"] in ("wrong", "error", "fallback"):
                message = record["message"].replace("|", "\\|").replace("\n", " ")
                lines.append(f"| `{op_key(op)}` | {column} | {record['status']} | {message} |")
    lines += ["", "## ATen ops that ran on the CPU fallback", ""]
    lines += [f"- `{name}`: {count} calls" for name, count in fell_back.most_common()] or ["None."]
    lines += ["", "## PyTorch decompositions used", ""]
    lines += [f"- `{name}`: {count} calls" for name, count in decomposed.most_common()] or ["None."]
    with open(path, "w") as file:
        file.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: the whole op_db)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds one sample may take before its (op, dtype) counts as hung (default 180)",
    )
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of " + ",".join(DTYPES))
    parser.add_argument("--doc", default="docs/op_coverage.md", help="the generated doc (whole sweeps only)")
    parser.add_argument("--json", help="also dump the raw results here")
    parser.add_argument(
        "--rerun-failing",
        action="store_true",
        help="re-run the OpInfos that did not pass in the doc's JSON and update the doc",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # so `sweep` stops its workers

    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    ops = list(op_db)
    stored_path = os.path.splitext(args.doc)[0] + ".json"
    stored: dict[str, Any] = {}
    if args.rerun_failing:
        with open(stored_path) as file:
            stored = json.load(file)
        failing = {
            key
            for key, records in stored["results"].items()
            if any(r["status"] not in ("passed", "skipped") for r in records.values())
        }
        args.ops = ",".join(sorted(failing | set(args.ops.split(",") if args.ops else ())))
    if args.ops:
        wanted = set(args.ops.split(","))
        ops = [op for op in ops if op.name in wanted or op_key(op) in wanted]
        if not ops:
            sys.exit(f"no OpInfo named {args.ops}")
    tasks, results_skipped = [], collections.defaultdict(dict)
    for op in ops:
        supported = op.supported_dtypes("cpu")
        for name in args.dtypes.split(","):
            if getattr(torch, name) in supported:
                tasks.append((op_key(op), name))
            else:
                results_skipped[op_key(op)][name] = {"status": "skipped", "message": "dtype unsupported on CPU"}
    grad_keys = {op_key(op) for op in ops if op.supports_autograd}
    start = time.monotonic()
    results = sweep(tasks, args.jobs, args.timeout, grad_keys)
    seconds = time.monotonic() - start
    for key, records in results_skipped.items():
        results[key].update(records)
    print_report(ops, results, seconds)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1, sort_keys=True)
    if args.dtypes != ",".join(DTYPES) or args.ops and not args.rerun_failing:
        return
    rerun = sorted(op_key(op) for op in ops) if args.rerun_failing else []
    if args.rerun_failing:
        results = {**stored["results"], **results}
        seconds = stored["seconds"]
    all_ops = list(op_db)
    write_doc(args.doc, all_ops, results, seconds, args.jobs, rerun)
    with open(stored_path, "w") as file:
        json.dump({"seconds": seconds, "rerun": rerun, "results": _slim(results)}, file, indent=0, sort_keys=True)
    print(f"wrote {args.doc} and {stored_path}")


def _slim(results: dict[str, dict]) -> dict[str, dict]:
    """Status and first message per (OpInfo, check): what the doc and a later re-run need."""
    return {
        key: {
            column: {
                "status": r["status"],
                "message": r.get("message", ""),
                "fallbacks": r.get("fallbacks", {}),
                "decompositions": r.get("decompositions", {}),
            }
            for column, r in records.items()
        }
        for key, records in results.items()
    }


if __name__ == "__main__":
    main()
