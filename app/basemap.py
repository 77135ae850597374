"""An optional street base map under the rasters, when the machine is online.

The style is CARTO's Positron (a vector style that needs no access token). Whether it can be
used is checked once every few minutes by opening a TCP connection to its host: offline, the
maps are drawn without a base map (the region and urban outlines still give orientation).
``GEODBK_BASEMAP=off`` in the environment turns it off without a network check (tests, or a
machine whose DNS stalls).
"""

from __future__ import annotations

import os
import socket

import streamlit as st

#: Tokenless vector style drawn under the maps when online.
BASEMAP_STYLE = "https://basemaps.cartocdn.com/gl/positron-gl-style/style.json"
BASEMAP_HOST = "basemaps.cartocdn.com"
BASEMAP_CREDIT = "Base map © CARTO, © OpenStreetMap contributors"


def reachable(host: str, *, port: int = 443, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@st.cache_data(show_spinner=False, ttl=300)
def basemap_available() -> bool:
    """Whether the base map's server can be reached (checked at most every 5 minutes);
    ``False`` when ``GEODBK_BASEMAP=off``."""
    if os.environ.get("GEODBK_BASEMAP", "").strip().lower() in ("off", "0", "no", "false"):
        return False
    return reachable(BASEMAP_HOST)
