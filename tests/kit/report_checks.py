"""Checks on the report's per-section screenshots (torch_tpu.kit.screenshot.sections), shared by the report tests."""

from __future__ import annotations

from typing import Any

import numpy as np

SLO_RED = (198, 40, 40)  # report_plots draws the SLO line in #c62828
FIRST_SERIES = (31, 119, 180)  # matplotlib's first colour (C0), every plot's first series


def _near(pixels: np.ndarray, colour: tuple[int, int, int], within: int = 40) -> int:
    return int((np.abs(pixels.astype(int) - np.array(colour)) <= within).all(axis=-1).sum())


def assert_drawn(layout: dict[str, Any], sections: set[str], plots: set[str], window_height: int = 1000) -> None:
    """Every expected section and plot is on the page, laid out, and its screenshot shows text or drawn data.

    A section must hold dark pixels (its text, >= 0.5 % of the box); a plot must be at least 300x150 px and show
    its first series' colour; the latency plot must also show the SLO line's red. The summary must fit the first
    screen (the browser window's height).
    """
    from PIL import Image

    boxes = {box["id"]: box for box in layout["boxes"]}
    found = {i for i, b in boxes.items() if b["kind"] == "section"}
    assert found == sections, f"sections: missing {sections - found}, unexpected {found - sections}"
    found, wanted = {i for i, b in boxes.items() if b["kind"] == "figure"}, {f"plot-{p}" for p in plots}
    assert found == wanted, f"plots: missing {wanted - found}, unexpected {found - wanted}"
    for name, box in boxes.items():
        image = Image.open(box["png"]).convert("RGB")
        assert abs(image.width - box["width"]) <= 1 and abs(image.height - box["height"]) <= 1, (name, image.size)
        pixels = np.asarray(image)
        dark = int((pixels.min(axis=-1) < 128).sum())
        assert dark >= 0.005 * pixels.shape[0] * pixels.shape[1], f"{name} looks blank: {dark} dark pixels"
        if box["kind"] == "figure":
            assert box["width"] >= 300 and box["height"] >= 150, (name, box)
            assert _near(pixels, FIRST_SERIES) >= 100, f"{name}: no data series drawn"
            if name == "plot-latency":
                assert _near(pixels, SLO_RED) >= 50, "the latency plot has no SLO line"
    summary = boxes["summary"]
    assert summary["y"] + summary["height"] <= window_height, f"the summary does not fit one screen: {summary}"
    assert layout["height"] > sum(boxes[s]["height"] for s in sections)
