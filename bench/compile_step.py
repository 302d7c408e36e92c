"""Compiled training step: a GPT-2-style decoder's whole AdamW step, torch_tpu beside plain JAX and CPU PyTorch.

One run, one process, the same model, init and batch for every runner:
  (a) torch_tpu   `torch.compile(step, backend="tpu")` of forward, loss, backward and `optimizer.step()` on "tpu"
  (b) plain JAX   `jax.jit` of `value_and_grad` + a hand-written AdamW update (torch's AdamW math)
  (c) torch CPU eager, and (d) torch CPU `torch.compile(backend="inductor")` (skip with --skip-inductor)
For each: compile (first-step) time and steady-state step time (median of --steps after --warmup). Targets:
ours/JAX step time <= 1.10, ours/JAX cold compile <= 2x. `--warm-check` runs the tpu part in two child processes
sharing a fresh TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT: the second's compile time should be <= 10% of the first.

Model (defaults): 4 pre-LayerNorm blocks, d_model 256, 4 heads, seq 128, batch 8, vocab 1024 (GPT-2's is 50257;
1024 keeps the head GEMM and the cross-entropy from dominating), learned positions, causal softmax attention,
tanh-GELU MLP 4x, embedding tied to the LM head, no dropout, GPT-2 init (N(0, 0.02), residual projections
scaled by 1/sqrt(2 * layers)). AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1) on every parameter.
Usage: python bench/compile_step.py [--steps N] [--warmup W] [--skip-inductor] [--warm-check] [--layers ...]
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
import numpy as np
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
    arr = lambda t: jnp.asarray(t.detach().cpu().numpy())  # noqa: E731
    blocks = []
    for blk in model.blocks:
        blocks.append({
            "ln_1": {"g": arr(blk.ln_1.weight), "b": arr(blk.ln_1.bias)},
            "ln_2": {"g": arr(blk.ln_2.weight), "b": arr(blk.ln_2.bias)},
            "c_attn": {"w": arr(blk.c_attn.weight.t()), "b": arr(blk.c_attn.bias)},
            "attn_proj": {"w": arr(blk.attn_proj.weight.t()), "b": arr(blk.attn_proj.bias)},
            "c_fc": {"w": arr(blk.c_fc.weight.t()), "b": arr(blk.c_fc.bias)},
            "mlp_proj": {"w": arr(blk.mlp_proj.weight.t()), "b": arr(blk.mlp_proj.bias)},
        })
    return {"wte": arr(model.wte.weight), "wpe": arr(model.wpe.weight), "blocks": blocks,
            "ln_f": {"g": arr(model.ln_f.weight), "b": arr(model.ln_f.bias)}}


def _layer_norm(p: dict, x: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]


def _dense(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def jax_loss(params: dict, idx: jax.Array, targets: jax.Array, heads: int) -> jax.Array:
    b, t = idx.shape
    x = params["wte"][idx] + params["wpe"][:t]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for p in params["blocks"]:
        h = _layer_norm(p["ln_1"], x)
        q, k, v = jnp.split(_dense(p["c_attn"], h), 3, axis=-1)
        q, k, v = (z.reshape(b, t, heads, -1) for z in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = jnp.where(mask, scores, -jnp.inf)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, t, -1)
        x = x + _dense(p["attn_proj"], y)
        x = x + _dense(p["mlp_proj"], jax.nn.gelu(_dense(p["c_fc"], _layer_norm(p["ln_2"], x)), approximate=True))
    logits = _layer_norm(params["ln_f"], x) @ params["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def jax_train_step(heads: int) -> Callable:
    """`step(params, m, v, count, idx, targets) -> (params, m, v, count, loss)`, jitted, state donated."""
    b1, b2 = BETAS

    def step(params, m, v, count, idx, targets):
        loss, grads = jax.value_and_grad(jax_loss)(params, idx, targets, heads)
        count = count + 1
        m = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), m, grads)  # torch: exp_avg.lerp_(grad, 1 - beta1)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        step_size = LR / (1 - b1**count)
        sqrt_bc2 = jnp.sqrt(1 - b2**count)
        params = jax.tree.map(
            lambda p, m, v: p * (1 - LR * WEIGHT_DECAY) - step_size * m / (jnp.sqrt(v) / sqrt_bc2 + EPS),
            params, m, v,
        )
        return params, m, v, count, loss

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


# --- timing --------------------------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    compile_s: float
    step_ms: float
    first_loss: float


def measure(name: str, run: Callable[[], object], sync: Callable[[object], object], steps: int,
            warmup: int) -> Result:
    """First step (compile included) then the median of `steps` synchronised steps after `warmup` more."""
    start = time.perf_counter()
    first = sync(run())
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        sync(run())
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        sync(run())
        samples.append(time.perf_counter() - start)
    return Result(name, compile_s, statistics.median(samples) * 1e3, first)


def torch_runner(model: GPT, device: str, compile_backend: str | None, batch) -> Callable[[], torch.Tensor]:
    model = copy.deepcopy(model).to(device)
    step = torch_step(model, adamw(model.parameters()))
    if compile_backend is not None:
        step = torch.compile(step, backend=compile_backend)
    idx, targets = (t.to(device) for t in batch)
    return lambda: step(idx, targets)


def torch_sync(loss: torch.Tensor) -> float:
    if loss.device.type == "tpu":
        torch.accelerator.synchronize()
    return float(loss.detach().cpu())  # one scalar read per step, for every runner alike


def jax_runner(model: GPT, cfg: Config, batch) -> tuple[Callable[[], jax.Array], Callable]:
    params = jax_params(model)
    state = [params, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params),
             jnp.zeros((), jnp.float32)]
    idx, targets = (jnp.asarray(t.numpy()) for t in batch)
    step = jax_train_step(cfg.heads)

    def run() -> jax.Array:
        *new_state, loss = step(*state, idx, targets)
        state[:] = new_state
        return loss

    return run, lambda loss: float(jax.block_until_ready(loss))


def tpu_only(cfg: Config, args: argparse.Namespace) -> dict:
    """The tpu part alone (a --warm-check child): compile time, step time, what the caches did."""
    import torch_tpu  # noqa: F401

    model, batch = build(cfg)
    result = measure("tpu", torch_runner(model, "tpu", "tpu", batch), torch_sync, args.steps, args.warmup)
    stats = torch.tpu._get_cache_stats()
    graphs = [e for e in stats["per_entry_stats"] if e["source"] in ("compiled", "disk")]
    return {"result": asdict(result), "persistent": stats["persistent"],
            "graphs": [{k: e[k] for k in ("name", "source", "compilation_duration")} for e in graphs]}


def build(cfg: Config) -> tuple[GPT, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = GPT(cfg)
    generator = torch.Generator().manual_seed(1)
    batch = tuple(torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=generator) for _ in range(2))
    return model, batch


def warm_check(cfg: Config, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="torch_tpu_cache_") as root:
        env = dict(os.environ, TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=root)
        command = [sys.executable, __file__, "--tpu-only", "--steps", str(args.steps), "--warmup", str(args.warmup),
                   *(f"--{k.replace('_', '-')}={v}" for k, v in asdict(cfg).items())]
        runs = []
        for label in ("cold", "warm"):
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            r, p = runs[-1]["result"], runs[-1]["persistent"]
            graphs = ", ".join(f"{g['name']} {g['source']} {g['compilation_duration']:.2f}s" for g in runs[-1]["graphs"])
            print(f"{label} process: first step {r['compile_s']:.2f} s, step {r['step_ms']:.1f} ms; "
                  f"disk cache hits {p['hits']}, misses {p['misses']}, writes {p['writes']}; graphs: {graphs}")
        cold, warm = (run["result"]["compile_s"] for run in runs)
        print(f"warm start: second process's first step = {warm / cold:.1%} of the first's (target <= 10%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per runner (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    parser.add_argument("--skip-inductor", action="store_true")
    parser.add_argument("--warm-check", action="store_true", help="cold vs warm compile of the tpu part, 2 processes")
    parser.add_argument("--tpu-only", action="store_true", help=argparse.SUPPRESS)
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

    import torch_tpu  # noqa: F401

    model, batch = build(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"device: {torch.tpu.get_device_name()}; GPT-2-style step: {cfg.layers} layers, d_model {cfg.d_model}, "
          f"{cfg.heads} heads, seq {cfg.seq}, batch {cfg.batch}, vocab {cfg.vocab}, tied embedding, "
          f"{n_params / 1e6:.2f}M params; AdamW; median of {args.steps} steps after {1 + args.warmup}")
    results = [measure("torch_tpu compile (tpu)", torch_runner(model, "tpu", "tpu", batch), torch_sync,
                       args.steps, args.warmup)]
    jax_run, jax_sync = jax_runner(model, cfg, batch)
    results.append(measure("plain JAX jax.jit", jax_run, jax_sync, args.steps, args.warmup))
    results.append(measure("torch CPU eager", torch_runner(model, "cpu", None, batch), torch_sync,
                           args.steps, args.warmup))
    if not args.skip_inductor:
        results.append(measure("torch CPU inductor", torch_runner(model, "cpu", "inductor", batch), torch_sync,
                               args.steps, args.warmup))

    ours, jx, eager = results[0], results[1], results[2]
    print(f"{'runner':<26}{'first step s':>13}{'step ms':>10}{'vs JAX':>9}{'first loss':>13}")
    for r in results:
        print(f"{r.name:<26}{r.compile_s:>13.2f}{r.step_ms:>10.1f}{r.step_ms / jx.step_ms:>8.2f}x{r.first_loss:>13.6f}")
    print(f"ours/JAX step time: {ours.step_ms / jx.step_ms:.2f} (target <= 1.10); "
          f"ours/JAX cold compile: {ours.compile_s / jx.compile_s:.1f}x (target <= 2x)")
    diff = abs(ours.first_loss - eager.first_loss)
    ok = math.isclose(ours.first_loss, eager.first_loss, rel_tol=1e-5, abs_tol=1e-6)
    print(f"numerics: first-step loss tpu {ours.first_loss:.7f} vs CPU eager {eager.first_loss:.7f} "
          f"(|diff| {diff:.1e}, {'OK' if ok else 'MISMATCH'} at rtol 1e-5); JAX {jx.first_loss:.7f}")


if __name__ == "__main__":
    main()
