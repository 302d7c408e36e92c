"""DeviceMesh, DTensor and tensor parallel on tpu (`workers_parallel.py`), in the shared launches: on 2 ranks (a mesh
made before any tensor, layouts, redistributions, DTensor ops and random ops, TP of an MLP, a transformer block
and a Hugging Face Llama) and on 4 (device binding as CUDA code does it, a topology-aware 2-D mesh, submeshes, 2-D
DTensor, TP within DP). Every value is compared with CPU PyTorch; here, each check must have run on every rank.
The device binding rules themselves are unit-tested in one process."""

import launch
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

_TWO_RANKS = (
    "init_device_mesh before any tensor",
    "device names",
    "DTensor layouts and redistributions",
    "DTensor ops",
    "DTensor random",
    "tensor parallel MLP",
    "tensor parallel transformer block",
    "tensor parallel LlamaForCausalLM",
)
_FOUR_RANKS = (
    "init_process_group(device_id=tpu:LOCAL_RANK)",
    "device names",
    "topology_aware_mesh",
    "submeshes and _flatten",
    "2-D DTensor",
    "tensor parallel on a (dp, tp) mesh",
)


def _ran_everywhere(output: str, world: int, checks: tuple[str, ...]) -> None:
    missing = [f"rank {r}: {c}" for r in range(world) for c in checks if f"rank {r}: {c} ok (" not in output]
    assert not missing, f"checks that did not run: {missing}\n{output[-3000:]}"


@launch.in_shared_launch
def test_mesh_before_any_tensor_dtensor_and_tensor_parallel_on_two_ranks():
    results = launch.shared("workers_parallel.two_ranks")
    launch.check(results)
    _ran_everywhere("".join(r.output for r in results), 2, _TWO_RANKS)


@launch.in_shared_launch(4)
def test_topology_aware_2d_mesh_dtensor_and_tp_within_dp_on_four_ranks():
    results = launch.shared("workers_parallel.four_ranks", nprocs=4)
    launch.check(results)
    _ran_everywhere("".join(r.output for r in results), 4, _FOUR_RANKS)


@pytest.fixture
def local_rank_1_of_2(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")


def test_the_process_device_answers_to_its_local_rank(local_rank_1_of_2):
    """What CUDA code passes on local rank 1 names this process's one device; its tensors report tpu:0."""
    assert torch.tpu.device_count() == torch.accelerator.device_count() == 2  # init_process_group checks index < it
    torch.tpu.set_device(1)
    torch.tpu.set_device(torch.device("tpu", 1))
    with torch.tpu.device("tpu:1"):
        assert torch.tpu.current_device() == 0
    for device in (torch.device("tpu", 1), "tpu:1", "tpu", torch.device("tpu", 0)):
        assert torch.ones(2, device=device).device == torch.device("tpu", 0)
        assert torch.empty(2, device=device).device == torch.device("tpu", 0)
        assert torch.arange(3.0).to(device).device == torch.device("tpu", 0)
    assert torch.tpu.get_device_name(1) == torch.tpu.get_device_name(0)


@pytest.mark.parametrize(
    "make",
    [
        lambda device: torch.zeros(2, device=device),
        lambda device: torch.empty(2, device=device),
        lambda device: torch.empty_strided((2,), (1,), device=device),
        lambda device: torch.arange(2.0).to(device),
        lambda device: torch.randn(2, device=device),
        lambda device: torch.full((2,), 1.5, device=device),
        lambda device: torch.ones(2, device="tpu").new_ones(3, device=device),
        lambda device: torch.tpu.set_device(device),
        lambda device: torch.tpu.device(device),
    ],
)
def test_another_process_device_is_refused(local_rank_1_of_2, make):
    """Before, any index made a tpu:0 tensor silently; now tpu:3 (no such device) and tpu:2 (another
    process's, on a 4-process host) raise, naming the device."""
    with pytest.raises(
        RuntimeError, match=r"one tpu device per process, tpu:0 or tpu:1 \(LOCAL_RANK\); cannot select tpu:3$"
    ):
        make(torch.device("tpu", 3))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCAL_WORLD_SIZE", "4")
        with pytest.raises(RuntimeError, match=r"cannot select tpu:2; tpu:2 is local rank 2's device"):
            make("tpu:2")


def test_without_a_launcher_only_tpu_0(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert torch.tpu.device_count() == 1
    with pytest.raises(RuntimeError, match=r"one tpu device per process, tpu:0; cannot select tpu:1$"):
        torch.zeros(1, device="tpu:1")
    with pytest.raises(ValueError, match="expected a tpu device, got cpu"):
        torch.tpu.set_device("cpu")


@pytest.mark.skipif(
    not hasattr(FakeTensor, "_normalize_fake_device"),
    reason="torch 2.11 normalises fake devices inline: the alias is not applied in compiled regions (compat.py)",
)
def test_compiled_code_sees_the_alias(local_rank_1_of_2):
    """A factory on tpu:LOCAL_RANK inside a compiled region traces on tpu:0 (before: a device mismatch with its
    tpu:0 inputs); another process's index raises while tracing."""

    def shifted(x: torch.Tensor, device: str) -> torch.Tensor:
        return x * 2 + torch.ones(3, device=device)

    x = torch.arange(3.0)
    compiled = torch.compile(shifted, backend="tpu", fullgraph=True)
    result = compiled(x.to("tpu"), "tpu:1")
    assert result.device == torch.device("tpu", 0) and torch.equal(result.cpu(), shifted(x, "cpu"))
    with pytest.raises(Exception, match=r"cannot select tpu:3"):
        compiled(x.to("tpu"), "tpu:3")
