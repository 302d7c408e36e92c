"""bench/hlo_compare.py on the CPU platform: our whole compiled step's programs beside plain JAX's jitted step."""

import json
import subprocess
import sys

from tests.helpers import ROOT


def test_the_compiled_step_multiplies_as_many_matrices_as_plain_jax(tmp_path):
    """The tool's table, and what it shows today: the whole step is three programs (Dynamo ends a graph at
    `loss.backward()`), whose matrix products are exactly JAX's (forward and backward), the optimizer's none."""
    out = tmp_path / "hlo.json"
    command = [sys.executable, str(ROOT / "bench" / "hlo_compare.py"), "--size", "tiny", "--json", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    rows = {row["op"]: row for row in json.loads(out.read_text())["rows"]}
    graphs = [name for name in rows["all"] if name.startswith("compiled_graph_")]
    assert sorted(graphs) == ["compiled_graph_backward", "compiled_graph_forward", "compiled_graph_inference"]
    assert rows["dot"]["jax"] > 0 and rows["dot"]["ours"] == rows["dot"]["jax"]
    assert rows["dot"]["compiled_graph_inference"] == 0
    assert rows["all"]["ours"] == sum(rows["all"][name] for name in graphs)
