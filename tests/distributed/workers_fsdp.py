"""FSDP2 (`fully_shard`) and distributed-checkpoint workers (launched by `launch.py`): each rank trains on its part
of every batch and checks the losses and the final parameters against the same training done in one process on
CPU PyTorch on the whole batch.

FSDP2 averages the ranks' gradients (reduce-scatter AVG), so the single-process reference minimises the mean over
ranks of the local losses (summed over micro-batches when accumulating). In float64 the two sides differ only by
the order of sums and by XLA's kernels against ATen's, ~1e-15 relative after three steps: the tolerance leaves three
orders of magnitude for that and nothing for a wrong gradient. The bfloat16 and Llama cases say their own.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import gc
import os
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import torch_tpu.tpu as tpu_module
from torch_tpu.runtime import deferred, storage

_TIMEOUT = datetime.timedelta(seconds=60)
_BATCH = 3  # rows per rank per micro-batch
_STEPS = 3
_WIDTH, _HIDDEN, _BLOCKS = 8, 16, 4
_F64 = {"rtol": 1e-12, "atol": 1e-14}
HOWS = ("save", "async_save", "full state dict, broadcast_from_rank0")  # the checkpoints each resume is loaded from


class Block(nn.Module):
    """An MLP block (`up` then `down`): what tensor parallelism splits column- then row-wise."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(_WIDTH, _HIDDEN)
        self.down = nn.Linear(_HIDDEN, _WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float64, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(Block() for _ in range(_BLOCKS))
        self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@dataclasses.dataclass
class Config:
    name: str
    shard: dict = dataclasses.field(default_factory=dict)  # fully_shard's options
    optimizer: str = "adamw"
    accumulate: int = 1  # micro-batches per step: all but the last without gradient sync
    fused: bool = False

    @property
    def bf16(self) -> bool:
        return "mp_policy" in self.shard

    @property
    def offload(self) -> bool:
        return "offload_policy" in self.shard


CONFIGS = [
    Config("default resharding"),
    Config("reshard_after_forward=False", {"reshard_after_forward": False}),
    Config(
        "bf16 params, fp32 reduce",
        {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)},
        optimizer="sgd",
    ),
    Config("CPUOffloadPolicy()", {"offload_policy": CPUOffloadPolicy()}),
    Config("gradient accumulation", accumulate=2),
    Config("fused eager", fused=True),
]


def _data(world: int, accumulate: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[step][micro-batch][rank] blocks of inputs and targets, the same on every rank."""
    generator = torch.Generator().manual_seed(7)
    shape = (_STEPS, accumulate, world, _BATCH, _WIDTH)
    inputs = torch.randn(*shape, generator=generator, dtype=torch.float64)
    return inputs.to(dtype), torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def _optimizer(kind: str, parameters) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=0.05, weight_decay=0.1)
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output.to(target.dtype), target)


def _reference(config: Config, world: int) -> tuple[Net, torch.Tensor]:
    """One CPU process on the whole batch: the trained model and the loss of every [step][micro-batch][rank].

    With bfloat16 parameters it does FSDP2's casts: each rank's forward and backward run on a bfloat16 copy of
    the float32 parameters, its bfloat16 gradients are cast to float32 and averaged over the ranks in float32."""
    dtype = torch.float32 if config.bf16 else torch.float64
    model = Net(dtype)
    optimizer = _optimizer(config.optimizer, model.parameters())
    inputs, targets = _data(world, config.accumulate, dtype)
    losses = torch.empty(_STEPS, config.accumulate, world, dtype=dtype)
    for step in range(_STEPS):
        optimizer.zero_grad()
        if config.bf16:
            grads = [torch.zeros_like(p) for p in model.parameters()]
            for r in range(world):
                low = copy.deepcopy(model).to(torch.bfloat16)
                loss = _loss(low(inputs[step, 0, r].to(torch.bfloat16)), targets[step, 0, r])
                loss.backward()
                losses[step, 0, r] = loss.detach()
                for grad, p in zip(grads, low.parameters(), strict=True):
                    grad += p.grad.float()
            for p, grad in zip(model.parameters(), grads, strict=True):
                p.grad = grad / world
        else:
            for m in range(config.accumulate):
                local = [_loss(model(inputs[step, m, r]), targets[step, m, r]) for r in range(world)]
                (sum(local) / world).backward()
                losses[step, m] = torch.stack(local).detach()
        optimizer.step()
    return model, losses


def _shard(model: nn.Module, children: list[nn.Module], **options) -> nn.Module:
    for child in children:
        fully_shard(child, **options)
    return fully_shard(model, **options)


class SyncCounter:
    """Counts whole-device synchronisations (`torch.tpu.synchronize`, which `Event.record` called before)."""

    def __init__(self) -> None:
        self.count = 0
        self._original = tpu_module.synchronize

    def __enter__(self) -> SyncCounter:
        def counting(*args, **kwargs) -> None:
            self.count += 1
            self._original(*args, **kwargs)

        tpu_module.synchronize = counting
        return self

    def __exit__(self, *exc: object) -> None:
        tpu_module.synchronize = self._original


def _freed_during_forward(model: Net) -> list[weakref.ref]:
    """Weak references to the device arrays of each block's unsharded parameters, taken inside its forward."""
    arrays: list[weakref.ref] = []

    def take(block: nn.Module, args: tuple) -> None:
        for param in block._get_fsdp_state()._fsdp_param_group.fsdp_params:
            for output in param.all_gather_outputs:
                array = storage.buffer_of(output)._array
                if not deferred.is_pending(array):  # (a value Fused mode has yet to compute has no weak reference)
                    arrays.append(weakref.ref(array))

    for block in model.blocks:
        block._tpu_test_hook = block.register_forward_pre_hook(take)
    return arrays


def _check_freed(model: Net, arrays: list[weakref.ref], config: Config) -> int:
    """After the forward: with resharding every block's unsharded storages are 0 bytes and their arrays gone;
    without, they are all still there. Returns the unsharded bytes the blocks hold."""
    for block in model.blocks:
        block._tpu_test_hook.remove()
    gc.collect()
    held = 0
    resharded = config.shard.get("reshard_after_forward", True)
    for block in model.blocks:
        for param in block._get_fsdp_state()._fsdp_param_group.fsdp_params:
            for output in param.all_gather_outputs:
                nbytes = output.untyped_storage().nbytes()
                assert nbytes == (0 if resharded else output.numel() * output.element_size()), (config.name, nbytes)
                held += nbytes
    alive = sum(ref() is not None for ref in arrays)
    assert len(arrays) == (0 if config.fused else 2 * 2 * _BLOCKS), (config.name, len(arrays))
    assert alive == (0 if resharded else len(arrays)), (config.name, alive)
    return held


def _train(config: Config, rank: int, world: int) -> tuple[Net, torch.Tensor, dict]:
    """FSDP2 training on this rank's blocks: the model, the rank's losses and what was measured on the way."""
    dtype = torch.float32 if config.bf16 else torch.float64
    gc.collect()  # an earlier configuration's model (FSDP2's hooks make cycles)
    base = torch.tpu.memory_allocated()
    model = Net(dtype).to("tpu")
    _shard(model, list(model.blocks), **config.shard)
    optimizer = _optimizer(config.optimizer, model.parameters())
    inputs, targets = (t[:, :, rank].to("tpu") for t in _data(world, config.accumulate, dtype))
    losses, measured = [], {}
    for step in range(_STEPS):
        with SyncCounter() as syncs:
            optimizer.zero_grad()
            for m in range(config.accumulate):
                model.set_requires_gradient_sync(m == config.accumulate - 1)
                arrays = _freed_during_forward(model) if step == 0 and m == 0 else None
                loss = _loss(model(inputs[step, m]), targets[step, m])
                if arrays is not None:
                    measured["unsharded bytes after forward"] = _check_freed(model, arrays, config)
                    measured["allocated after forward"] = torch.tpu.memory_allocated() - base
                loss.backward()
                losses.append(loss.detach())
            optimizer.step()
        measured.setdefault("syncs", []).append(syncs.count)
    return model, torch.stack(losses).reshape(_STEPS, config.accumulate).cpu(), measured


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().cpu() for name, p in model.named_parameters()}


def _check_offload(model: Net) -> None:
    """CPU offload keeps every shard in pinned CPU memory, and the pinned tensor is FSDP2's own (not a copy)."""
    for block in model.blocks:
        for param in block._get_fsdp_state()._fsdp_param_group.fsdp_params:
            local = param.sharded_param._local_tensor
            assert local.device.type == "cpu" and local.is_pinned(), (local.device, local.is_pinned())
            data = param._sharded_param_data
            assert data.untyped_storage().data_ptr() == local.untyped_storage().data_ptr(), "pin_memory copied"
            assert param.sharded_param.grad is None or param.sharded_param.grad.device.type == "cpu"


def _check_config(config: Config, rank: int, world: int) -> dict:
    expected, expected_losses = _reference(config, world)
    mode = torch.tpu.EagerMode.DEFER_AND_FUSE if config.fused else torch.tpu.eager_mode
    with torch.tpu.set_eager_mode(mode):
        model, losses, measured = _train(config, rank, world)
        got = _full(model)
    tolerance = loss_tolerance = _F64
    if config.bf16:
        # XLA and ATen both compute a bfloat16 op in float32 and round its result once, so the bfloat16 gradients
        # and their float32 average agree exactly; a loss is a float32 mean whose sum XLA orders differently (a few
        # float32 ulps). The optimizer step is one XLA program (`eager.steps`), whose multiply-adds may contract
        # into one rounding where ATen makes two: over three SGD steps, three roundings of each parameter (rtol)
        # and of its update and momentum (|update| <= 0.1: ulp 7.5e-9, carried by momentum at most 2.7x: atol).
        tolerance, loss_tolerance = {"rtol": 3 * 2**-23, "atol": 1e-7}, {"rtol": 1e-6, "atol": 0}
    torch.testing.assert_close(losses, expected_losses[:, :, rank], **loss_tolerance, msg=f"{config.name}: losses")
    for name, parameter in expected.named_parameters():
        torch.testing.assert_close(got[name], parameter.detach(), **tolerance, msg=f"{config.name}: {name}")
    if config.offload:
        _check_offload(model)
    group = model.blocks[0]._get_fsdp_state()._fsdp_param_group
    assert isinstance(group.comm_ctx.all_gather_stream, torch.tpu.Stream), type(group.comm_ctx.all_gather_stream)
    assert measured["syncs"] == [0] * _STEPS, f"{config.name}: device syncs per step {measured['syncs']}"
    print(f"fsdp {config.name}: losses and parameters match; device syncs per step {measured['syncs']}", flush=True)
    return measured


def _check_memory(measured: dict[str, dict]) -> None:
    """Resharding after forward frees exactly the blocks' unsharded parameter bytes, as `memory_allocated` sees."""
    kept = measured["reshard_after_forward=False"]
    freed = measured["default resharding"]
    assert freed["unsharded bytes after forward"] == 0 and kept["unsharded bytes after forward"] > 0
    drop = kept["allocated after forward"] - freed["allocated after forward"]
    assert drop == kept["unsharded bytes after forward"], (drop, kept["unsharded bytes after forward"])
    print(f"fsdp memory: resharding after forward frees {drop} bytes", flush=True)


def two_ranks() -> None:
    """Every FSDP2 configuration, the Llama model and the checkpoints (the 2-rank tests)."""
    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    measured = {config.name: _check_config(config, rank, world) for config in CONFIGS}
    _check_memory(measured)
    check_llama(rank, world)
    check_checkpoints(rank, world, os.environ["TPU_DIST_SCRATCH"])
    dist.destroy_process_group()


def _llama_batches(world: int) -> torch.Tensor:
    """[step] token batches of `world` * 2 sequences of 8 tokens."""
    return torch.randint(0, 64, (_STEPS, world * 2, 8), generator=torch.Generator().manual_seed(3))


def _llama(seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).double()


def check_llama(rank: int, world: int) -> None:
    """A Hugging Face `LlamaForCausalLM` from a random config (2 layers, hidden 32) trained 3 steps with AdamW under
    FSDP2 (each decoder layer and the root sharded) equals one CPU process on the whole batch.

    Everything is float64 except the rotary tables, which transformers computes in float32 on both sides; XLA's and
    ATen's float32 cos/sin differ by an ulp (6e-8 relative), which reaches the losses and parameters at ~1e-7."""
    batches = _llama_batches(world)
    expected = _llama()
    optimizer = torch.optim.AdamW(expected.parameters(), lr=1e-2)
    expected_losses = []
    for step in range(_STEPS):
        optimizer.zero_grad()
        loss = expected(input_ids=batches[step], labels=batches[step]).loss
        loss.backward()
        optimizer.step()
        expected_losses.append(loss.detach())
    model = _llama().to("tpu")
    _shard(model, list(model.model.layers))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    local = batches[:, 2 * rank : 2 * rank + 2].to("tpu")
    losses = []
    for step in range(_STEPS):
        optimizer.zero_grad()
        loss = model(input_ids=local[step], labels=local[step]).loss  # equal token counts: the mean of the means
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    mean = torch.stack(losses)
    dist.all_reduce(mean, dist.ReduceOp.AVG)
    tolerance = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(mean.cpu(), torch.stack(expected_losses), **tolerance, msg="llama: losses")
    got = _full(model)
    for name, parameter in expected.named_parameters():
        torch.testing.assert_close(got[name], parameter.detach(), **tolerance, msg=f"llama: {name}")
    print("fsdp llama: losses and parameters match", flush=True)


def _step(
    model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    optimizer.zero_grad()
    loss = _loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach().cpu()


def _sharded_net(seed: int, mesh=None) -> Net:
    """A Net under FSDP2 over the world, or, with a (dp, tp) `mesh`, each block tensor-parallel over "tp" (`up`
    column-wise, `down` row-wise) and FSDP2 over "dp"."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = Net(seed=seed).to("tpu")
    if mesh is not None:
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return _shard(model, list(model.blocks), mesh=None if mesh is None else mesh["dp"])


def four_ranks() -> None:
    """FSDP2 x tensor parallel on a (dp, tp) = (2, 2) mesh equals one CPU process; its checkpoints resume."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("tpu_dist", timeout=_TIMEOUT)
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank, world = mesh["dp"].get_local_rank(), mesh["dp"].size()  # a tp group shares its batch
    config = Config("2-D (dp, tp) = (2, 2)")
    expected, expected_losses = _reference(config, world)
    model = _sharded_net(0, mesh)
    optimizer = _optimizer(config.optimizer, model.parameters())
    inputs, targets = (t[:, 0, rank].to("tpu") for t in _data(world, 1, torch.float64))
    losses = torch.stack([_step(model, optimizer, inputs[step], targets[step]) for step in range(_STEPS)])
    torch.testing.assert_close(losses, expected_losses[:, 0, rank], **_F64, msg="2-D: losses")
    got = _full(model)
    for name, parameter in expected.named_parameters():
        torch.testing.assert_close(got[name], parameter.detach(), **_F64, msg=f"2-D: {name}")
    print(f"fsdp {config.name}: losses and parameters match", flush=True)
    check_checkpoints(rank, world, os.environ["TPU_DIST_SCRATCH"], mesh)
    dist.destroy_process_group()


def check_checkpoints(rank: int, world: int, scratch: str, mesh=None) -> None:
    """Save an FSDP2 model and its AdamW state after two steps (`dcp.save`, `dcp.async_save`, full state dicts
    offloaded to rank 0's CPU); loading each into a differently initialised model resumes bit-exactly: the third
    step's loss and parameters are those of the uninterrupted run (the same operations on the same values). With a
    (dp, tp) `mesh` the model is 2-D, and `rank` and `world` are the data-parallel ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    inputs, targets = (t[:, 0, rank].to("tpu") for t in _data(world, 1, torch.float64))

    def fresh(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = _sharded_net(seed, mesh)
        return model, _optimizer("adamw", model.parameters())

    def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}

    model, optimizer = fresh(seed=0)
    for step in range(2):
        _step(model, optimizer, inputs[step], targets[step])
    directories = {how: os.path.join(scratch, how) for how in ("save", "async_save")}
    dcp.save(sharded_state(model, optimizer), checkpoint_id=directories["save"])
    # The save's thread runs collectives while this one trains on: on a group of its own, as DCP's docs ask.
    background = dist.new_group(backend="gloo")
    saving = dcp.async_save(
        sharded_state(model, optimizer), checkpoint_id=directories["async_save"], process_group=background
    )
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_model = get_model_state_dict(model, options=full)
    full_optim = get_optimizer_state_dict(model, optimizer, options=full)
    parameters = _full(model)
    if dist.get_rank() == 0:
        assert all(torch.equal(full_model[name], parameters[name]) for name in parameters), "full state dict"
        assert all(v.device.type == "cpu" for v in full_model.values()), "cpu_offload"
        # Written out as a training script would (the CPU state, AdamW's step count, is the optimizer's own tensor).
        torch.save({"model": full_model, "optim": full_optim}, os.path.join(scratch, "full.pt"))
        saved = torch.load(os.path.join(scratch, "full.pt"))
        full_model, full_optim = saved["model"], saved["optim"]
    else:
        assert full_model == {} and full_optim == {}, "cpu_offload keeps full state dicts on rank 0 only"
    expected_loss = _step(model, optimizer, inputs[2], targets[2])
    expected = _full(model)
    saving.result()
    broadcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    for how in HOWS:
        resumed, resumed_optimizer = fresh(seed=1)
        if how in directories:
            state = sharded_state(resumed, resumed_optimizer)
            dcp.load(state, checkpoint_id=directories[how])
            set_model_state_dict(resumed, state["model"])
            set_optimizer_state_dict(resumed, resumed_optimizer, state["optim"])
        else:
            set_model_state_dict(resumed, full_model, options=broadcast)
            set_optimizer_state_dict(resumed, resumed_optimizer, full_optim, options=broadcast)
        loss = _step(resumed, resumed_optimizer, inputs[2], targets[2])
        assert torch.equal(loss, expected_loss), (how, loss, expected_loss)
        got = _full(resumed)
        assert all(torch.equal(got[name], expected[name]) for name in expected), how
        print(f"checkpoint {how}: the resumed step equals the uninterrupted one", flush=True)
