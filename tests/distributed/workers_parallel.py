"""DeviceMesh, DTensor and tensor parallel on tpu (launched by `test_parallel.py`).

Every DTensor value is compared with the same computation on CPU PyTorch on the full tensor, float64, bit-exact
where the math is exact (layouts, redistributions of exact values, elementwise ops) and to a reduction-order
tolerance elsewhere; training under tensor parallel is compared with a single CPU process. Each check prints
one line, so the test can tell which of them ran.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

_TIMEOUT = datetime.timedelta(seconds=120)
_F64 = {"rtol": 1e-12, "atol": 1e-12}  # float64 results whose reduction order differs from CPU's


def _full(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _exact(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    actual = actual.full_tensor() if isinstance(actual, DTensor) else actual
    if actual.dtype != expected.dtype or not torch.equal(actual.cpu(), expected):
        raise AssertionError(f"{what}: got {actual.cpu()} expected {expected}")


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str, **tolerance: float) -> None:
    actual = actual.full_tensor() if isinstance(actual, DTensor) else actual
    torch.testing.assert_close(actual.cpu(), expected, **(tolerance or _F64), msg=lambda m: f"{what}: {m}")


_started = time.monotonic()


def _done(what: str) -> None:
    """One line per check (the test looks for it), with the seconds since the previous one."""
    global _started
    now = time.monotonic()
    print(f"rank {os.environ['RANK']}: {what} ok ({now - _started:.1f} s)", flush=True)
    _started = now


# -- device binding ----------------------------------------------------------------------------------------------


def _device_names() -> None:
    """The process's one device answers to tpu:LOCAL_RANK and to tpu:0; its tensors report tpu:0."""
    local_rank = int(os.environ["LOCAL_RANK"])
    assert torch.tpu.device_count() == int(os.environ["LOCAL_WORLD_SIZE"]) > local_rank, torch.tpu.device_count()
    assert torch.accelerator.device_count() == torch.tpu.device_count() and torch.tpu.current_device() == 0
    for name in (torch.device("tpu", local_rank), "tpu", torch.device("tpu", 0)):
        assert torch.ones(2, device=name).device == torch.device("tpu", 0), name
        assert torch.arange(3).to(name).device == torch.device("tpu", 0), name
    other = local_rank + 1 if local_rank + 1 < torch.tpu.device_count() else local_rank + 2
    try:
        torch.zeros(2, device=torch.device("tpu", other))
    except RuntimeError as error:
        assert f"cannot select tpu:{other}" in str(error), error
    else:
        raise AssertionError(f"a tensor on tpu:{other}, another process's device, was made")
    _done("device names")


def _bind() -> tuple[int, int]:
    """What CUDA code does under a launcher: select the local rank's device, bind the default group to it."""
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.tpu.set_device(local_rank)
    device = torch.device("tpu", local_rank)
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT, device_id=device)
    assert dist.distributed_c10d._get_default_group().bound_device_id == device
    _device_names()
    dist.barrier()  # on the bound device
    _done("init_process_group(device_id=tpu:LOCAL_RANK)")
    return dist.get_rank(), dist.get_world_size()


def _mesh_before_any_tensor() -> DeviceMesh:
    """`init_device_mesh` alone (no group yet, no tensor yet) on every rank: DeviceMesh sets the device itself
    (`set_device(LOCAL_RANK)`) and makes the default group."""
    from torch_tpu.runtime import storage

    assert storage.memory.num_alloc == 0, "a tensor existed before the mesh"
    mesh = init_device_mesh("tpu", (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
    assert dist.get_backend() == "tpu_dist" and mesh.device_type == "tpu" and mesh.mesh_dim_names == ("tp",)
    tensor = torch.full((3,), float(dist.get_rank() + 1), dtype=torch.float64, device="tpu")
    dist.all_reduce(tensor, group=mesh.get_group("tp"))
    world = dist.get_world_size()
    _exact(tensor, torch.full((3,), world * (world + 1) / 2, dtype=torch.float64), "all_reduce on the mesh's group")
    _done("init_device_mesh before any tensor")
    _device_names()
    return mesh


# -- DTensor -----------------------------------------------------------------------------------------------------


def _layouts(mesh: DeviceMesh, rank: int, world: int) -> None:
    full = _full(0, 4 * world, 6)
    sharded = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
    assert sharded.device.type == "tpu" and sharded.to_local().device.type == "tpu"
    _exact(sharded.to_local(), full.chunk(world, 0)[rank], "Shard(0) local")
    _exact(sharded, full, "full_tensor of Shard(0)")
    _exact(sharded.redistribute(mesh, [Replicate()]).to_local(), full, "Shard(0) -> Replicate")
    _exact(sharded.redistribute(mesh, [Shard(1)]).to_local(), full.chunk(world, 1)[rank], "Shard(0) -> Shard(1)")
    uneven = _full(1, 2 * world + 1, 3)  # uneven shards pad in the collectives
    _exact(distribute_tensor(uneven.to("tpu"), mesh, [Shard(0)]), uneven, "uneven Shard(0)")
    replicated = distribute_tensor(full.to("tpu"), mesh, [Replicate()])
    _exact(replicated.redistribute(mesh, [Shard(1)]).to_local(), full.chunk(world, 1)[rank], "Replicate -> Shard(1)")
    ints = torch.arange(world * 10, dtype=torch.int64).reshape(world * 2, 5)
    _exact(distribute_tensor(ints.to("tpu"), mesh, [Shard(0)]).redistribute(mesh, [Shard(1)]), ints, "int64 S->S")
    # Partial: each rank holds a summand (from_local), as after a row-parallel matmul.
    summands = [_full(10 + r, world * 2, 3) for r in range(world)]
    total = sum(summands[1:], summands[0])
    partial = DTensor.from_local(summands[rank].to("tpu"), mesh, [Partial()])
    _close(partial.redistribute(mesh, [Replicate()]).to_local(), total, "Partial -> Replicate")
    partial = DTensor.from_local(summands[rank].to("tpu"), mesh, [Partial()])
    _close(partial.redistribute(mesh, [Shard(0)]).to_local(), total.chunk(world, 0)[rank], "Partial -> Shard(0)")
    maximum = DTensor.from_local(summands[rank].to("tpu"), mesh, [Partial("max")])
    _exact(maximum.full_tensor(), torch.stack(summands).amax(0), "Partial(max) -> Replicate")
    _done("DTensor layouts and redistributions")


def _ops(mesh: DeviceMesh, rank: int, world: int) -> None:
    a, w, b = _full(20, 4 * world, 6), _full(21, 6, 2 * world), _full(22, 4 * world, 6)
    rows = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
    _close(rows @ distribute_tensor(w.to("tpu"), mesh, [Replicate()]), a @ w, "Shard(0) @ Replicate")
    _close(rows @ distribute_tensor(w.to("tpu"), mesh, [Shard(1)]), a @ w, "Shard(0) @ Shard(1)")
    columns = distribute_tensor(a.to("tpu"), mesh, [Shard(1)])
    product = columns @ distribute_tensor(w.to("tpu"), mesh, [Shard(0)])
    assert product.placements == (Partial(),), product.placements
    _close(product, a @ w, "Shard(1) @ Shard(0) (a Partial result)")
    other = distribute_tensor(b.to("tpu"), mesh, [Shard(0)])
    _exact(rows * 2 + other, a * 2 + b, "elementwise")
    _exact(torch.relu(rows) - other.abs(), torch.relu(a) - b.abs(), "unary elementwise")
    _close(rows.sum(), a.sum(), "sum of Shard(0)")
    _close(rows.sum(0), a.sum(0), "sum over the sharded dim")
    _close(rows.mean(1), a.mean(1), "mean over a replicated dim")
    _exact(rows.amax(0), a.amax(0), "amax over the sharded dim")
    _close(torch.softmax(rows, dim=1), torch.softmax(a, 1), "softmax over a replicated dim")
    _close(torch.softmax(rows, dim=0), torch.softmax(a, 0), "softmax over the sharded dim")
    _close(F.log_softmax(columns, dim=1), F.log_softmax(a, 1), "log_softmax over the sharded dim")
    local = DTensor.from_local(a.chunk(world, 0)[rank].to("tpu"), mesh, [Shard(0)])
    _exact(local, a, "from_local Shard(0)")
    # Autograd through DTensor ops: the gradient of the full computation.
    leaf = distribute_tensor(a.to("tpu"), mesh, [Shard(0)]).requires_grad_()
    (leaf.tanh() * distribute_tensor(b.to("tpu"), mesh, [Shard(0)])).sum().backward()
    reference = a.clone().requires_grad_()
    (reference.tanh() * b).sum().backward()
    _close(leaf.grad, reference.grad, "gradient through DTensor ops")
    _done("DTensor ops")


def _random(mesh: DeviceMesh, rank: int, world: int) -> None:
    """torch.distributed.tensor's offset-based RNG tracker drives the device RNG through `get_rng_state` and
    `set_rng_state`: each shard is drawn at offset `start + shard index * local numel` (rounded up to 4) and
    every rank ends at `start + numel`, so replicas agree, shards differ, and later draws stay in step."""
    from torch.distributed.tensor import _random as dtensor_random

    torch.manual_seed(1234)
    start = torch.tpu.get_rng_state()
    sharded = torch.distributed.tensor.randn(4 * world, 3, device_mesh=mesh, placements=[Shard(0)])
    assert isinstance(dtensor_random._rng_tracker, dtensor_random.OffsetBasedRNGTracker), dtensor_random._rng_tracker
    after = torch.tpu.get_rng_state()
    seed, offset = start.view(torch.int64).tolist()
    assert after.view(torch.int64).tolist() == [seed, offset + 4 * world * 3], (start, after)
    full = sharded.full_tensor().cpu()
    # The same draws, made by hand in one process: each shard at its own offset.
    for r in range(world):
        torch.tpu.set_rng_state(torch.tensor([seed, offset + r * 4 * 3], dtype=torch.int64).view(torch.uint8))
        _exact(torch.randn(4, 3, dtype=torch.float32, device="tpu"), full[4 * r : 4 * (r + 1)], f"shard {r}'s draw")
    torch.tpu.set_rng_state(after)
    assert len({tuple(chunk.flatten().tolist()) for chunk in full.chunk(world)}) == world, "shards repeat"
    replicated = torch.distributed.tensor.rand(5, 2, device_mesh=mesh, placements=[Replicate()])
    gathered = [torch.empty(5, 2, device="tpu") for _ in range(world)]
    dist.all_gather(gathered, replicated.to_local())
    assert all(torch.equal(g.cpu(), gathered[0].cpu()) for g in gathered), "replicas differ"
    ones = distribute_tensor(torch.ones(4 * world, 8, device="tpu"), mesh, [Shard(0)])
    dropped = F.dropout(ones, 0.5).full_tensor().cpu()
    assert set(dropped.unique().tolist()) <= {0.0, 2.0} and 0 < (dropped == 0).sum() < dropped.numel(), dropped
    state = torch.tpu.get_rng_state().view(torch.int64).tolist()
    states = [None] * world
    dist.all_gather_object(states, state)
    assert all(s == state for s in states), f"the ranks' RNG states diverged: {states}"
    plain = torch.rand(6, device="tpu")  # a plain random op after DTensor ones: the same on every rank
    everyone = [torch.empty(6, device="tpu") for _ in range(world)]
    dist.all_gather(everyone, plain)
    assert all(torch.equal(e.cpu(), plain.cpu()) for e in everyone), "plain draws after DTensor ones differ"
    _done("DTensor random")


# -- tensor parallel ---------------------------------------------------------------------------------------------


def _train(model: nn.Module, batches: list[torch.Tensor], loss: Callable, steps: int = 3, **adamw: object) -> list:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **adamw)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        value = loss(model, batches[step])
        value.backward()
        optimizer.step()
        losses.append(value)
    return losses


def _same_parameters(parallel: nn.Module, reference: nn.Module, what: str, **tolerance: float) -> None:
    expected = dict(reference.named_parameters())
    for name, param in parallel.named_parameters():
        _close(param, expected[name].detach(), f"{what}: {name}", **tolerance)


class _MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def _mlp(mesh: DeviceMesh, rank: int, world: int) -> None:
    torch.manual_seed(0)
    reference = _MLP().double()
    parallel = _MLP().double().to("tpu")
    parallel.load_state_dict({k: v.to("tpu") for k, v in reference.state_dict().items()})
    parallelize_module(parallel, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    assert isinstance(parallel.up.weight, DTensor) and parallel.up.weight.placements == (Shard(0),)
    batches = [_full(30 + step, 4, 8) for step in range(3)]

    def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (model(x.to(next(model.parameters()).device)) ** 2).mean()

    losses = _train(parallel, batches, loss)
    expected = _train(reference, batches, loss)
    for step, (got, want) in enumerate(zip(losses, expected, strict=True)):
        _close(got.detach(), want.detach(), f"MLP loss at step {step}")
    _same_parameters(parallel, reference, "MLP after 3 AdamW steps")
    _done("tensor parallel MLP")


class _Attention(nn.Module):
    """Causal self-attention whose heads are split by -1, so that under tensor parallel a rank sees its heads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1)) / self.head_dim**0.5
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(batch, length, -1))


class _Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = _Attention(dim, heads)
        self.mlp_norm = nn.RMSNorm(dim)
        self.mlp = _MLP(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def _block(mesh: DeviceMesh, rank: int, world: int) -> None:
    """Megatron-style: q/k/v and the MLP's up column-wise, o and down row-wise; the norms sequence-parallel
    (activations sharded on the sequence between the parallel regions)."""
    torch.manual_seed(1)
    reference = _Block().double()
    model = _Block().double().to("tpu")
    model.load_state_dict({k: v.to("tpu") for k, v in reference.state_dict().items()})
    sequence = (Shard(1),)
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=sequence, desired_input_layouts=(Replicate(),)),
        "attention.q": ColwiseParallel(),
        "attention.k": ColwiseParallel(),
        "attention.v": ColwiseParallel(),
        "attention.o": RowwiseParallel(output_layouts=Shard(1)),
        "mlp_norm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=sequence, desired_input_layouts=(Replicate(),)),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(model, mesh, plan)
    length = 4 * world
    batches = [_full(40 + step, 2, length, 16) for step in range(3)]

    def parallel_loss(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        mine = x.chunk(world, 1)[rank].to("tpu")  # each rank feeds its part of the sequence
        return (block(mine) ** 2).sum()  # its part of the loss; the gradients sum the parts

    def reference_loss(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return (block(x) ** 2).sum()

    losses = _train(model, batches, parallel_loss)
    expected = _train(reference, batches, reference_loss)
    for step, (got, want) in enumerate(zip(losses, expected, strict=True)):
        parts = [torch.empty((), dtype=torch.float64, device="tpu") for _ in range(world)]
        dist.all_gather(parts, got.detach())
        _close(sum(p.cpu() for p in parts), want.detach(), f"block loss at step {step}")
    _same_parameters(model, reference, "block after 3 AdamW steps")
    _done("tensor parallel transformer block")


def _llama(mesh: DeviceMesh, rank: int, world: int) -> None:
    """A small Hugging Face LlamaForCausalLM (random config) trained 3 steps under TP equals one CPU process."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    torch.manual_seed(2)
    reference = LlamaForCausalLM(config).double()
    model = LlamaForCausalLM(config).double().to("tpu")
    model.load_state_dict({k: v.to("tpu") for k, v in reference.state_dict().items()})
    layer_plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, mesh, layer_plan)
    vocabulary_plan = {  # the embedding and the head split over the vocabulary
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, mesh, vocabulary_plan)
    generator = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 64, (2, 8), generator=generator) for _ in range(3)]

    def loss(language_model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(language_model.lm_head.weight.device)
        return language_model(input_ids=ids, labels=ids).loss

    # Llama computes its RMSNorms, rotary angles and loss in float32 even in a float64 model, so gradients agree
    # to float32 rounding (~1e-7 relative). Adam's update lr * g / (|g| + eps) turns that noise into a visible
    # difference wherever |g| is near eps; eps=1e-4 keeps the update well conditioned (|g| here up to 0.3), and
    # then 3 steps agree to far below 1e-4 of a step. The norms' weights stay plain tensors beside DTensors, which
    # torch's foreach AdamW rejects (as on CUDA): the per-parameter implementation.
    adamw = {"foreach": False, "eps": 1e-4}
    losses = _train(model, batches, loss, **adamw)
    expected = _train(reference, batches, loss, **adamw)
    for step, (got, want) in enumerate(zip(losses, expected, strict=True)):
        _close(got.detach(), want.detach(), f"Llama loss at step {step}", rtol=1e-6, atol=1e-6)
    _same_parameters(model, reference, "Llama after 3 AdamW steps", rtol=1e-5, atol=1e-6)
    _done("tensor parallel LlamaForCausalLM")


def two_ranks() -> None:
    """Everything on 2 ranks: the first worker of the shared launch (no tensor may exist before its mesh)."""
    mesh = _mesh_before_any_tensor()
    rank, world = dist.get_rank(), dist.get_world_size()
    for check in (_layouts, _ops, _random, _mlp, _block, _llama):
        check(mesh, rank, world)
    dist.destroy_process_group()
    print("parallel checks passed", flush=True)


# -- 2-D meshes (4 ranks) ----------------------------------------------------------------------------------------


def _topology_mesh(rank: int, world: int) -> DeviceMesh:
    """On the CPU platform (no physical topology) `topology_aware_mesh` gives ranks in process order."""
    from torch_tpu.runtime import platform

    ranks = torch.tpu.distributed.topology_aware_mesh((2, world // 2))
    assert ranks.dtype == torch.int64 and ranks.shape == (2, world // 2), ranks
    if platform.platform() == "cpu":
        assert torch.equal(ranks, torch.arange(world).reshape(2, world // 2)), ranks
        hybrid = torch.tpu.distributed.topology_aware_mesh((1, 2), dcn_mesh_shape=(world // 2, 1))
        assert torch.equal(hybrid, torch.arange(world).reshape(world // 2, 2)), hybrid
    mesh = DeviceMesh("tpu", ranks, mesh_dim_names=("dp", "tp"))
    _done("topology_aware_mesh")
    return mesh


def _submeshes(mesh: DeviceMesh, rank: int, world: int) -> None:
    position = (mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank())
    ranks = mesh.mesh
    assert ranks[position].item() == rank, (position, ranks)
    assert mesh["dp"].mesh.tolist() == ranks[:, position[1]].tolist()
    assert mesh["tp"].mesh.tolist() == ranks[position[0]].tolist()
    for name, along in (("dp", ranks[:, position[1]]), ("tp", ranks[position[0]])):
        value = torch.full((2,), float(rank + 1), dtype=torch.float64, device="tpu")
        dist.all_reduce(value, group=mesh.get_group(name))
        _exact(value, torch.full((2,), float((along + 1).sum()), dtype=torch.float64), f"all_reduce over {name}")
    flat = mesh["dp", "tp"]._flatten("dp_tp")
    assert flat.size() == world and flat.mesh.tolist() == ranks.flatten().tolist(), flat.mesh
    value = torch.full((1,), float(rank), dtype=torch.float64, device="tpu")
    dist.all_reduce(value, group=flat.get_group())
    _exact(value, torch.full((1,), float(sum(range(world))), dtype=torch.float64), "all_reduce over the flattened dim")
    _done("submeshes and _flatten")


def _dtensor_2d(mesh: DeviceMesh, rank: int, world: int) -> None:
    full = _full(50, 4, 6)
    position = (mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank())
    both = distribute_tensor(full.to("tpu"), mesh, [Shard(0), Shard(1)])
    _exact(both.to_local(), full.chunk(2, 0)[position[0]].chunk(2, 1)[position[1]], "Shard(0), Shard(1) local")
    _exact(both, full, "full_tensor of a 2-D sharding")
    _exact(both.redistribute(mesh, [Replicate(), Shard(0)]).to_local(), full.chunk(2, 0)[position[1]], "S,S -> R,S(0)")
    _exact(both.redistribute(mesh, [Shard(1), Replicate()]).to_local(), full.chunk(2, 1)[position[0]], "S,S -> S(1),R")
    nested = distribute_tensor(full.to("tpu"), mesh, [Shard(0), Shard(0)])  # dim 0 split 4 ways
    _exact(nested.to_local(), full.chunk(4, 0)[position[0] * 2 + position[1]], "Shard(0), Shard(0) local")
    _exact(nested.redistribute(mesh, [Replicate(), Replicate()]).to_local(), full, "S(0),S(0) -> R,R")
    summands = [_full(60 + r, 4, 6) for r in range(world)]
    partial = DTensor.from_local(summands[rank].to("tpu"), mesh, [Partial(), Partial()])
    _close(partial.full_tensor(), sum(summands[1:], summands[0]), "Partial, Partial -> full")
    w = _full(51, 6, 4)
    product = both @ distribute_tensor(w.to("tpu"), mesh, [Replicate(), Shard(1)])
    _close(product, full @ w, "2-D matmul")
    _close(torch.softmax(both, dim=1), torch.softmax(full, 1), "2-D softmax over a sharded dim")
    _close(both.sum(), full.sum(), "2-D sum")
    _done("2-D DTensor")


def _tp_on_2d(mesh: DeviceMesh, rank: int, world: int) -> None:
    """Tensor parallel over `tp` of a (dp, tp) mesh, each dp replica a different batch, gradients averaged over
    dp: equal to one CPU process training on both batches."""
    torch.manual_seed(3)
    reference = _MLP().double()
    model = _MLP().double().to("tpu")
    model.load_state_dict({k: v.to("tpu") for k, v in reference.state_dict().items()})
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    dp = mesh["dp"].get_local_rank()
    batches = [_full(70 + step, 4, 8) for step in range(3)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    expected_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for batch in batches:
        optimizer.zero_grad()
        (model(batch.chunk(2)[dp].to("tpu")) ** 2).mean().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad.to_local(), dist.ReduceOp.AVG, group=mesh.get_group("dp"))
        optimizer.step()
        expected_optimizer.zero_grad()
        sum((reference(half) ** 2).mean() for half in batch.chunk(2)).div(2).backward()
        expected_optimizer.step()
    _same_parameters(model, reference, "TP x DP MLP after 3 AdamW steps")
    _done("tensor parallel on a (dp, tp) mesh")


def four_ranks() -> None:
    """2-D meshes in one launch of 4 ranks: the topology-aware layout, submeshes, DTensor, TP within DP."""
    rank, world = _bind()
    mesh = _topology_mesh(rank, world)
    for check in (_submeshes, _dtensor_2d, _tp_on_2d):
        check(mesh, rank, world)
    dist.destroy_process_group()
    print("2-D checks passed", flush=True)
