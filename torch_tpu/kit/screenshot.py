"""Screenshot report.html with a headless Chromium, to check that the page a person opens actually renders.

    python -m torch_tpu.kit.screenshot report/report.html report/report.png

Uses Debian's `chromium` (or `chromium-browser`/`google-chrome`) with a throwaway profile and every background
network feature off, so it works offline and leaves nothing behind.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

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
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
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


if __name__ == "__main__":
    print(screenshot(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "report.png"))
