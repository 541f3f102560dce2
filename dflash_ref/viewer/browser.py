"""Headless Chromium for the viewer: a screenshot of a written file (`view --screenshot`), and the browser the
tests drive. Debian's `chromium` (with `chromium-driver` for the tests' Selenium) is what the README's test
command installs; where there is none, the caller gets None and says so."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str | None:
    """The path of a Chromium on this machine, or None."""
    return next((found for found in map(shutil.which, NAMES) if found), None)


def screenshot(html: str | Path, png: str | Path, width: int = 1400, height: int = 1500) -> Path:
    """The page as headless Chromium draws it once loaded, at width × height pixels, to `png`."""
    browser = chromium()
    if browser is None:
        raise RuntimeError(f"a screenshot needs Chromium (one of {', '.join(NAMES)}); apt-get install chromium")
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: nothing of the user's, no first-run state
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--virtual-time-budget=5000", f"--screenshot={png}",
             Path(html).resolve().as_uri()],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"Chromium could not take the screenshot (exit {done.returncode}): {done.stderr[-1000:]}")
    return png
