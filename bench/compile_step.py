"""Compiled training step: a GPT-2-style decoder's whole AdamW step, torch_tpu beside plain JAX and CPU PyTorch.

One run, one process, the same model, init and batch for every runner:
  (a) torch_tpu   `torch.compile(step, backend="tpu")` of forward, loss, backward and `optimizer.step()` on "tpu"
  (b) plain JAX   `jax.jit` of `value_and_grad` + a hand-written AdamW update (torch's AdamW math), layers
                  written the natural way (`x @ w + b` on (batch, seq, d) activations); and, for reference, (b')
                  the same with every layer as a 2-D GEMM (`x.reshape(-1, d) @ w`), which XLA:CPU runs much faster
  (c) torch CPU eager, and (d) torch CPU `torch.compile(backend="inductor")` (skip with --skip-inductor)
For each: compile (first-step) time and steady-state step time: the median of --steps synchronised steps after
--warmup, the runners' steps interleaved round-robin so that load on a shared machine hits them alike. Targets:
ours/JAX step time <= 1.10, ours/JAX cold compile <= 2x. The tpu part compiles against a fresh, empty
TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT and Inductor against a fresh TORCHINDUCTOR_CACHE_DIR (cold compiles).
`--warm-check` runs the tpu part alone in two child processes sharing one fresh cache root: the second's first
step (compile) should take <= 10% of the first's.

Model (defaults): 4 pre-LayerNorm blocks, d_model 256, 4 heads, seq 128, batch 8, vocab 1024 (GPT-2's is 50257;
1024 keeps the head GEMM and the cross-entropy from dominating), learned positions, causal softmax attention,
tanh-GELU MLP 4x, embedding tied to the LM head, no dropout, GPT-2 init (N(0, 0.02), residual projections
scaled by 1/sqrt(2 * layers)). AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1) on every parameter.
`--dtype bfloat16` runs every runner's parameters, activations and optimizer state in bfloat16 (default float32).
Each runner's model FLOP/s is printed (6 x parameters x tokens, attention included); with --peak-tflops, the MFU.
Usage: python bench/compile_step.py [--steps N] [--warmup W] [--skip-inductor] [--torch-threads T] [--warm-check]
       [--dtype float32|bfloat16] [--peak-tflops P] [--layers L --d-model D --heads H --seq S --batch B --vocab V]
       (`make bench-compile` runs both parts)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from torch import nn

LR, BETAS, EPS, WEIGHT_DECAY = 3e-4, (0.9, 0.95), 1e-8, 0.1


@dataclass(frozen=True)
class Config:
    layers: int = 4
    d_model: int = 256
    heads: int = 4
    seq: int = 128
    batch: int = 8
    vocab: int = 1024


# --- (a), (c), (d): the PyTorch model ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool)), persistent=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.vocab, cfg.d_model), nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))
            elif name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied LM head


def torch_step(model: GPT, optimizer: torch.optim.Optimizer) -> Callable:
    def step(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        loss.backward()
        optimizer.step()
        return loss

    return step


def adamw(params) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)


# --- (b): the same model in plain JAX, written the natural JAX way ------------------------------------------------


def jax_params(model: GPT) -> dict:
    """The torch model's parameters as a JAX pytree; Linear weights as (in, out) so that layers are `x @ w + b`."""
    dtype = jnp.dtype(str(model.wte.weight.dtype).removeprefix("torch."))
    arr = lambda t: jnp.asarray(t.detach().cpu().float().numpy()).astype(dtype)
    blocks = []
    for blk in model.blocks:
        blocks.append(
            {
                "ln_1": {"g": arr(blk.ln_1.weight), "b": arr(blk.ln_1.bias)},
                "ln_2": {"g": arr(blk.ln_2.weight), "b": arr(blk.ln_2.bias)},
                "c_attn": {"w": arr(blk.c_attn.weight.t()), "b": arr(blk.c_attn.bias)},
                "attn_proj": {"w": arr(blk.attn_proj.weight.t()), "b": arr(blk.attn_proj.bias)},
                "c_fc": {"w": arr(blk.c_fc.weight.t()), "b": arr(blk.c_fc.bias)},
                "mlp_proj": {"w": arr(blk.mlp_proj.weight.t()), "b": arr(blk.mlp_proj.bias)},
            }
        )
    return {
        "wte": arr(model.wte.weight),
        "wpe": arr(model.wpe.weight),
        "blocks": blocks,
        "ln_f": {"g": arr(model.ln_f.weight), "b": arr(model.ln_f.bias)},
    }


def _layer_norm(p: dict, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]


def _dense(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def _dense_2d(p: dict, x: jax.Array) -> jax.Array:
    return (x.reshape(-1, x.shape[-1]) @ p["w"] + p["b"]).reshape(*x.shape[:-1], -1)


def jax_loss(params: dict, idx: jax.Array, targets: jax.Array, heads: int, dense: Callable = _dense) -> jax.Array:
    b, t = idx.shape
    x = params["wte"][idx] + params["wpe"][:t]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for p in params["blocks"]:
        h = _layer_norm(p["ln_1"], x)
        q, k, v = jnp.split(dense(p["c_attn"], h), 3, axis=-1)
        q, k, v = (z.reshape(b, t, heads, -1) for z in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = jnp.where(mask, scores, -jnp.inf)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, t, -1)
        x = x + dense(p["attn_proj"], y)
        x = x + dense(p["mlp_proj"], jax.nn.gelu(dense(p["c_fc"], _layer_norm(p["ln_2"], x)), approximate=True))
    logits = _layer_norm(params["ln_f"], x) @ params["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def jax_train_step(heads: int, dense: Callable = _dense) -> Callable:
    """`step(params, m, v, count, idx, targets) -> (params, m, v, count, loss)`, jitted, state donated."""
    b1, b2 = BETAS

    def step(params, m, v, count, idx, targets):
        loss, grads = jax.value_and_grad(jax_loss)(params, idx, targets, heads, dense)
        count = count + 1
        m = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), m, grads)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        step_size = LR / (1 - b1**count)
        sqrt_bc2 = jnp.sqrt(1 - b2**count)
        params = jax.tree.map(
            lambda p, m, v: p * (1 - LR * WEIGHT_DECAY) - step_size * m / (jnp.sqrt(v) / sqrt_bc2 + EPS),
            params,
            m,
            v,
        )
        return params, m, v, count, loss

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


# --- timing --------------------------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    compile_s: float
    step_ms: float
    losses: list[float]


class Runner:
    """One way of running the step: `run()` does a step and returns the loss; `sync(loss)` waits for it and reads
    it as a float (one scalar read per step, for every runner alike)."""

    def __init__(
        self, name: str, run: Callable[[], object], sync: Callable[[object], float], tpu: bool = False
    ) -> None:
        self.name, self.run, self.sync, self.tpu = name, run, sync, tpu
        self.samples: list[float] = []
        self.losses: list[float] = []
        self.compiled: list[dict] = []  # tpu only: the executables its first step compiled or loaded
        self.dynamo: dict[str, float] = {}  # tpu only: Dynamo's share of the first step
        self.compile_cpu_s = 0.0  # the first step's CPU time (all threads): steadier than wall time under load
        self.temp_bytes: Callable[[], int | None] = lambda: None  # jax only: the step program's scratch memory

    def first_steps(self, warmup: int) -> float:
        """The first step (compile included, returned in seconds), then `warmup` more untimed steps."""
        known = len(compiled_executables()) if self.tpu else 0
        dynamo = dynamo_times()
        start, cpu = time.perf_counter(), time.process_time()
        self.losses.append(self.sync(self.run()))
        compile_s = time.perf_counter() - start
        self.compile_cpu_s = time.process_time() - cpu
        self.compiled = compiled_executables()[known:] if self.tpu else []
        self.dynamo = {k: v - dynamo[k] for k, v in dynamo_times().items()} if self.tpu else {}
        for _ in range(warmup):
            self.losses.append(self.sync(self.run()))
        return compile_s

    def timed_step(self) -> None:
        start = time.perf_counter()
        loss = self.sync(self.run())
        self.samples.append(time.perf_counter() - start)
        self.losses.append(loss)


def measure(runners: list[Runner], steps: int, warmup: int) -> list[Result]:
    compile_s = [r.first_steps(warmup) for r in runners]
    for _ in range(steps):  # round-robin: a burst of load on a shared machine hits every runner alike
        for r in runners:
            r.timed_step()
    return [
        Result(r.name, c, statistics.median(r.samples) * 1e3, r.losses) for r, c in zip(runners, compile_s, strict=True)
    ]


def torch_runner(name: str, model: GPT, device: str, compile_backend: str | None, batch) -> Runner:
    model = copy.deepcopy(model).to(device)
    step = torch_step(model, adamw(model.parameters()))
    if compile_backend is not None:
        step = torch.compile(step, backend=compile_backend)
    idx, targets = (t.to(device) for t in batch)
    return Runner(name, lambda: step(idx, targets), torch_sync, tpu=device == "tpu")


def torch_sync(loss: torch.Tensor) -> float:
    if loss.device.type == "tpu":
        torch.accelerator.synchronize()
    return float(loss.detach().cpu())


def jax_runner(name: str, model: GPT, cfg: Config, batch, dense: Callable = _dense) -> Runner:
    params = jax_params(model)
    state = [
        params,
        jax.tree.map(jnp.zeros_like, params),
        jax.tree.map(jnp.zeros_like, params),
        jnp.zeros((), jnp.float32),
    ]
    idx, targets = (jnp.asarray(t.numpy()) for t in batch)
    step = jax_train_step(cfg.heads, dense)

    def run() -> jax.Array:
        *new_state, loss = step(*state, idx, targets)
        state[:] = new_state
        return loss

    runner = Runner(name, run, lambda loss: float(jax.block_until_ready(loss)))
    # the executable the calls use (JAX's compile cache: no second compile), as XLA planned its memory
    runner.temp_bytes = lambda: step.lower(*state, idx, targets).compile().memory_analysis().temp_size_in_bytes
    return runner


def compiled_executables() -> list[dict]:
    """The tpu executables compiled (or loaded from disk) so far, oldest first: the graphs and the eager ops run
    outside them, each with its name, source and lower+compile/load+first-run seconds."""
    stats = torch.tpu._get_cache_stats()["per_entry_stats"]
    keys = ("name", "source", "compilation_duration")
    return [{k: e[k] for k in keys} for e in stats if e["source"] in ("compiled", "disk")]


def dynamo_times() -> dict[str, float]:
    """Seconds spent so far in Dynamo's frame compiles, and the part of them spent in the backend (for "tpu":
    AOTAutograd, or loading its cached result, and building our graph objects)."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    total = sum(metrics.get("_compile.compile_inner", []))
    backend = sum(metrics.get("OutputGraph.call_user_compiler", []))
    return {"tracing": total - backend, "backend": backend}


def describe_compile(first_s: float, entries: list[dict], dynamo: dict[str, float]) -> str:
    graphs = [e for e in entries if e["name"].startswith("graph:")]
    lowered = sum(g["compilation_duration"] for g in graphs)
    eager = sum(e["compilation_duration"] for e in entries if e not in graphs)
    parts = ", ".join(f"{g['name'].split(':')[1]} {g['compilation_duration']:.2f} s ({g['source']})" for g in graphs)
    return (
        f"{first_s:.2f} s = Dynamo tracing {dynamo['tracing']:.2f} s + AOTAutograd (or its cache) "
        f"{dynamo['backend']:.2f} s + {len(graphs)} graphs lowered+compiled/loaded+run {lowered:.2f} s [{parts}] + "
        f"the rest {first_s - dynamo['tracing'] - dynamo['backend'] - lowered:.2f} s ({len(entries) - len(graphs)} "
        f"eager-op executables {eager:.2f} s, most while Dynamo traces AdamW's eager state init)"
    )


def tpu_only(cfg: Config, args: argparse.Namespace) -> dict:
    """The tpu part alone (a --warm-check child): compile time, step time, what the caches did."""
    import torch_tpu  # noqa: F401

    warm_up_process()
    model, batch = build(cfg, args.dtype)
    runner = torch_runner("tpu", model, "tpu", "tpu", batch)
    result = measure([runner], args.steps, args.warmup)[0]
    persistent = torch.tpu._get_cache_stats()["persistent"]
    return {
        "result": asdict(result),
        "persistent": persistent,
        "compiled": runner.compiled,
        "dynamo": runner.dynamo,
        "compile_cpu_s": runner.compile_cpu_s,
    }


def warm_up_process() -> None:
    """One-time process costs, paid before any timing so that no runner is charged for them: JAX's first jit and
    Dynamo's first compile (of a trivial CPU function, backend "eager"). Each runner's first step then measures
    the compile of its own program."""
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.ones(4)))
    torch.compile(lambda x: (x * 2).sum(), backend="eager")(torch.ones(4))


def step_flops(cfg: Config) -> float:
    """Model FLOPs of one training step (forward + backward = 3x the forward's matmul FLOPs): the blocks' GEMMs
    (12 d^2 weights a token), attention's two (seq x seq) products and the tied LM head; no recomputation."""
    tokens = cfg.batch * cfg.seq
    forward = 2 * tokens * (cfg.layers * 12 * cfg.d_model**2 + cfg.vocab * cfg.d_model)
    forward += cfg.layers * 2 * 2 * cfg.batch * cfg.seq**2 * cfg.d_model
    return 3.0 * forward


def build(cfg: Config, dtype: str = "float32") -> tuple[GPT, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = GPT(cfg).to(getattr(torch, dtype))
    generator = torch.Generator().manual_seed(1)
    batch = tuple(torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=generator) for _ in range(2))
    return model, batch


def warm_check(cfg: Config, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="torch_tpu_cache_") as root:
        # Both torch_tpu's cache and PyTorch's (AOTAutograd's entries live there) start empty and are shared.
        env = dict(
            os.environ,
            TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=os.path.join(root, "torch_tpu"),
            TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
        )
        command = [
            sys.executable,
            __file__,
            "--tpu-only",
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            f"--dtype={args.dtype}",
            *(f"--{k.replace('_', '-')}={v}" for k, v in asdict(cfg).items()),
        ]
        print(
            f"warm-start check: the tpu part twice, in two processes sharing the fresh cache roots under {root} "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        )
        runs = []
        for label in ("1st (cold)", "2nd (warm)"):
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            r, p = runs[-1]["result"], runs[-1]["persistent"]
            print(
                f"{label} process: first step "
                f"{describe_compile(r['compile_s'], runs[-1]['compiled'], runs[-1]['dynamo'])}; "
                f"CPU time {runs[-1]['compile_cpu_s']:.2f} s"
            )
            print(
                f"{'':>19}steady step {r['step_ms']:.1f} ms; persistent cache: executables hits {p['hits']}, "
                f"misses {p['misses']}, writes {p['writes']}; graph index hits {p['graph_hits']}, misses "
                f"{p['graph_misses']}; AOTAutograd cache hits {p['aot_autograd_hits']}, misses "
                f"{p['aot_autograd_misses']}, bypasses {p['aot_autograd_bypasses']}"
            )
        cold, warm = (run["result"]["compile_s"] for run in runs)
        cold_cpu, warm_cpu = (run["compile_cpu_s"] for run in runs)
        print(
            f"warm start: the 2nd process's first step takes {warm / cold:.0%} of the 1st's (target <= 10%); "
            f"{warm_cpu / cold_cpu:.0%} in CPU time; load average at the end {os.getloadavg()[0]:.1f}"
        )
        if args.require_warm:
            _require_warm(runs)


def _require_warm(runs: list[dict]) -> None:
    """Exit non-zero unless the 2nd process compiled nothing (every executable from the shared cache) and its
    losses equal the 1st's (the same programs on the same data)."""
    cold, warm = runs
    problems = []
    if warm["persistent"]["misses"] or not warm["persistent"]["hits"]:
        problems.append(f"the 2nd process missed the cache: {warm['persistent']}")
    if warm["result"]["losses"] != cold["result"]["losses"]:
        problems.append(f"losses differ: {cold['result']['losses']} then {warm['result']['losses']}")
    if problems:
        sys.exit("warm-start check failed: " + "; ".join(problems))
    print("warm-start check: the 2nd process loaded every executable and computed the same losses")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per runner (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    parser.add_argument("--skip-inductor", action="store_true")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch CPU intra-op threads for (c) and (d); 0: torch's default"
    )
    parser.add_argument("--warm-check", action="store_true", help="cold vs warm compile of the tpu part, 2 processes")
    parser.add_argument("--require-warm", action="store_true", help="with --warm-check: fail unless the 2nd is warm")
    parser.add_argument("--tpu-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="the device's peak for --dtype: prints MFU")
    for field, default in asdict(Config()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=default)
    args = parser.parse_args()
    cfg = Config(**{f: getattr(args, f) for f in asdict(Config())})

    if args.tpu_only:
        print(json.dumps(tpu_only(cfg, args)))
        return
    if args.warm_check:
        warm_check(cfg, args)
        return

    with tempfile.TemporaryDirectory(prefix="compile_step_caches_") as root:
        # Cold compiles: nothing on disk yet, for torch_tpu's persistent cache and for Inductor's caches alike.
        os.environ["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = os.path.join(root, "torch_tpu")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
        import torch_tpu  # noqa: F401

        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        warm_up_process()
        model, batch = build(cfg, args.dtype)
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"device: {torch.tpu.get_device_name()}; GPT-2-style AdamW step: {cfg.layers} layers, d_model "
            f"{cfg.d_model}, {cfg.heads} heads, seq {cfg.seq}, batch {cfg.batch}, vocab {cfg.vocab}, tied "
            f"embedding, {n_params / 1e6:.2f}M params, {args.dtype}; {torch.get_num_threads()} torch threads; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        runners = [
            torch_runner("(a) torch_tpu compile", model, "tpu", "tpu", batch),
            jax_runner("(b) plain JAX, x @ w", model, cfg, batch),
            jax_runner("(b') plain JAX, 2-D GEMMs", model, cfg, batch, _dense_2d),
            torch_runner("(c) torch CPU eager", model, "cpu", None, batch),
        ]
        if not args.skip_inductor:
            runners.append(torch_runner("(d) torch CPU inductor", model, "cpu", "inductor", batch))
        results = measure(runners, args.steps, args.warmup)

    ours, jx, jx2, eager = results[:4]
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other processes' load slows every runner)")
    print(f"first step = compile + one step; step = median of {args.steps} after {1 + args.warmup}, interleaved")
    flops = step_flops(cfg)
    print(f"{'runner':<28}{'first step s':>13}{'step ms':>10}{'vs (b)':>9}{'TFLOP/s':>9}{'MFU':>7}")
    for r in results:
        tflops = flops / r.step_ms / 1e9
        mfu = f"{tflops / args.peak_tflops:>7.1%}" if args.peak_tflops else f"{'-':>7}"
        print(f"{r.name:<28}{r.compile_s:>13.2f}{r.step_ms:>10.1f}{r.step_ms / jx.step_ms:>8.2f}x{tflops:>9.3g}{mfu}")
    print(
        f"ours/JAX step time: {ours.step_ms / jx.step_ms:.2f} (target <= 1.10); vs 2-D-GEMM JAX: "
        f"{ours.step_ms / jx2.step_ms:.2f}"
    )
    print(
        f"ours/JAX cold compile: {ours.compile_s / jx.compile_s:.1f}x (target <= 2x); tpu first step "
        f"{describe_compile(ours.compile_s, runners[0].compiled, runners[0].dynamo)}"
    )
    labels = ("first-step loss", "2nd-step loss (after one AdamW update)")
    # bfloat16's rounding (2^-8 relative) differs between the CPU's and XLA's orders of accumulation.
    rtol = 1e-5 if args.dtype == "float32" else 2e-2
    for i, label in enumerate(labels[: min(len(ours.losses), len(eager.losses))]):
        diff = abs(ours.losses[i] - eager.losses[i])
        ok = math.isclose(ours.losses[i], eager.losses[i], rel_tol=rtol, abs_tol=1e-6)
        print(
            f"numerics, {label}: tpu {ours.losses[i]:.7f} vs CPU eager {eager.losses[i]:.7f} (|diff| {diff:.1e}, "
            f"{'OK' if ok else 'MISMATCH'} at rtol {rtol:.0e}); plain JAX {jx.losses[i]:.7f}"
        )


if __name__ == "__main__":
    main()
