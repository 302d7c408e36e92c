"""What torch_tpu changes in torch is listed in one place (`torch_tpu.wiring`) and applied at registration, never
as a side effect of importing a module; the late-bound hooks are filled."""

import ast
import importlib
import pathlib

import torch

from tests import helpers
from torch_tpu import wiring
from torch_tpu.runtime.hooks import hooks

ROOT = helpers.ROOT / "torch_tpu"


def _torch_names(tree: ast.Module) -> set[str]:
    """The names bound to torch objects: imports from torch, then names assigned from them (`sink = ddp._DDPSink`)
    and loop variables over them (`for module in (torch, torch.utils.dlpack)`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    changed = True
    while changed:
        before = len(names)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.For):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value if isinstance(node, ast.Assign) else node.iter
                pairs = [(targets[0], value)]
                if isinstance(targets[0], ast.Tuple) and isinstance(value, ast.Tuple):
                    pairs = list(zip(targets[0].elts, value.elts, strict=False))
                for target, source in pairs:
                    sources = source.elts if isinstance(source, ast.Tuple) and isinstance(node, ast.For) else [source]
                    if isinstance(target, ast.Name) and any(_rooted(s, names) for s in sources):
                        names.add(target.id)
        changed = len(names) != before
    return names


def _rooted(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` is a torch object reached by attributes from a torch name (a call's result is an instance
    the module made, not torch's)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id in names


def changes_to_torch(path: pathlib.Path) -> list[tuple[int, bool]]:
    """(line, at module level) of each attribute of a torch object the module sets (`=` or `setattr`)."""
    tree = ast.parse(path.read_text())
    names = _torch_names(tree)
    module_level = {id(n) for stmt in tree.body for n in ast.walk(stmt)} - {
        id(n)
        for stmt in tree.body
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for n in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [
                t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            targets = [ast.Attribute(value=node.args[0])]
        if any(isinstance(t, ast.Attribute) and _rooted(t.value, names) for t in targets):
            found.append((node.lineno, id(node) in module_level))
    return found


def test_the_scan_sees_the_patterns_of_a_patch(tmp_path):
    source = (
        "import torch\nfrom torch import nn\nimport torch.distributed as dist\n"
        "torch.x = 1\n"
        "def install():\n"
        "    nn.Module.to = None\n"
        "    sink = dist.ddp._DDPSink\n    sink.backward = None\n"
        "    for module in (torch, torch.utils):\n        module.f = None\n"
        "    setattr(torch._C, 'g', None)\n"
        "    plain = object()\n    plain.y = 2\n"
    )
    path = tmp_path / "scan_example.py"
    path.write_text(source)
    assert changes_to_torch(path) == [(4, True), (6, False), (8, False), (10, False), (11, False)]


def test_every_change_to_torch_is_in_an_install_the_wiring_lists():
    changes = wiring.CHANGES + wiring.LATER
    listed = {change.install.split(":")[0] for change in changes} | {m for c in changes for m in c.helpers}
    unlisted, at_import = [], []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(("torch_tpu", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        for line, module_level in changes_to_torch(path):
            (at_import if module_level else unlisted if module not in listed else []).append(f"{module}:{line}")
    assert not at_import, f"modules that change torch when imported: {at_import}"
    assert not unlisted, f"changes to torch outside the modules torch_tpu.wiring lists: {unlisted}"


def test_every_change_resolves_and_applying_again_changes_nothing():
    for change in wiring.CHANGES + wiring.LATER:
        module, function = change.install.split(":")
        assert callable(getattr(importlib.import_module(module), function)), change
    patched = (torch.nn.Module.to, torch.accelerator.synchronize, torch.UntypedStorage.resize_, torch.Tensor.__dlpack__)
    wiring.apply()
    assert (
        torch.nn.Module.to,
        torch.accelerator.synchronize,
        torch.UntypedStorage.resize_,
        torch.Tensor.__dlpack__,
    ) == (patched)
    assert torch.tpu.distributed.__name__ == "torch_tpu.distributed" and torch.tpu.ops.__name__.endswith("prebuilt")


def test_the_hooks_are_filled():
    from torch_tpu.distributed import spmd
    from torch_tpu.eager import fused, modes

    assert hooks.eager_state is modes.state and hooks.flush is fused.flush
    assert (hooks.spmd_plan, hooks.spmd_cluster, hooks.mesh_program) == (spmd.plan, spmd.program, spmd.mesh_program)
