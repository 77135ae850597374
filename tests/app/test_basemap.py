"""The base map: off without a network check when the environment says so."""

from __future__ import annotations

import pytest


def test_basemap_is_off_without_a_network_check_when_the_environment_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.basemap as bm

    monkeypatch.setenv("GEODBK_BASEMAP", "off")
    monkeypatch.setattr(bm, "reachable", lambda *a, **k: pytest.fail("network was checked"))
    bm.basemap_available.clear()
    assert bm.basemap_available() is False
