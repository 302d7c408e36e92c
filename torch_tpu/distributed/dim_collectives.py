"""`torch.tpu.ops.all_gather_dim` and `torch.tpu.ops.reduce_scatter_dim`: a gather or reduce-scatter along any
dimension, as `torch_tpu::` operators (which Dynamo keeps in a graph) whose CompositeImplicitAutograd kernel is
made of the functional collectives (`_c10d_functional::all_gather_into_tensor` / `reduce_scatter_tensor`,
gathering or scattering along dim 0, and chunk/cat moves): eager runs those ops' tpu kernels, a compiled graph
holds them (so it runs SPMD), and autograd is theirs (the gradient of a gather is a reduce-scatter and back).

They live here, not beside the other `torch.tpu.ops` (kernels, a sibling layer), because they are collectives;
`install()` adds them to `torch.tpu.ops` once that exists. `group_name` is a process group's `group_name`
("" is the default group)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

_NAMES = ("all_gather_dim", "reduce_scatter_dim")
_library: list[torch.library.Library] = []
_functional = torch.ops._c10d_functional


def _group(op: str, group_name: str) -> tuple[str, int, int]:
    """The group's name, size and this process's rank in it."""
    if not dist.is_initialized():
        raise RuntimeError(f"torch.tpu.ops.{op}: no process group (call torch.distributed.init_process_group)")
    group = dist.group.WORLD if not group_name else dist.distributed_c10d._resolve_process_group(group_name)
    return group.group_name, dist.get_world_size(group), dist.get_rank(group)


def _dim(op: str, tensor: torch.Tensor, dim: int) -> int:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torch.tpu.ops.{op}: tensor must be a Tensor, got {type(tensor).__name__}")
    if not -tensor.ndim <= dim < max(tensor.ndim, 1):
        raise IndexError(f"torch.tpu.ops.{op}: dim {dim} is out of range for a {tensor.ndim}-D tensor")
    return dim % max(tensor.ndim, 1)


def all_gather_dim(tensor: torch.Tensor, dim: int, group_name: str = "") -> torch.Tensor:
    """Every rank's `tensor` concatenated along `dim`, in group-rank order."""
    dim = _dim("all_gather_dim", tensor, dim)
    name, size, _ = _group("all_gather_dim", group_name)
    gathered = _functional.wait_tensor(_functional.all_gather_into_tensor(tensor.contiguous(), size, name))
    return gathered if dim == 0 else torch.cat(gathered.chunk(size, 0), dim)


def reduce_scatter_dim(tensor: torch.Tensor, dim: int, reduce_op: str = "sum", group_name: str = "") -> torch.Tensor:
    """`tensor` reduced over the group (`reduce_op`: sum, avg, max, min, ...), this rank's block along `dim`."""
    dim = _dim("reduce_scatter_dim", tensor, dim)
    name, size, rank = _group("reduce_scatter_dim", group_name)
    if tensor.ndim == 0 or tensor.shape[dim] % size:
        raise ValueError(
            f"torch.tpu.ops.reduce_scatter_dim: tensor's dim {dim} (shape {tuple(tensor.shape)}) on rank {rank} "
            f"must be a multiple of the group size {size}"
        )
    if dim != 0:
        tensor = torch.cat(tensor.chunk(size, dim), 0)
    return _functional.wait_tensor(
        _functional.reduce_scatter_tensor(tensor.contiguous(), reduce_op.lower(), size, name)
    )


def install() -> None:
    """Define the two operators (once) and add them to `torch.tpu.ops` when the kernels layer has made it."""
    if not _library:
        library = torch.library.Library("torch_tpu", "FRAGMENT")
        library.define('all_gather_dim(Tensor tensor, int dim, str group_name="") -> Tensor')
        library.define('reduce_scatter_dim(Tensor tensor, int dim, str reduce_op="sum", str group_name="") -> Tensor')
        library.impl("all_gather_dim", all_gather_dim, "CompositeImplicitAutograd")
        library.impl("reduce_scatter_dim", reduce_scatter_dim, "CompositeImplicitAutograd")
        _library.append(library)
    ops = sys.modules.get("torch.tpu.ops")
    if ops is not None:
        for name in _NAMES:
            setattr(ops, name, getattr(torch.ops.torch_tpu, name))
