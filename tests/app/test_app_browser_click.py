"""Browser test of the pydeck click path: a click on the map selects a point (slow)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from test_app_browser import WINDOW, _free_port, server  # noqa: F401 - fixture

CANVAS = "document.querySelector('[data-testid=stDeckGlJsonChart] canvas')"
READY = f"!!{CANVAS} && !document.querySelector('[data-testid=stStatusWidget]')"
#: The map canvas's centre on the page (the region's centre on the demo map), wherever the
#: controls above it put it.
CENTRE = f"(r => [r.left + r.width / 2, r.top + r.height / 2])({CANVAS}.getBoundingClientRect())"


async def _click_and_wait(ws_url: str, url: str, expect: str) -> bool:
    import websockets
    from cdp_client import CDP

    async with websockets.connect(ws_url, max_size=2**26) as ws:
        cdp = CDP(ws)
        await cdp.send(
            "Emulation.setDeviceMetricsOverride",
            width=WINDOW[0], height=WINDOW[1], deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        await cdp.send("Page.navigate", url=url)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not await cdp.eval(READY):
            await asyncio.sleep(0.3)
        await cdp.eval(f"{CANVAS}.scrollIntoView({{block: 'center'}})")
        x, y = await cdp.eval(CENTRE)
        # Retry the click until the selection shows (the canvas may still be drawing).
        while time.monotonic() < deadline:
            await asyncio.sleep(2.0)
            await cdp.click(x, y)
            for _ in range(20):
                if await cdp.eval(f"document.body.innerText.includes({json.dumps(expect)})"):
                    return True
                await asyncio.sleep(0.5)
        return False


@pytest.mark.browser
@pytest.mark.slow
def test_clicking_the_map_selects_a_point(server: str) -> None:  # noqa: F811 - fixture
    from cdp_client import chromium

    with chromium(_free_port()) as ws_url:
        assert asyncio.run(_click_and_wait(ws_url, server, "Selected point"))
