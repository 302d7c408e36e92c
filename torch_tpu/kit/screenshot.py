"""Screenshot report.html with a headless Chromium, to check that the page a person opens actually renders.

    python -m torch_tpu.kit.screenshot report/report.html report/report.png
    python -m torch_tpu.kit.screenshot report/report.html report/shots/ --sections   # one PNG per section/plot

Uses Debian's `chromium` (or `chromium-browser`/`google-chrome`) with a throwaway profile and every background
network feature off, so it works offline and leaves nothing behind. `sections` drives the browser through the
Chrome DevTools Protocol (the `websocket-client` library) to measure and screenshot each element on its own.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

_QUIET = ("--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync")
# Every report section and plot, with its box in CSS pixels of the whole page.
_BOXES = """JSON.stringify({height: document.documentElement.scrollHeight, boxes:
  Array.from(document.querySelectorAll('section[id], figure.plot[id]')).map(e => {
    const r = e.getBoundingClientRect();
    return {id: e.id, kind: e.tagName.toLowerCase(), x: r.left + scrollX, y: r.top + scrollY,
            width: r.width, height: r.height};
  })})"""

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(
    page: str | pathlib.Path, png: str | pathlib.Path, width: int = 1280, height: int = 2400, timeout: float = 120
) -> pathlib.Path:
    """Render `page` to `png`; raises RuntimeError when no browser is installed or it produced no image."""
    browser = find_browser()
    if browser is None:
        raise RuntimeError(f"no headless browser found (tried {', '.join(BROWSERS)}); apt-get install chromium")
    page, png = pathlib.Path(page).resolve(), pathlib.Path(png).resolve()
    with tempfile.TemporaryDirectory(prefix="torch_tpu_chromium_") as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                *_QUIET,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--hide-scrollbars",
                f"--screenshot={png}",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    if not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"{browser} produced no screenshot of {page}")
    return png


class _DevTools:
    """A minimal Chrome DevTools Protocol session on one page: send a command, wait for its answer."""

    def __init__(self, url: str, timeout: float) -> None:
        import websocket  # websocket-client

        self.socket = websocket.create_connection(url, timeout=timeout, suppress_origin=True)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == number:  # events (no id) are skipped
                if "error" in message:
                    raise RuntimeError(f"chromium: {method} failed: {message['error']}")
                return message["result"]

    def close_browser(self) -> None:
        """Ask the browser to exit cleanly (its helpers and the profile's writes end with it)."""
        self.socket.send(json.dumps({"id": next(self.ids), "method": "Browser.close", "params": {}}))
        self.socket.close()

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


def sections(
    page: str | pathlib.Path, out_dir: str | pathlib.Path, width: int = 1280, timeout: float = 120
) -> dict[str, Any]:
    """Screenshot every `<section id>` and `<figure class="plot" id>` of `page` on its own, as OUT_DIR/ID.png.

    Returns {"height": page height in px, "boxes": [{id, kind, x, y, width, height, png}]}, so a caller can check
    that each part of the report is there, laid out and drawn.
    """
    browser = find_browser()
    if browser is None:
        raise RuntimeError(f"no headless browser found (tried {', '.join(BROWSERS)}); apt-get install chromium")
    page, out_dir = pathlib.Path(page).resolve(), pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="torch_tpu_chromium_") as profile:
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", *_QUIET, f"--user-data-dir={profile}"]
        command += [f"--window-size={width},1000", "--hide-scrollbars", "--remote-debugging-port=0", "about:blank"]
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            tools = _DevTools(_page_socket(pathlib.Path(profile) / "DevToolsActivePort", timeout), timeout)
            tools.call("Page.navigate", url=page.as_uri())
            deadline = time.monotonic() + timeout
            while tools.evaluate("document.readyState") != "complete":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not finish loading {page} in {timeout:.0f} s")
                time.sleep(0.1)
            layout = json.loads(tools.evaluate(_BOXES))
            for box in layout["boxes"]:
                clip = {k: box[k] for k in ("x", "y", "width", "height")} | {"scale": 1}
                shot = tools.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
                box["png"] = out_dir / f"{box['id']}.png"
                box["png"].write_bytes(base64.b64decode(shot["data"]))
            tools.close_browser()
        finally:
            _end(process)
    return layout


def _end(process: subprocess.Popen) -> None:
    """Wait for the browser to exit (it was asked to close), else kill its process group: its renderer and helper
    processes write into the profile directory, which can be removed only once they are gone."""
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _page_socket(port_file: pathlib.Path, timeout: float) -> str:
    """The DevTools WebSocket URL of the browser's page (the port is in the profile once it listens)."""
    deadline = time.monotonic() + timeout
    while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
        if time.monotonic() > deadline:
            raise RuntimeError(f"chromium did not open its DevTools port in {timeout:.0f} s")
        time.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as answer:
        targets = json.loads(answer.read())
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


if __name__ == "__main__":
    if "--sections" in sys.argv:
        for found in sections(sys.argv[1], sys.argv[2])["boxes"]:
            print(f"{found['id']}: {found['width']:.0f}x{found['height']:.0f} px -> {found['png']}")
    else:
        print(screenshot(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "report.png"))
