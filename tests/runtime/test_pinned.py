"""Pinned host memory (runtime/pinned.py): PyTorch's pinning API works with torch_tpu loaded, as a no-op that
marks storages — the pinned tensor is the tensor itself, never a copy."""

import gc
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torch_tpu.runtime import pinned


def test_pin_memory_returns_the_tensor_itself():
    host = torch.randn(4, 3)
    assert not host.is_pinned()
    got = host.pin_memory()
    assert got is host
    assert host.is_pinned() and got.is_pinned()
    got[0, 0] = 42.0  # a writer of the pinned tensor (FSDP2's CPU offload) writes the caller's tensor
    assert host[0, 0].item() == 42.0


def test_the_mark_is_per_storage():
    base = torch.randn(8)
    base[2:5].pin_memory()
    gc.collect()  # the mark lives on the storage, not on a Python object of it that could be collected
    assert base.is_pinned() and base[::2].is_pinned() and base.view(2, 4).is_pinned()
    assert not torch.randn(8).is_pinned()
    assert not base.clone().is_pinned()


def test_pin_memory_with_a_device_argument():
    host = torch.arange(6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # PyTorch deprecates the argument itself
        assert host.pin_memory("tpu") is host
        assert host.is_pinned("tpu")
        with pytest.raises(RuntimeError, match="cuda"):
            torch.randn(2).pin_memory("cuda")


def test_pin_memory_keeps_autograd_and_works_in_inference_mode():
    leaf = torch.randn(3, requires_grad=True)
    assert leaf.pin_memory() is leaf and leaf.is_leaf and leaf.grad_fn is None
    with torch.inference_mode():
        host = torch.randn(3)
        assert host.pin_memory() is host and host.is_pinned()


def test_private_pin_memory_is_a_marked_copy():
    host = torch.randn(2, 3).t()
    copy = torch._pin_memory(host)
    assert copy is not host and copy.untyped_storage().data_ptr() != host.untyped_storage().data_ptr()
    assert copy.is_pinned() and not host.is_pinned()
    assert torch.equal(copy, host) and copy.stride() == host.stride()


def test_tpu_tensors_cannot_be_pinned():
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.randn(2, device="tpu").pin_memory()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.empty(2, device="tpu", pin_memory=True)


FACTORY_CALLS = {
    "empty": lambda **kw: torch.empty(2, 3, **kw).fill_(1.5),
    "zeros": lambda **kw: torch.zeros(2, 3, **kw),
    "ones": lambda **kw: torch.ones(5, dtype=torch.int64, **kw),
    "full": lambda **kw: torch.full((2,), 7.0, **kw),
    "empty_strided": lambda **kw: torch.empty_strided((2, 2), (1, 2), **kw).fill_(3),
    "zeros_like": lambda **kw: torch.zeros_like(torch.randn(3), **kw),
    "ones_like": lambda **kw: torch.ones_like(torch.randn(3), **kw),
    "arange": lambda **kw: torch.arange(5, **kw),
    "linspace": lambda **kw: torch.linspace(0, 1, 5, **kw),
    "eye": lambda **kw: torch.eye(3, **kw),
    "tensor": lambda **kw: torch.tensor([[1.0, 2.0], [3.0, 4.0]], **kw),
    "new_zeros": lambda **kw: torch.randn(2).new_zeros(4, **kw),
    "new_full": lambda **kw: torch.randn(2).new_full((3,), 2.5, **kw),
}


@pytest.mark.parametrize("name", sorted(FACTORY_CALLS))
def test_factories_allocate_pinned(name):
    make = FACTORY_CALLS[name]
    result, plain = make(pin_memory=True), make()
    assert result.is_pinned() and not plain.is_pinned()
    assert result.device.type == "cpu"
    assert torch.equal(result, plain) and result.stride() == plain.stride()


def test_every_public_factory_with_pin_memory_is_covered():
    """The wrapped list is exactly the public `torch` functions whose ATen schema takes `pin_memory`."""
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name.removeprefix("aten::")
        if any(a.name == "pin_memory" for a in schema.arguments) and not name.startswith(("_", "sparse_", "new_")):
            if callable(getattr(torch, name, None)):
                names.add(name)
    assert names | {"tensor"} == set(pinned.FACTORIES)


def test_torchscript_still_sees_the_factories_as_builtins():
    @torch.jit.script
    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n) + torch.ones(n)

    assert torch.equal(zeros(3), torch.ones(3))


def test_non_blocking_copy_from_pinned_memory():
    host = torch.randn(64, 32).pin_memory()
    expected = host.clone()
    on_tpu = host.to("tpu", non_blocking=True)
    host.mul_(-3.0)  # mutating the host tensor after the copy must not reach the device value
    torch.tpu.synchronize()
    assert torch.equal(on_tpu.cpu(), expected)
    dest = torch.empty(64, 32, device="tpu")
    dest.copy_(host, non_blocking=True)
    host.zero_()
    assert torch.equal(dest.cpu(), expected * -3.0)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the workers only collate CPU tensors
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("pin_memory_device", ["", "tpu"])
def test_dataloader_pin_memory(num_workers, pin_memory_device):
    data = TensorDataset(torch.randn(10, 3), torch.arange(10))
    plain = list(DataLoader(data, batch_size=4))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "pin_memory_device is deprecated")  # PyTorch's own warning
        loader = DataLoader(
            data, batch_size=4, pin_memory=True, num_workers=num_workers, pin_memory_device=pin_memory_device
        )
        batches = list(loader)
    assert len(batches) == len(plain)
    for (x, y), (px, py) in zip(batches, plain, strict=True):
        assert x.is_pinned() and y.is_pinned()
        assert torch.equal(x.to("tpu", non_blocking=True).cpu(), px) and torch.equal(y, py)
