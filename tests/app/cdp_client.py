"""A minimal Chrome DevTools Protocol client for the dashboard's browser checks.

Uses ``websockets`` (a Streamlit dependency) and a headless Chromium started with
``--remote-debugging-port``; no Selenium or driver binaries.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from test_app_browser import CHROMIUM_FLAGS, WINDOW


class CDP:
    """Send CDP commands over one page's websocket and wait for their replies."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.n = ws, 0

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command; return its ``result`` (empty on a protocol error)."""
        self.n += 1
        await self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == self.n:
                return dict(msg.get("result", {}))

    async def eval(self, expression: str) -> Any:
        """Evaluate JavaScript in the page and return its JSON value."""
        res = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")

    async def click(self, x: float, y: float) -> None:
        """A left click at page coordinates."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )


@contextmanager
def chromium(port: int) -> Iterator[str]:
    """Start headless Chromium with remote debugging; yield the page's websocket URL."""
    profile = tempfile.mkdtemp(prefix="geodbk-cdp-")
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=1) as resp:
                    tabs = json.load(resp)
                page = next(t for t in tabs if t["type"] == "page")
                yield str(page["webSocketDebuggerUrl"])
                break
            except (OSError, StopIteration):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
