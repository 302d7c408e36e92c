"""The package's layering, checked: imports run one way, runtime -> ops -> eager -> compile -> (distributed, kernels,
profiler) -> kit; the three in brackets are siblings and never import one another.

Every import of a torch_tpu module counts, at module level or inside a function (a lazy import is a dependency
all the same). A module may import its own layer and the layers below it, never one above."""

import ast
import pathlib

import pytest

from tests import helpers

ROOT = helpers.ROOT / "torch_tpu"
LAYERS = ("runtime", "ops", "eager", "compile", "distributed", "kernels", "profiler", "kit")
# The rank of each layer: a module may import layers of a lower rank and its own layer, nothing else.
RANK = {"runtime": 0, "ops": 1, "eager": 2, "compile": 3, "distributed": 4, "kernels": 4, "profiler": 4, "kit": 5}


def may_import(importer: str, imported: str) -> bool:
    return importer == imported or RANK[imported] < RANK[importer]


# The modules outside the layer packages, and why each sits where it does.
TOP_LEVEL = {
    # Zero-copy exchange with JAX arrays (`to_jax`, `from_jax`, DLPack): a tensor's buffer is a jax.Array.
    "torch_tpu.interop": "runtime",
    # Global numeric state: lowerings read it and every cache key (eager's, fused clusters', graphs', the
    # persistent tier's XLA options) includes it, so it sits below all of them.
    "torch_tpu.precision": "runtime",
    # The device RNG stream: lowerings take its keys, eager dispatch and compiled graphs draw them.
    "torch_tpu.random": "runtime",
    # Counters any layer may bump (eager's fallbacks and decompositions) and the kit reports.
    "torch_tpu.metrics": "runtime",
    # `torch.tpu`, the device module: eager modes, synchronize (which runs Fused mode's pending cluster), cache
    # statistics — the user's view of eager execution, used by compile and the kit.
    "torch_tpu.tpu": "eager",
    # Autocast kernels for the device's eager dispatch keys, installed beside the op kernels.
    "torch_tpu.amp": "eager",
    # The package's entry points wire every layer together (and export reaches into compile), so they are the
    # top, with the kit; nothing inside the package imports them.
    "torch_tpu.__init__": "kit",
    "torch_tpu._loader": "kit",
    # Every change to torch, each layer's install in order: it names them all, so it sits on top.
    "torch_tpu.wiring": "kit",
    # Helpers for users' tests comparing `tpu` with CPU: a tool on top of the package, like the kit.
    "torch_tpu.testing": "kit",
}


def module_name(path: pathlib.Path) -> str:
    return ".".join(("torch_tpu", *path.relative_to(ROOT).with_suffix("").parts)) if path != ROOT else "torch_tpu"


def layer_of(module: str) -> str:
    """The layer of a torch_tpu module (or package) name."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    if module == "torch_tpu":
        module = "torch_tpu.__init__"
    for name in (module, ".".join(parts[:2])):
        if name in TOP_LEVEL:
            return TOP_LEVEL[name]
    raise AssertionError(f"{module} has no layer: add it to TOP_LEVEL with the reason")


def imports(path: pathlib.Path, source: str | None = None) -> list[tuple[str, int]]:
    """Every torch_tpu module the module at `path` (or `source` as that module) imports, anywhere in it, with the
    line: `from a import b` counts as `a.b` when `a.b` is a module, else as `a`."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path.parent)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = any(
                    (ROOT.parent / candidate.replace(".", "/")).with_suffix(suffix).exists() for suffix in (".py", "")
                )
                found.append((candidate if is_module else base, node.lineno))
    return [(name, line) for name, line in found if name == "torch_tpu" or name.startswith("torch_tpu.")]


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_module_has_a_layer():
    assert MODULES
    for path in MODULES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_never_go_up(path):
    own = layer_of(module_name(path))
    upward = [
        f"line {line}: {name} ({layer_of(name)})" for name, line in imports(path) if not may_import(own, layer_of(name))
    ]
    assert not upward, f"{module_name(path)} ({own}) imports upward or sideways: {upward}"


def import_graph() -> dict[str, set[str]]:
    """Each torch_tpu module -> the torch_tpu modules it imports (a package's name stands for its __init__)."""
    names = {module_name(path): path for path in MODULES}

    def resolved(name: str) -> str | None:
        return name if name in names else f"{name}.__init__" if f"{name}.__init__" in names else None

    return {
        module: {target for name, _ in imports(path) if (target := resolved(name)) not in (None, module)}
        for module, path in names.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_no_import_circles():
    """No two modules import each other, directly or round a loop (a lazy import counts too)."""
    assert circles(import_graph()) == []


def test_sibling_layers_are_refused():
    assert not may_import("kernels", "distributed") and not may_import("distributed", "profiler")
    assert may_import("kit", "profiler") and may_import("kernels", "compile") and not may_import("compile", "kernels")


def test_the_checker_sees_lazy_relative_and_from_imports():
    source = (
        "import torch\n"
        "from torch_tpu.runtime import dtypes\n"
        "def f():\n"
        "    from torch_tpu.compile import backend\n"
        "    import torch_tpu.kit.cli\n"
        "    from ..eager.cache import executables\n"
        "    from . import platform\n"
    )
    found = imports(ROOT / "runtime" / "storage.py", source)
    assert [name for name, _ in found] == [
        "torch_tpu.runtime.dtypes",
        "torch_tpu.compile.backend",
        "torch_tpu.kit.cli",
        "torch_tpu.eager.cache",
        "torch_tpu.runtime.platform",
    ]
    assert [layer_of(name) for name, _ in found] == ["runtime", "compile", "kit", "eager", "runtime"]


def test_argument_updates_are_registry_lowerings():
    """Batch norm's running statistics are updated through the registry (`writes=`): its mutating overloads are
    derived from the schemas of the functional forms, not kernels built by ops/ out of eager's machinery."""
    import torch

    from torch_tpu.ops.registry import KERNELS, LOWERINGS, mutating_variant

    aten = torch.ops.aten
    for functional, mutating in [
        (aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.default),
        (aten._batch_norm_with_update_functional.default, aten._batch_norm_with_update.default),
    ]:
        lowering = LOWERINGS[functional]
        assert lowering.mutating is mutating and lowering.writes == ("running_mean", "running_var")
        assert mutating not in KERNELS
    with pytest.raises(ValueError, match="updates"):
        mutating_variant(aten._native_batch_norm_legit_functional.default, ("running_var",))


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_argument_updates_reach_the_buffers(mode):
    """The derived kernel of `writes=` updates the running statistics as CPU does, in Strict and Fused eager."""
    import copy

    import torch

    torch.manual_seed(0)
    module = torch.nn.BatchNorm2d(3, momentum=0.3)
    on_tpu = copy.deepcopy(module).to("tpu")
    with torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode)):
        for _ in range(3):
            x = torch.randn(4, 3, 5, 5)
            ours = on_tpu(x.to("tpu"))
            torch.testing.assert_close(ours.cpu(), module(x), rtol=1.3e-5, atol=1e-5)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(on_tpu, name).cpu(), getattr(module, name), rtol=1.3e-5, atol=1e-6)
