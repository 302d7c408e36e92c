"""Speed on the chip: one GPT-style AdamW training step, torch_tpu in each mode beside plain JAX and Google's TorchTPU.

Each (implementation, mode) runs in a process of its own, one after another (one process holds the chip, and the
first step of a cold process is part of the figure): the same model (bench/compile_step.py's GPT), init and batch.
  ours / google  strict        eager, ops dispatched one at a time (the default mode)
                 fused         eager with TORCH_TPU_DEFER_AND_FUSE=1 (Fused eager)
                 compiled      torch.compile(model, backend="tpu") with the stock AdamW eager (what most users write)
                 whole_step    torch.compile of zero_grad + forward + backward + optimizer.step
  jax            jit           jax.jit of value_and_grad + AdamW with donated state (bench/compile_step.py)
Each child prints one JSON line: first step (s, compile included), median ms per step over --steps synchronised
steps after --warmup, the losses, the device's peak bytes in use where PJRT reports them, and the largest scratch
memory of the step's programs as XLA planned it (`+temp`: JAX's step, our compiled graphs; PJRT's peak may leave a
running program's scratch out, which would make a one-program step look smaller than it is), the buffers the
timed steps held at most (`steady`: ours, the tensors' storages' peak since the warm-up, where PJRT's peak is the
process's, a cold first step's included; JAX's, its live arrays after them), and for ours the
executables the first step made, by kind and how, with their seconds (where a cold start goes), and how many eager
executables the last warm-up step called (`eager_programs`: a Strict step's launches). The parent prints the
table: ms/step, each against plain JAX and Google's same mode, model TFLOP/s and MFU against --peak-tflops
(a v5e: 197 bf16), first-step seconds. Sizes: small (4 layers, d 256, seq 128, batch 8, vocab 2048, float32) and
large (12 layers, d 768, 12 heads, seq 512, batch 16, vocab 32768, bfloat16; ~136M parameters), tiny for dry runs.

    python bench/tpu_step.py --size small [--impls ours,jax,google] [--modes strict,fused,compiled,whole_step]
        [--google-env "source /tmp/tpu/env.sh google"] [--steps 10] [--warmup 3] [--json out.json]
        [--profile DIR [--dump-hlo]] [--precision highest|high|medium] [--host-profile STEPS]
--precision is the float32 matmul precision of every implementation (torch's default "highest": full float32
products; plain JAX's jit is traced at the same level, as its own default on a TPU is one bfloat16 pass).
With --profile, each child of ours and JAX's captures 2 more steps under DIR with JAX's profiler, and the parent
prints where the device time went (bench/step_profile.py: programs a step, device-busy against wall time, the HLO
op kinds and ops that take the most; with --dump-hlo, the device time by what each fusion computes, from XLA's
optimized HLO dumped beside the capture: a cold cache's, as a program loaded from the persistent cache is not
compiled, so not dumped, and its ops keep their kinds).
With --host-profile, each child runs STEPS more steps under cProfile and the parent prints where its host thread's
time went (bench/host_profile.py: a small step is bound by its host).
The Google runs need its environment (bench/device_run.sh perf passes it on the TPU machine); without
--google-env they are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent)  # bench/: compile_step's model and JAX step

import host_profile  # noqa: E402  (bench/, on the path just set)
import step_profile  # noqa: E402

SIZES = {
    "tiny": (dict(layers=1, d_model=64, heads=2, seq=32, batch=2, vocab=128), "float32"),
    "small": (dict(layers=4, d_model=256, heads=4, seq=128, batch=8, vocab=2048), "float32"),
    "large": (dict(layers=12, d_model=768, heads=12, seq=512, batch=16, vocab=32768), "bfloat16"),
}
MODES = ("strict", "fused", "compiled", "whole_step")
PROFILE_STEPS = 2


def _peak_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _reset_steady_peak(impl: str) -> None:
    if impl == "ours":
        import torch

        torch.tpu.reset_peak_memory_stats()


def _steady_bytes(impl: str) -> int | None:
    """The buffers the timed steps held at most, program scratch aside: ours, the peak of the tensors' storages
    since the warm-up (PJRT's peak is the process's, a cold first step's transients included); JAX's, its live
    arrays after them (its step's outputs take its donated inputs' place). Not for Google's (its process)."""
    if impl == "ours":
        import torch

        return torch.tpu.max_memory_allocated()
    if impl == "jax":
        import jax

        return sum(array.nbytes for array in jax.live_arrays())
    return None


def _compiles(impl: str) -> dict | None:
    """Where a first step's seconds went: our executables made so far by kind (an eager op, a Fused cluster or an
    eager optimizer step, a compiled graph) and how (compiled, loaded from disk), with their count and seconds."""
    if impl != "ours":
        return None
    import torch

    kinds: dict[str, list] = {}
    for entry in torch.tpu._get_cache_stats()["per_entry_stats"]:
        source = entry["source"]  # compiled, disk, fused (a cluster, compiled), eager (run op by op)
        kind = "graph" if entry["name"].startswith("graph:") else "fused" if source == "fused" else "op"
        made = kinds.setdefault(kind if kind == source else f"{kind}/{source}", [0, 0.0])
        made[0] += 1
        made[1] = round(made[1] + entry["compilation_duration"], 3)
    return kinds


class _FirstStepClock:
    """Where a cold (or warm) first step's seconds go: the phases of `child` (imports, the runtime's start with a
    first op, building the model and moving it, the first call), JAX's own compile events (traces, lowerings to
    StableHLO, XLA compiles, persistent-cache reads) with the costliest compiled functions, and Dynamo's tracing and
    the backend's share of it (AOTAutograd, our lowering)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.events: dict[str, list] = {}
        self.compiled: dict[str, float] = {}
        self._last = time.perf_counter()
        try:
            from jax._src import monitoring
        except ImportError:  # not in Google's environment
            return
        monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, duration: float, **kwargs: Any) -> None:
        name = event.rsplit("/", 1)[-1].removesuffix("_duration").removesuffix("_sec")
        made = self.events.setdefault(name, [0, 0.0])
        made[0] += 1
        made[1] += duration
        if event.endswith("backend_compile_duration"):
            fun = str(kwargs.get("fun_name", "?"))
            self.compiled[fun] = self.compiled.get(fun, 0.0) + duration

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self._last, 3)
        self._last = now

    def report(self) -> dict:
        dynamo = {}
        metrics = getattr(sys.modules.get("torch._dynamo.utils"), "compilation_time_metrics", {})
        for key, name in (("_compile.compile_inner", "dynamo"), ("OutputGraph.call_user_compiler", "backend")):
            if metrics.get(key):
                dynamo[name] = round(sum(metrics[key]), 3)
        top = sorted(self.compiled.items(), key=lambda item: -item[1])[:5]
        return {
            "phases": self.phases,
            "jax": {name: [count, round(secs, 3)] for name, (count, secs) in self.events.items()},
            "top_xla_compiles": [[fun, round(secs, 3)] for fun, secs in top],
            "dynamo": dynamo,
        }


def _temp_bytes(impl: str, run) -> int | None:
    """The largest scratch memory of the step's programs (XLA's plan): JAX's one step, our compiled graphs' (eager
    executables and Fused clusters do not report it)."""
    if impl == "jax":
        return run.temp_bytes()
    if impl != "ours":
        return None
    import torch

    temps = [e["temp_bytes"] for e in torch.tpu._get_cache_stats()["per_entry_stats"] if e["temp_bytes"] is not None]
    return max(temps, default=None)


def _torch_step(mode: str, size: str):  # a step function, closed over its batch
    import compile_step as cs
    import torch

    cfg, dtype = SIZES[size]
    model, batch = cs.build(cs.Config(**cfg), dtype)
    model = model.to("tpu")
    optimizer = cs.adamw(model.parameters())
    if mode == "compiled":
        model = torch.compile(model, backend="tpu")
    step = cs.torch_step(model, optimizer)
    if mode == "whole_step":
        step = torch.compile(step, backend="tpu")
    idx, targets = (t.to("tpu") for t in batch)
    return lambda: step(idx, targets).item()


def _start_runtime(impl: str, clock: _FirstStepClock) -> None:
    """Import the implementation (phase `import`: torch, which loads ours or Google's TorchTPU, and JAX where it is
    used), then open the chip and run a first op (phase `runtime`): a cold process's fixed cost, apart from the
    step's."""
    if impl == "jax":
        import jax

        clock.phase("import")
        jax.devices()
    else:
        import torch

        clock.phase("import")
        torch.empty(1, device="tpu").cpu()


def _settle(impl: str) -> Callable[[], Any]:
    """Waits for the device's queued work: ours runs a step's backward and optimizer after the loss `.item()`
    reads; plain JAX's step is one program, done when its loss is."""
    if impl == "jax":
        return lambda: None
    import torch

    return torch.accelerator.synchronize  # Google's refuses torch.tpu.synchronize from user code


def _disk_reads(impl: str) -> list[int] | None:
    """Ours: the programs read from the persistent cache so far, and how many of them were loaded ahead (a warm
    process loads the last run's programs on threads as soon as its device is up: `runtime.recent`)."""
    if impl != "ours":
        return None
    import torch

    disk = torch.tpu._get_cache_stats()["persistent"]
    return [disk["hits"], disk["loaded_ahead"]]


def _finish_compiles(impl: str) -> float | None:
    """Ours: wait after the warm-up for the programs still compiling at XLA's full effort while quick ones ran in
    their place (`torch.tpu.finish_compiles`), so that the timed steps are the steady state; the seconds waited."""
    if impl != "ours":
        return None
    import torch

    start = time.perf_counter()
    torch.tpu.finish_compiles()
    return round(time.perf_counter() - start, 3)


def _eager_programs(impl: str, run: Callable[[], Any], losses: list) -> int | None:
    """Run a step, its loss into `losses`; how many of our eager executables it called (the executable cache's
    requests: Strict ops, Fused clusters, the eager ops around a compiled graph, not the graph's own programs);
    None for the others."""
    if impl != "ours":
        return None
    import torch

    before = torch.tpu._get_cache_stats()["num_cache_reqs"]
    losses.append(run())
    return torch.tpu._get_cache_stats()["num_cache_reqs"] - before


def _jax_step(size: str):
    import compile_step as cs

    cfg, dtype = SIZES[size]
    model, batch = cs.build(cs.Config(**cfg), dtype)
    runner = cs.jax_runner("jax", model, cs.Config(**cfg), batch)
    run = lambda: runner.sync(runner.run())
    run.temp_bytes = runner.temp_bytes
    return run


# torch's float32 matmul precision -> JAX's default matmul precision for the same math: "highest" (torch's default)
# is full float32 products, which JAX only computes on a TPU when asked (its default is one bfloat16 pass).
JAX_PRECISION = {"highest": "highest", "high": "high", "medium": "default"}


def _set_precision(impl: str, precision: str, size: str) -> None:
    """Every implementation computes float32 matmuls at `precision` (torch's names). A bfloat16 step is left at
    JAX's default: torch's setting does not touch bfloat16 matmuls, while JAX's `highest` does (the large step took
    244 ms at `highest` on a v5e against 90 at its default, a different computation from ours)."""
    if impl == "jax":
        import jax

        if SIZES[size][1] == "float32":
            jax.config.update("jax_default_matmul_precision", JAX_PRECISION[precision])
    else:
        import torch

        torch.set_float32_matmul_precision(precision)


def child(
    impl: str,
    mode: str,
    size: str,
    steps: int,
    warmup: int,
    profile: str | None = None,
    precision: str = "highest",
    host_steps: int = 0,
) -> dict:
    """One (implementation, mode): the first step, then the timed ones; with `profile`, a capture of
    PROFILE_STEPS more under that folder (bench/step_profile.py); with `host_steps`, that many more under cProfile
    (bench/host_profile.py)."""
    start = time.perf_counter()
    clock = _FirstStepClock()
    _start_runtime(impl, clock)
    _set_precision(impl, precision, size)
    clock.phase("runtime")
    run = _jax_step(size) if impl == "jax" else _torch_step(mode, size)
    clock.phase("build")
    losses = [run()]
    _settle(impl)()  # the step's work all issued and done: compiles a loss read need not wait for count too
    clock.phase("first_call")
    first = time.perf_counter() - start
    compiles, disk_reads = _compiles(impl), _disk_reads(impl)
    losses += [run() for _ in range(max(warmup - 1, 0))]
    finishing = _finish_compiles(impl)
    programs = _eager_programs(impl, run, losses) if warmup else None  # the last warm-up step
    _reset_steady_peak(impl)
    samples = []
    for _ in range(steps):
        began = time.perf_counter()
        losses.append(run())
        samples.append(time.perf_counter() - began)
    steady = _steady_bytes(impl)
    host = host_profile.capture(run, host_steps) if host_steps else None
    profile_wall = step_profile.capture(run, PROFILE_STEPS, profile, _settle(impl)) if profile else None
    return {
        "impl": impl,
        "mode": mode,
        "first_step_s": first,
        "step_ms": statistics.median(samples) * 1e3,
        "losses": losses,
        # PJRT's figure, through JAX: not in Google's process (JAX would open the chip it holds)
        "peak_bytes": None if impl == "google" else _peak_bytes(),
        "temp_bytes": _temp_bytes(impl, run),
        "steady_bytes": steady,
        "first_step_compiles": compiles,
        "first_step_disk_reads": disk_reads,
        "eager_programs": programs,
        "first_step_parts": clock.report(),
        "profile_wall_s": profile_wall,
        "finish_compiles_s": finishing,
        "host_profile": host,
    }


def _launch(impl: str, mode: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", impl, mode, "--size", args.size]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", args.precision]
    folder = Path(args.profile, f"{impl}_{mode}") if args.profile and impl != "google" else None
    if folder is not None:
        command += ["--profile", str(folder)]
    if args.host_profile:
        command += ["--host-profile", str(args.host_profile)]
    env = dict(os.environ)
    env.pop("TORCH_TPU_DEFER_AND_FUSE", None)
    if mode == "fused":
        env["TORCH_TPU_DEFER_AND_FUSE"] = "1"
    hlo = folder / "hlo" if folder is not None and args.dump_hlo else None
    if hlo is not None:  # XLA's HLO of every program, which step_profile classes the device time by
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={hlo} --xla_dump_hlo_as_text".strip()
    if impl == "google":  # its environment set up first (the mode's variable is already in `env`)
        quoted = " ".join(f"'{part}'" for part in ["python3", *command[1:]])
        command = ["bash", "-c", f"{args.google_env} && {quoted}"]
    from torch_tpu.kit.child import run_json_command  # here: Google's child process has a torch_tpu of its own

    result = run_json_command(command, env, timeout=args.timeout)
    if "error" in result:
        return {"impl": impl, "mode": mode, "error": f"exit {result.get('returncode')}: {result['error'][:160]}"}
    if folder is not None:
        result["profile"] = step_profile.read(folder, PROFILE_STEPS, result.pop("profile_wall_s"), hlo)
    return result


def _table(results: list[dict], size: str, peak_tflops: float) -> None:
    import compile_step as cs

    cfg, dtype = SIZES[size]
    flops = cs.step_flops(cs.Config(**cfg))
    jax_ms = next((r["step_ms"] for r in results if r["impl"] == "jax" and "step_ms" in r), None)
    google = {r["mode"]: r["step_ms"] for r in results if r["impl"] == "google" and "step_ms" in r}
    print(f"GPT step, size {size} ({dtype}), {flops / 1e12:.3f} TFLOP a step")
    print(f"{'impl':8s} {'mode':11s} {'ms/step':>9s} {'/jax':>6s} {'/google':>8s} {'TFLOP/s':>8s} {'MFU':>6s} "
          f"{'first s':>8s} {'peak GiB':>9s} {'steady':>7s} {'+temp':>6s}  loss first/last")  # fmt: skip
    for r in results:
        if "error" in r:
            print(f"{r['impl']:8s} {r['mode']:11s} {r['error']}")
            continue
        rate = flops / (r["step_ms"] / 1e3) / 1e12
        vs_jax = f"{r['step_ms'] / jax_ms:.2f}" if jax_ms else "-"
        vs_google = f"{r['step_ms'] / google[r['mode']]:.2f}" if r["impl"] == "ours" and r["mode"] in google else "-"
        mfu = f"{rate / peak_tflops:.1%}" if peak_tflops else "-"
        peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "-"
        temp = f"{r['temp_bytes'] / 2**30:.2f}" if r.get("temp_bytes") is not None else "-"
        steady = f"{r['steady_bytes'] / 2**30:.2f}" if r.get("steady_bytes") else "-"
        print(f"{r['impl']:8s} {r['mode']:11s} {r['step_ms']:9.2f} {vs_jax:>6s} {vs_google:>8s} {rate:8.2f} {mfu:>6s} "
              f"{r['first_step_s']:8.1f} {peak:>9s} {steady:>7s} {temp:>6s}  "
              f"{r['losses'][0]:.4f}/{r['losses'][-1]:.4f}")  # fmt: skip


def _first_step_report(results: list[dict]) -> None:
    """A line per child: where its first step's seconds went (`_FirstStepClock`)."""
    print("first step, s: phases | JAX traces, lowerings, XLA compiles, cache reads | Dynamo (backend) | top compiles")
    for r in results:
        parts = r.get("first_step_parts")
        if not parts:
            continue
        phases = " ".join(f"{name} {secs:.1f}" for name, secs in parts["phases"].items())
        jax_events = parts["jax"]
        events = " ".join(
            f"{name} {jax_events[name][0]}/{jax_events[name][1]:.1f}"
            for name in ("jaxpr_trace", "jaxpr_to_mlir_module", "backend_compile", "cache_retrieval_time")
            if name in jax_events
        )
        dynamo = parts["dynamo"]
        traced = f"{dynamo.get('dynamo', 0):.1f} ({dynamo.get('backend', 0):.1f})" if dynamo else "-"
        top = ", ".join(f"{fun} {secs:.1f}" for fun, secs in parts["top_xla_compiles"][:3])
        programs = "" if r.get("eager_programs") is None else f" | {r['eager_programs']} eager programs a step"
        if r.get("first_step_disk_reads") and r["first_step_disk_reads"][0]:
            programs += " | {} programs from disk, {} of them loaded ahead".format(*r["first_step_disk_reads"])
        if r.get("finish_compiles_s"):
            programs += f" | {r['finish_compiles_s']:.1f} s waited after the warm-up for full-effort programs"
        print(f"  {r['impl']:6s} {r['mode']:11s} {phases} | {events or '-'} | {traced} | {top or '-'}{programs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--impls", default="jax,ours,google")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--google-env", default=None, help="shell commands that set up Google's TorchTPU")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=0.0)
    parser.add_argument(
        "--precision",
        choices=JAX_PRECISION,
        default="highest",
        help="float32 matmul precision of every implementation (torch's names; JAX's jit follows it)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for each child process")
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", default=None, help="capture each child's last steps under this folder")
    parser.add_argument(
        "--dump-hlo", action="store_true", help="with --profile, class the device time by XLA's optimized HLO"
    )
    parser.add_argument(
        "--host-profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="run STEPS more steps under cProfile, and print them",
    )
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        options = (args.size, args.steps, args.warmup, args.profile, args.precision, args.host_profile)
        print(json.dumps(child(*args.child, *options)))
        return
    results = []
    for impl in args.impls.split(","):
        if impl == "google" and not args.google_env:
            continue
        for mode in ["jit"] if impl == "jax" else args.modes.split(","):
            results.append(_launch(impl, mode, args))
            print(json.dumps(results[-1]), flush=True)
    _table(results, args.size, args.peak_tflops)
    _first_step_report(results)
    for result in results:
        if "profile" in result:
            step_profile.report(f"{result['impl']} {result['mode']}", result["profile"])
        if result.get("host_profile"):
            host_profile.report(f"{result['impl']} {result['mode']}", result["host_profile"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
