"""Measure the dashboard's first paint in headless Chromium (a developer tool, not a test).

Usage (from the repository root, with ``streamlit run app`` already serving on PORT)::

    .venv/bin/python tests/app/perf_first_paint.py http://localhost:PORT/ [N]

It opens the page N times (default 5) through the Chrome DevTools protocol and reports, for each
load, the seconds from navigation start until the map area of the Map tab shows the colour-mapped
raster (polled by low-resolution captures of the map box every ~100 ms). The first load after a server start
includes the server's first script run (imports, file reads); later loads hit the caches.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import websockets
from cdp_client import CDP
from PIL import Image
from test_app_browser import CHROMIUM_FLAGS, MAP_BOX, WINDOW, box_is_drawn


async def _measure(url: str, port: int, timeout: float) -> float | None:
    tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
    page = next(t for t in tabs if t["type"] == "page")
    async with websockets.connect(page["webSocketDebuggerUrl"], max_size=2**26) as ws:
        cdp = CDP(ws)
        await cdp.send("Page.enable")
        await cdp.send(
            "Emulation.setDeviceMetricsOverride",
            width=WINDOW[0], height=WINDOW[1], deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        await cdp.send("Page.navigate", url="about:blank")
        t0 = time.perf_counter()
        await cdp.send("Page.navigate", url=url)
        while time.perf_counter() - t0 < timeout:
            # A small, low-resolution capture of the map box only: cheap enough to poll often.
            left, top, right, bottom = MAP_BOX
            clip = {
                "x": left,
                "y": top,
                "width": right - left,
                "height": bottom - top,
                "scale": 0.25,
            }
            shot = await cdp.send("Page.captureScreenshot", format="png", clip=clip)
            if "data" not in shot:  # e.g. while the page is still navigating
                await asyncio.sleep(0.05)
                continue
            box = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
            if box_is_drawn(np.asarray(box, dtype=np.float64)):
                return time.perf_counter() - t0
            await asyncio.sleep(0.1)
    return None


def main(url: str, n: int = 5) -> list[float | None]:
    """Open ``url`` ``n`` times in one headless Chromium; return the first-paint seconds."""
    port = 9300 + int(time.time()) % 500
    profile = tempfile.mkdtemp(prefix="geodbk-perf-")
    chromium = shutil.which("chromium") or "chromium"
    proc = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        return [asyncio.run(_measure(url, port, 60.0)) for _ in range(n)]
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    times = main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    print("first paint (s):", ", ".join("timeout" if t is None else f"{t:.2f}" for t in times))
