"""Eager dispatch overhead: µs per small op on `tpu`, beside the JAX jitted-call floor and CPU PyTorch.

One run, one process, the same chain of 64x64 float32 ops for each. Target: tpu <= 2x the JAX floor.
Then the host's share of an optimizer step: milliseconds per `AdamW.step()` (foreach) over --params bfloat16
tensors of 64x64 (a 12-layer GPT's 148 by default), in Strict and Fused eager beside CPU PyTorch's, the device
synchronised between steps and not timed (the recording and dispatch, not the update's compute). Last, the host's
share of a GPT's forward and backward: milliseconds from `zero_grad` to the end of `loss.backward()` for
bench/compile_step.py's model with the large step's 12 layers at tiny sizes (d 64, seq 32, batch 2, bfloat16), in
Fused eager beside CPU PyTorch's eager pass: on a TPU the large step's Fused recording is time the device waits for
(docs/performance.md); that GPT's Strict backward on the thread that calls it beside the autograd engine's device
thread. And a batch's transfer: µs per `.to("tpu")` of a (16, 512) int64 tensor beside
`jax.device_put` of the same values, a jitted call's floor by its inputs and outputs (donated or not), and a Strict
add taken apart layer by layer (the program's call, the tensor, the key, the dispatcher). With
--profile N, the N functions of a Strict chain costliest in themselves under cProfile, in µs per op (where a TPU
host's op goes beyond the floor).
Usage: python bench/eager_overhead.py [--ops N] [--repeats R] [--params N] [--profile N]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections.abc import Callable

import compile_step
import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F


def per_op_us(
    runners: dict[str, tuple[Callable[[], object], Callable[[object], None]]], ops: int, repeats: int
) -> dict[str, float]:
    """Median over `repeats` of the time per op of each runner's chain of `ops` ops (synchronised at the end).

    The runners take turns within each repeat, so a change in the machine's load touches them all alike.
    """
    for run, sync in runners.values():
        sync(run())
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, (run, sync) in runners.items():
            start = time.perf_counter()
            sync(run())
            samples[name].append((time.perf_counter() - start) / ops * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def torch_chain(x: torch.Tensor, y: torch.Tensor, ops: int) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        z = x
        for i in range(ops // 4):
            z = z + y
            z = z * y
            z = torch.relu(z)
            z = z - x if i % 2 else z + x
        return z

    return run


def jax_chain(x: jax.Array, y: jax.Array, ops: int) -> Callable[[], jax.Array]:
    add, mul, relu, sub = (jax.jit(f) for f in (jnp.add, jnp.multiply, jax.nn.relu, jnp.subtract))

    def run() -> jax.Array:
        z = x
        for i in range(ops // 4):
            z = add(z, y)
            z = mul(z, y)
            z = relu(z)
            z = sub(z, x) if i % 2 else add(z, x)
        return z

    return run


def optimizer_step_ms(device: str, params: int, mode: torch.tpu.EagerMode, repeats: int) -> float:
    """Median host milliseconds of a bfloat16 AdamW step over `params` 64x64 tensors on `device` in `mode`."""
    torch.manual_seed(0)
    tensors = [torch.randn(64, 64, dtype=torch.bfloat16, device=device, requires_grad=True) for _ in range(params)]
    for tensor in tensors:
        tensor.grad = torch.full_like(tensor, 1e-3)
    optimizer = torch.optim.AdamW(tensors, lr=1e-3, foreach=True)
    samples = []
    with torch.tpu.set_eager_mode(mode):
        for step in range(repeats + 3):  # the first steps create the state and compile
            start = time.perf_counter()
            optimizer.step()
            if step >= 3:
                samples.append((time.perf_counter() - start) * 1e3)
            torch.accelerator.synchronize() if device == "tpu" else None
    return statistics.median(samples)


def tiny_gpt(device: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """bench/compile_step.py's GPT with the large step's 12 layers at tiny sizes, bfloat16, and its batch, on
    `device`."""
    config = compile_step.Config(layers=12, d_model=64, heads=2, seq=32, batch=2, vocab=128)
    model, batch = compile_step.build(config, "bfloat16")
    idx, targets = (t.to(device) for t in batch)
    return model.to(device), idx, targets


def gpt_pass_ms(device: str, mode: torch.tpu.EagerMode, repeats: int) -> float:
    """Median host milliseconds of a 12-layer tiny GPT's zero_grad, forward, loss and backward on `device`."""
    model, idx, targets = tiny_gpt(device)
    optimizer = compile_step.adamw(model.parameters())
    samples = []
    with torch.tpu.set_eager_mode(mode):
        for step in range(repeats + 3):  # the first steps compile
            start = time.perf_counter()
            optimizer.zero_grad()
            logits = model(idx)
            F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)).backward()
            if step >= 3:
                samples.append((time.perf_counter() - start) * 1e3)
            optimizer.step()
            torch.accelerator.synchronize() if device == "tpu" else None
    return statistics.median(samples)


def backward_ms_by_thread(repeats: int) -> dict[str, float]:
    """Median host milliseconds of the 12-layer tiny GPT's Strict `backward()` on the thread that calls it (the
    default, runtime/backward_thread.py) and on the autograd engine's device thread, the two taking turns."""
    model, idx, targets = tiny_gpt("tpu")
    threads = {"calling thread": False, "device thread": True}
    samples: dict[str, list[float]] = {name: [] for name in threads}
    for step in range(repeats + 2):  # the first steps compile
        if step == 2:
            torch.tpu.finish_compiles()  # the full-effort programs, compiling on threads meanwhile
        for name, multithreaded in threads.items():
            model.zero_grad()
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            with torch.autograd.set_multithreading_enabled(multithreaded):
                start = time.perf_counter()
                loss.backward()
                elapsed = (time.perf_counter() - start) * 1e3
            torch.accelerator.synchronize()
            if step >= 2:
                samples[name].append(elapsed)
    return {name: statistics.median(values) for name, values in samples.items()}


def transfer_us(repeats: int, calls: int = 200) -> tuple[float, float]:
    """Median µs per host-to-device transfer of a (16, 512) int64 batch: `.to("tpu")`, and `jax.device_put`."""
    host = torch.randint(0, 32768, (16, 512))
    values = host.numpy()
    device = jax.devices()[0]
    runs: dict[str, list[float]] = {"ours": [], "jax": []}
    for _ in range(repeats):
        for name, move in (("ours", lambda: host.to("tpu")), ("jax", lambda: jax.device_put(values, device))):
            start = time.perf_counter()
            for _ in range(calls):
                move()
            runs[name].append((time.perf_counter() - start) / calls * 1e6)
    torch.accelerator.synchronize()
    return statistics.median(runs["ours"]), statistics.median(runs["jax"])


def call_floor_us(inputs: int, outputs: int, donate: bool, repeats: int, calls: int = 200) -> float:
    """Median µs per call of a jitted function of `inputs` 64x64 float32 arrays returning `outputs` of them, the
    inputs consumed (donated: each call's outputs are the next call's inputs) or not: what the device's runtime
    charges per input and per output, which an op's program pays for its check flags or extra results."""

    def function(*xs: jax.Array) -> tuple[jax.Array, ...]:
        total = sum(xs)
        return tuple(total * (i + 1) for i in range(outputs))

    jitted = jax.jit(function, donate_argnums=tuple(range(inputs)) if donate else ())
    fresh = [jnp.full((64, 64), i, jnp.float32) for i in range(inputs)]
    xs = jitted(*fresh)[:inputs] if donate else fresh
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = jitted(*xs)
            if donate:
                xs = out
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def print_call_floors(repeats: int) -> None:
    print(f"JAX jitted call by inputs and outputs (64x64 float32), us, median of {repeats}")
    base = call_floor_us(1, 1, False, repeats)
    for inputs, outputs, donate in ((1, 1, False), (1, 4, False), (16, 1, False), (4, 4, False), (4, 4, True)):
        us = base if (inputs, outputs, donate) == (1, 1, False) else call_floor_us(inputs, outputs, donate, repeats)
        name = f"{inputs} in, {outputs} out" + (", donated" if donate else "")
        print(f"{name:<28}{us:>10.1f}{us / base:>13.2f}x one in, one out")


def strict_parts_us(x: torch.Tensor, y: torch.Tensor, ops: int, repeats: int) -> dict[str, float]:
    """µs per op of a chain of `ops` Strict adds taken apart: JAX's jitted add, the op's cached program called on
    arrays, then with the result wrapped as a `tpu` tensor (and the last one freed), with the cache key built from
    the tensors, and the whole op through PyTorch's dispatcher (with Python's garbage collector on and off). The
    differences are what each layer of the eager path costs on this host; run after a warm chain compiled the add.
    """
    from torch_tpu.eager import dispatch
    from torch_tpu.eager.cache import executables
    from torch_tpu.ops.registry import LOWERINGS
    from torch_tpu.runtime import storage

    op = torch.ops.aten.add.Tensor
    runner = dispatch.Runner(LOWERINGS[op])
    key, (x_array, y_array), _ = runner.inputs(op, (x, y), {})
    entry = executables.entries[key]
    call, layout, wrap_as, entries, inputs = (
        entry.executable,
        entry.layout,
        storage.wrap_as,
        executables.entries,
        runner.inputs,
    )
    jax_add = jax.jit(jnp.add)

    def chain(step: Callable[[object], object], start: object) -> Callable[[], object]:
        def run() -> object:
            z = start
            for _ in range(ops):
                z = step(z)
            return z

        return run

    def wrapped(z: tuple) -> tuple:
        array = call(z[1], y_array)
        return wrap_as(array, layout), array

    def keyed(z: torch.Tensor) -> torch.Tensor:
        found, leaves, _ = inputs(op, (z, y), {})
        return wrap_as(entries[found].executable(*leaves), layout)

    def collected_off() -> torch.Tensor:
        gc.disable()
        try:
            return dispatched()
        finally:
            gc.enable()

    dispatched = chain(lambda z: z + y, x)
    runners = {
        "JAX jitted add (floor)": (chain(lambda z: jax_add(z, y_array), x_array), jax.block_until_ready),
        "our program's call": (chain(lambda z: call(z, y_array), x_array), jax.block_until_ready),
        "+ result as a tensor": (chain(wrapped, (x, x_array)), lambda z: torch.accelerator.synchronize()),
        "+ cache key from tensors": (chain(keyed, x), lambda z: torch.accelerator.synchronize()),
        "+ PyTorch's dispatcher": (dispatched, lambda z: torch.accelerator.synchronize()),
        "  the same, gc off": (collected_off, lambda z: torch.accelerator.synchronize()),
    }
    return per_op_us(runners, ops, repeats)


def print_strict_parts(x: torch.Tensor, y: torch.Tensor, ops: int, repeats: int) -> None:
    us = strict_parts_us(x, y, ops, repeats)
    floor = us["JAX jitted add (floor)"]
    print(f"a Strict add taken apart (chain of {ops}, 64x64 float32), us per op, median of {repeats}")
    previous = floor
    for name, value in us.items():
        print(f"{name:<28}{value:>10.1f}{value / floor:>13.2f}x floor {value - previous:>+8.1f} us")
        previous = value if not name.startswith(" ") else previous


def profile_chain(run: Callable[[], torch.Tensor], ops: int, top: int) -> None:
    """Print the `top` functions of one Strict chain costliest in themselves (cProfile), in µs per op."""
    profile = cProfile.Profile()
    profile.enable()
    torch.accelerator.synchronize(run().device)
    profile.disable()
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, callers)}
    costliest = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    print(f"Strict chain under cProfile, the {top} functions costliest in themselves, us per op")
    for (file, line, name), (calls, _, own, cumulative, _) in costliest:
        where = f"{file.rsplit('/', 1)[-1]}:{line}({name})" if line else name
        print(f"{own / ops * 1e6:8.2f} own {cumulative / ops * 1e6:8.2f} cumulative {calls / ops:6.2f} calls  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--params", type=int, default=148)
    parser.add_argument("--profile", type=int, default=0, help="print the N costliest functions of a Strict chain")
    args = parser.parse_args()

    cpu_x, cpu_y = torch.rand(64, 64), torch.rand(64, 64) * 0.01
    tpu_x, tpu_y = cpu_x.to("tpu"), cpu_y.to("tpu")
    jax_x, jax_y = jnp.asarray(cpu_x.numpy()), jnp.asarray(cpu_y.numpy())

    def torch_sync(t: torch.Tensor) -> None:
        torch.accelerator.synchronize() if t.device.type == "tpu" else None

    tpu_run = torch_chain(tpu_x, tpu_y, args.ops)
    torch_sync(tpu_run())
    stats_before = torch.tpu._get_cache_stats()
    us = per_op_us(
        {
            "torch_tpu eager (Strict)": (tpu_run, torch_sync),
            "JAX jitted call (floor)": (jax_chain(jax_x, jax_y, args.ops), jax.block_until_ready),
            "torch CPU eager": (torch_chain(cpu_x, cpu_y, args.ops), torch_sync),
        },
        args.ops,
        args.repeats,
    )
    stats_after = torch.tpu._get_cache_stats()
    misses = (stats_after["num_cache_reqs"] - stats_before["num_cache_reqs"]) - (
        stats_after["num_cache_hits"] - stats_before["num_cache_hits"]
    )
    print(
        f"device: {torch.tpu.get_device_name()}; chain of {args.ops} ops on 64x64 float32, "
        f"median of {args.repeats} interleaved runs"
    )
    print(f"{'runner':<28}{'us/op':>10}{'vs JAX floor':>14}")
    floor = us["JAX jitted call (floor)"]
    for name, value in us.items():
        print(f"{name:<28}{value:>10.1f}{value / floor:>13.2f}x")
    print(f"executable-cache misses in the timed tpu runs: {misses} (the first, untimed chain compiled each op)")
    if args.profile:
        profile_chain(tpu_run, args.ops, args.profile)
    repeats = max(args.repeats, 5)
    print_strict_parts(tpu_x, tpu_y, args.ops, repeats)
    print_call_floors(repeats)
    cpu_ms = optimizer_step_ms("cpu", args.params, torch.tpu.EagerMode.DEFER_NEVER, repeats)
    print(f"AdamW step (foreach) over {args.params} bfloat16 64x64 tensors, host ms, median of {repeats}")
    for name, mode in (("Strict", torch.tpu.EagerMode.DEFER_NEVER), ("Fused", torch.tpu.EagerMode.DEFER_AND_FUSE)):
        ms = optimizer_step_ms("tpu", args.params, mode, repeats)
        print(f"{'torch_tpu eager (' + name + ')':<28}{ms:>10.2f}{ms / cpu_ms:>13.2f}x CPU's {cpu_ms:.2f}")
    cpu_ms = gpt_pass_ms("cpu", torch.tpu.EagerMode.DEFER_NEVER, repeats)
    fused_ms = gpt_pass_ms("tpu", torch.tpu.EagerMode.DEFER_AND_FUSE, repeats)
    print(f"GPT forward and backward (12 layers, d 64, bfloat16), host ms, median of {repeats}")
    print(f"{'torch_tpu eager (Fused)':<28}{fused_ms:>10.2f}{fused_ms / cpu_ms:>13.2f}x CPU's {cpu_ms:.2f}")
    by_thread = backward_ms_by_thread(repeats)
    print(f"GPT backward (12 layers, d 64, bfloat16, Strict), host ms, median of {repeats}")
    base = by_thread["device thread"]
    for name, ms in by_thread.items():
        print(f"{'on the ' + name:<28}{ms:>10.2f}{ms / base:>13.2f}x the device thread's")
    ours_us, jax_us = transfer_us(repeats)
    print(f"transfer of a (16, 512) int64 batch, us, median of {repeats}")
    print(f"{'.to(' + repr('tpu') + ')':<28}{ours_us:>10.1f}{ours_us / jax_us:>13.2f}x jax.device_put's {jax_us:.1f}")


if __name__ == "__main__":
    main()
