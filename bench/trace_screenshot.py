"""A screenshot of a merged torch.profiler + XLA trace in XProf's trace viewer, rendered by headless Chromium.

Profiles a few Strict-eager training steps of a small MLP with ProfilerActivity.TPU, exports the merged Chrome trace
(PyTorch's ops, the XLA executions and their launch flows on one clock), converts it to the JSON that XProf's own
trace viewer (`trace_viewer_index.html` from the `xprof` package: `pip install torch_tpu[profile]`) loads, serves
both on 127.0.0.1 and screenshots the page. Needs Debian's `chromium` (`apt-get install chromium`); nothing is
downloaded.
Usage: python bench/trace_screenshot.py [--out DIR]   (writes DIR/trace.json, DIR/viewer.json, DIR/trace.png)
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import pathlib
import shutil
import subprocess
import tempfile
import threading

import torch
from torch.profiler import ProfilerActivity, profile, record_function

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_NAMES = ("process_name", "process_sort_index", "thread_name", "thread_sort_index")  # the metadata the viewer reads


def profile_steps(out: pathlib.Path) -> pathlib.Path:
    """Three profiled training steps (after warm-up steps that compile them); returns the merged Chrome trace."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64, device="tpu"), torch.randint(0, 10, (32,), device="tpu")

    def step() -> None:
        with record_function("train_step"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    for _ in range(3):  # a recurring Python scalar becomes a device array on its second use: another program
        step()
    torch.tpu.synchronize()
    config = torch.tpu.profiler.TpuProfilerConfig(run_dir=out / "run")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.TPU], experimental_config=config) as prof:
        for _ in range(3):
            step()
    path = out / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def viewer_json(chrome: dict) -> dict:
    """The Chrome trace as XProf's trace viewer loads it: complete events at µs from the first, names of
    processes and threads, and each launch flow as a bound pair (`bind_id`, `flow_out` on the launching op,
    `flow_in` on the execution)."""
    events = chrome["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    origin = min(e["ts"] for e in spans)
    out: list[dict] = []
    by_start: dict[tuple, dict] = {}
    for e in events:
        if e.get("ph") == "M" and e["name"] in _NAMES:
            meta = {key: e[key] for key in ("name", "ph", "pid", "args")}
            if e["name"].startswith("thread"):
                meta["tid"] = e["tid"]
            out.append(meta)
        elif e.get("ph") == "X" and e.get("cat") != "Trace":  # (not the profile's own span: the view fits the steps)
            span = {"pid": e["pid"], "tid": e["tid"], "name": e["name"], "ts": e["ts"] - origin, "ph": "X"}
            span.update(dur=max(e.get("dur", 0), 1e-3), args={"uid": 0, **e.get("args", {})})
            out.append(span)
            by_start[(e["pid"], e["tid"], e["ts"])] = span
    flows: dict[int, dict] = {}
    for e in events:
        if e.get("ph") in ("s", "f") and e.get("name") == "tpu_launch":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    for flow_id, ends in flows.items():
        start, finish = ends["s"], ends["f"]
        source = [
            s
            for s in out
            if s.get("ph") == "X"
            and (s["pid"], s["tid"]) == (start["pid"], start["tid"])
            and s["ts"] <= start["ts"] - origin <= s["ts"] + s["dur"]
        ]
        target = by_start.get((finish["pid"], finish["tid"], finish["ts"]))
        launcher = min(source, key=lambda s: s["dur"]) if source else None
        if launcher is not None and target is not None and "bind_id" not in launcher:
            launcher.update(bind_id=flow_id, flow_out=True)
            target.update(bind_id=flow_id, flow_in=True)
    end = max(s["ts"] + s["dur"] for s in out if s.get("ph") == "X")
    return {
        "displayTimeUnit": "ns",
        "metadata": {"highres-ticks": True},
        "codeLink": "",
        "useNewBackend": False,
        "details": [{"name": "mpmd_pipeline_view", "value": False}],
        "returnedEventsSize": len(out),
        "filteredByVisibility": True,
        "fullTimespan": [0, end / 1000],
        "stackFrames": {},
        "showCounterMessage": "",
        "totalCounterEvents": 0,
        "traceEvents": out,
    }


def screenshot(viewer: pathlib.Path, png: pathlib.Path, timeout: float = 120) -> pathlib.Path:
    """Serve XProf's trace viewer and `viewer` (a viewer_json file) on 127.0.0.1 and screenshot the page."""
    import xprof

    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    if browser is None:
        raise RuntimeError(f"no headless browser found (tried {', '.join(BROWSERS)}); apt-get install chromium")
    static = pathlib.Path(xprof.__file__).parent / "static"
    with tempfile.TemporaryDirectory(prefix="torch_tpu_viewer_") as site, tempfile.TemporaryDirectory() as profile_dir:
        for item in static.iterdir():
            (pathlib.Path(site) / item.name).symlink_to(item)
        shutil.copy(viewer, pathlib.Path(site) / "trace.json")
        handler = functools.partial(_QuietHandler, directory=site)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # a free port, loopback only
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = (
                f"http://127.0.0.1:{server.server_address[1]}/trace_viewer_index.html"
                "?is_streaming=true&is_oss=true&trace_data_url=%2Ftrace.json"
            )
            png.unlink(missing_ok=True)
            subprocess.run(
                [browser, "--headless", "--no-sandbox", "--enable-unsafe-swiftshader", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile_dir}", "--window-size=1600,1000", "--hide-scrollbars",
                 "--virtual-time-budget=20000", f"--screenshot={png}", url],
                capture_output=True, timeout=timeout, check=False,
            )  # fmt: skip
        finally:
            server.shutdown()
            server.server_close()
    if not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"{browser} produced no screenshot of {url}")
    return png


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="profile_screenshot")
    args = parser.parse_args()
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    chrome = profile_steps(out)
    viewer = out / "viewer.json"
    viewer.write_text(json.dumps(viewer_json(json.loads(chrome.read_text()))))
    print(f"merged trace: {chrome}\nXSpace: {next((out / 'run').rglob('*.xplane.pb'))}")
    print(f"screenshot: {screenshot(viewer, out / 'trace.png')}")


if __name__ == "__main__":
    main()
