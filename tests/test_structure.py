"""The codebase's own rules, checked: module size budgets (soft 800, hard 1000 lines)."""

import pathlib
import warnings

from tests.helpers import ROOT

SOFT, HARD = 800, 1000


def _modules() -> list[pathlib.Path]:
    return sorted(p for folder in ("torch_tpu", "bench", "examples") for p in (ROOT / folder).rglob("*.py"))


def test_modules_within_line_budget():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    assert sizes, "no modules found"
    over_hard = {name: n for name, n in sizes.items() if n > HARD}
    assert not over_hard, f"modules over the hard budget of {HARD} lines: {over_hard}"
    over_soft = {name: n for name, n in sizes.items() if n > SOFT}
    if over_soft:
        warnings.warn(f"modules over the soft budget of {SOFT} lines: {over_soft}", stacklevel=1)
