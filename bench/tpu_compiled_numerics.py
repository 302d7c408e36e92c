"""Where a compiled graph's numbers part from eager's: a node-by-node comparison of one model's ATen graphs.

For each model (the model tests' small Hugging Face configs), one forward and backward:
  - the loss on CPU PyTorch, on `tpu` in eager, and under `torch.compile(backend="tpu")`;
  - every ATen graph AOTAutograd hands the backend, replayed through our lowerings three ways on the same inputs:
    (a) the whole graph as one jitted program on the device, every node's value an output,
    (b) each node alone, jitted, on the device (what eager runs: one executable per op),
    (c) each node alone on JAX's CPU backend (the reference: XLA:CPU computes float32 exactly as written);
    and the nodes where (a) parts from (b) (fusion changes the numbers) or (b) from (c) (a lowering is imprecise
    on this device), largest relative error first.
On the XLA CPU platform all three agree by construction; on a TPU this finds the op behind a compiled/eager gap.

    python bench/tpu_compiled_numerics.py [--models gpt2,llama] [--top 8] [--max-graphs N] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import operator
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx.node import map_aggregate

# the repository root, not bench/ (whose kernels.py would shadow the `kernels` package transformers imports)
sys.path[0] = str(Path(__file__).resolve().parents[1])

from tests.models import test_transformers as hf  # noqa: E402  (the repository root is on the path above)
from torch_tpu.ops.decompositions import for_graphs  # noqa: E402
from torch_tpu.ops.registry import graph_lowering  # noqa: E402
from torch_tpu.runtime import checks, platform, storage  # noqa: E402

aten = torch.ops.aten
MODELS = {**hf.MODELS, "t5": hf.t5}


def _relative(a: Any, b: Any) -> float:
    """max |a - b| / max(|b|, tiny) over floating arrays; 0 for anything else."""
    if not (hasattr(a, "dtype") and hasattr(b, "dtype")) or not np.issubdtype(np.asarray(b).dtype, np.floating):
        return 0.0
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.size == 0:
        return 0.0
    finite = np.isfinite(b)
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(b[finite]))), 1e-30)
    return float(np.max(np.abs(np.where(finite, a - b, 0.0)))) / scale


def _run_node(node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
    target = node.target
    if target is operator.getitem:
        return args[0][args[1]]
    if target is aten.copy_.default:
        return jax.numpy.broadcast_to(args[1], args[0].shape).astype(args[0].dtype)
    if not isinstance(target, torch._ops.OpOverload):
        return target(*args, **kwargs)
    lowering = graph_lowering(target)
    if lowering.rng:
        kwargs = dict(kwargs, key=jax.random.key_data(jax.random.key(0)))
    value = lowering.fn(*args, **kwargs)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and hasattr(value, "astype"):
        from torch_tpu.runtime import dtypes

        value = value.astype(dtypes.to_jax(val.dtype))
    return value


def _interpret(gm: torch.fx.GraphModule, inputs: list, per_node_jit: bool, device: jax.Device | None) -> dict:
    """Every call_function node's value, by name."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env: dict = {}
    for node, value in zip(placeholders, inputs, strict=True):
        env[node] = jax.device_put(value, device) if device is not None and hasattr(value, "dtype") else value
    values = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            constant = getattr(gm, node.target)
            if isinstance(constant, torch.Tensor):
                constant = storage.value(constant) if constant.device.type == "tpu" else storage.to_device(constant)
            env[node] = jax.device_put(constant, device) if device is not None else constant
        if node.op != "call_function":
            continue
        args = map_aggregate(node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        kwargs = map_aggregate(node.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        if per_node_jit and isinstance(node.target, torch._ops.OpOverload):
            leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
            arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

            def call(
                *arrs: Any, node: torch.fx.Node = node, leaves: list = leaves, arrays: list = arrays, tree: Any = tree
            ) -> Any:
                filled = list(leaves)
                for i, a in zip(arrays, arrs, strict=True):
                    filled[i] = a
                a, k = jax.tree_util.tree_unflatten(tree, filled)
                return _run_node(node, a, k)

            env[node] = jax.jit(call)(*[leaves[i] for i in arrays])
        else:
            env[node] = _run_node(node, args, kwargs)
        values[node.name] = env[node]
    return values


def _whole(gm: torch.fx.GraphModule, inputs: list) -> dict:
    """Every node's value from one jitted program of the whole graph."""
    names = [n.name for n in gm.graph.nodes if n.op == "call_function"]

    def program(*values: Any) -> list:
        found = _interpret(gm, list(values), per_node_jit=False, device=None)
        return [found[name] for name in names]

    arrays = [v for v in inputs]
    return dict(zip(names, jax.jit(program)(*arrays), strict=True))


def _errors(ours: dict, reference: dict) -> dict[str, float]:
    """Each node's relative error against the reference, in graph order (each pair read once from the device)."""
    errors = {}
    for name, value in reference.items():
        try:
            errors[name] = _relative(ours[name], value)
        except (TypeError, ValueError):
            continue
    return errors


def _worst(errors: dict[str, float], top: int) -> list[tuple[str, float]]:
    return sorted(errors.items(), key=lambda pair: -pair[1])[:top]


def _first_over(errors: dict[str, float], threshold: float) -> tuple[str, float] | None:
    return next(((name, error) for name, error in errors.items() if error > threshold), None)


def _grad_gap(ours: torch.nn.Module, cpu: torch.nn.Module) -> tuple[str, float]:
    """The parameter whose gradient is furthest (relative) from CPU's, and that distance."""
    gaps = [
        (name, _relative(p.grad.cpu().numpy(), q.grad.numpy()))
        for (name, p), (_, q) in zip(ours.named_parameters(), cpu.named_parameters(), strict=True)
        if q.grad is not None and p.grad is not None
    ]
    return max(gaps, key=lambda g: g[1]) if gaps else ("", 0.0)


def analyse(name: str, top: int, max_graphs: int = 0) -> dict:
    torch.manual_seed(0)
    model, batch = MODELS[name]("eager")
    model.train()
    tpu_model = copy.deepcopy(model).to("tpu")
    tpu_batch = {k: v.to("tpu") for k, v in batch.items()}
    cpu_model = copy.deepcopy(model)
    cpu_out, cpu_loss = hf.forward(cpu_model, batch)
    cpu_loss.backward()
    _, eager_loss = hf.forward(tpu_model, tpu_batch)
    eager_loss.backward()
    graphs: list[tuple[str, torch.fx.GraphModule, list]] = []

    def recorder(kind: str) -> Any:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            from torch_tpu.compile.backend import CompiledGraph

            compiled = CompiledGraph(gm, f"diag:{kind}", None)

            def run(*args: Any) -> Any:
                values = [storage.value(a) if isinstance(a, torch.Tensor) else a for a in args]
                graphs.append((kind, gm, values))
                return compiled(*args)

            return make_boxed_func(torch._dynamo.disable(run))

        return compile_graph

    torch._dynamo.reset()
    backend = aot_autograd(
        fw_compiler=recorder("forward"), bw_compiler=recorder("backward"), decompositions=for_graphs()
    )
    compiled_model = copy.deepcopy(model).to("tpu")
    _, compiled_loss = torch.compile(hf.forward, backend=backend)(compiled_model, tpu_batch)
    compiled_loss.backward()
    report = {
        "model": name,
        "loss_cpu": float(cpu_loss.detach()),
        "loss_tpu_eager": float(eager_loss.cpu()),
        "loss_tpu_compiled": float(compiled_loss.detach().cpu()),
        "grad_rel_eager_vs_cpu": _grad_gap(tpu_model, cpu_model),
        "grad_rel_compiled_vs_cpu": _grad_gap(compiled_model, cpu_model),
        "graphs": [],
    }
    cpu = jax.devices("cpu")[0]
    checks.set_index_checks(False)  # the replays below are bare lowerings (no check scope); checks change no value
    for kind, gm, inputs in graphs[: max_graphs or None]:
        whole = _whole(gm, inputs)
        alone = _interpret(gm, inputs, per_node_jit=True, device=None)
        reference = _interpret(gm, inputs, per_node_jit=True, device=cpu)
        fusion, device = _errors(whole, alone), _errors(alone, reference)
        report["graphs"].append(
            {
                "kind": kind,
                "nodes": len(reference),
                "fusion_vs_alone": _worst(fusion, top),
                "alone_vs_cpu": _worst(device, top),
                "first_alone_vs_cpu_over_1e-4": _first_over(device, 1e-4),
                "first_whole_vs_alone_over_1e-4": _first_over(fusion, 1e-4),
                "ops": {n.name: str(n.target) for n in gm.graph.nodes if n.op == "call_function"},
            }
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--json", default=None)
    parser.add_argument("--max-graphs", type=int, default=0, help="replay only the first N graphs (0: all)")
    args = parser.parse_args()
    print(f"platform {platform.platform()}, fp32 matmul precision {torch.get_float32_matmul_precision()}")
    reports = []
    for name in args.models.split(","):
        report = analyse(name, args.top, args.max_graphs)
        reports.append(report)
        print(
            f"{name}: loss cpu {report['loss_cpu']:.7f} tpu eager {report['loss_tpu_eager']:.7f} "
            f"compiled {report['loss_tpu_compiled']:.7f}; worst grad vs cpu: eager {report['grad_rel_eager_vs_cpu']}, "
            f"compiled {report['grad_rel_compiled_vs_cpu']}"
        )
        for g in report["graphs"]:
            ops = g["ops"]
            print(f"  {g['kind']} ({g['nodes']} nodes)")
            for label in ("fusion_vs_alone", "alone_vs_cpu"):
                worst = ", ".join(f"{n}={ops.get(n, '?')}:{e:.2e}" for n, e in g[label][:4])
                print(f"    {label}: {worst}")
            for label in ("first_alone_vs_cpu_over_1e-4", "first_whole_vs_alone_over_1e-4"):
                first = g[label]
                print(f"    {label}: {first and (first[0], ops.get(first[0]), f'{first[1]:.2e}')}")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
