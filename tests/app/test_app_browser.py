"""Browser test: the dashboard served by ``streamlit run app`` draws a non-blank map in Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
WINDOW = (1400, 1000)
# The map canvas on a 1400x1000 window: below the tabs, the layer and quantity selectors, the
# quarter slider and the legend (the canvas's top is at y = 551 on the demo run).
MAP_BOX = (480, 560, 1250, 980)  # left, top, right, bottom


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer")


@pytest.fixture
def server(tiny_run: Path) -> Iterator[str]:
    """``streamlit run app`` on a free localhost port, opening the demo run."""
    port = _free_port()
    # No background model warm-up: on a 2-core machine it would compete with the first paint.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GEODBK_APP_WARMUP": "0"}
    cmd = [
        sys.executable, "-m", "streamlit", "run", "app",
        "--server.port", str(port), "--server.headless", "true",
        "--", "--runs-dir", str(tiny_run.parent), "--run", tiny_run.name,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        _wait_http(f"http://localhost:{port}/_stcore/health", time.monotonic() + 60)
        yield f"http://localhost:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def screenshot(url: str, out: Path, profile: Path, budget_ms: int = 15000) -> np.ndarray:
    """One headless Chromium screenshot of ``url`` as an (h, w, 3) array."""
    from PIL import Image

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    shutil.rmtree(profile, ignore_errors=True)
    subprocess.run(
        [
            chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--virtual-time-budget={budget_ms}",
            f"--screenshot={out}", url,
        ],
        check=False, capture_output=True, timeout=120,
    )  # fmt: skip
    if not out.is_file():
        return np.zeros((WINDOW[1], WINDOW[0], 3))
    return np.asarray(Image.open(out).convert("RGB"), dtype=np.float64)


def box_is_drawn(box: np.ndarray) -> bool:
    """True when an image of the map area shows a colour-mapped raster (not blank or outlines)."""
    if box.size == 0:
        return False
    coloured = (box.max(axis=2) - box.min(axis=2)) > 25  # viridis cells are saturated, UI is grey
    return bool(box.std() > 15 and coloured.mean() > 0.10)


def map_is_drawn(image: np.ndarray) -> bool:
    """True when the map box of a full-page screenshot holds a colour-mapped raster."""
    left, top, right, bottom = MAP_BOX
    return box_is_drawn(image[top:bottom, left:right])


@pytest.mark.browser
def test_map_canvas_is_not_blank(server: str, tmp_path: Path) -> None:
    out = tmp_path / "map.png"
    deadline = time.monotonic() + 150
    drawn = False
    attempts = 0
    # The first load starts the server's first script run (imports); later loads hit the caches.
    while time.monotonic() < deadline and not drawn:
        attempts += 1
        image = screenshot(server, out, tmp_path / "profile")
        drawn = map_is_drawn(image)
    assert drawn, f"map area still blank after {attempts} screenshots (last: {out})"


def test_map_is_drawn_detector() -> None:
    blank = np.full((WINDOW[1], WINDOW[0], 3), 255.0)
    assert not map_is_drawn(blank)
    left, top, right, bottom = MAP_BOX
    middle = (top + bottom) // 2
    outline = blank.copy()
    outline[middle, left + 20 : right - 50] = 0.0
    assert not map_is_drawn(outline)
    raster = blank.copy()
    raster[top:bottom, left:right] = np.array([68.0, 1.0, 84.0])
    raster[middle:bottom, left:right] = np.array([253.0, 231.0, 37.0])
    assert map_is_drawn(raster)
