"""Point inspection helpers: click parsing, log-normal summaries, nearest observed tiles."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from geodbk.exceedance import exceedance_probability
from geodbk.geo.contract import Z95


def point_from_selection(selection: Any, layers: tuple[str, ...]) -> tuple[float, float] | None:
    """Extract the clicked ``(lon, lat)`` from a ``st.pydeck_chart`` selection state.

    Parameters
    ----------
    selection
        The chart's return value (``event.selection``) or its ``selection`` mapping:
        ``{"indices": {layer: [...]}, "objects": {layer: [{...}]}}``.
    layers
        Layer ids to look in, in priority order.

    Returns
    -------
    (lon, lat) or None
        None when nothing (or nothing with coordinates) is selected.
    """
    if selection is None:
        return None
    sel = selection.get("selection", selection) if isinstance(selection, Mapping) else None
    if sel is None:
        sel = getattr(selection, "selection", None)
    if not isinstance(sel, Mapping):
        return None
    objects = sel.get("objects") or {}
    if not isinstance(objects, Mapping):
        return None
    for layer in layers:
        for obj in objects.get(layer) or []:
            if isinstance(obj, Mapping):
                try:
                    lon, lat = float(obj["lon"]), float(obj["lat"])
                except (KeyError, TypeError, ValueError):
                    continue
                if math.isfinite(lon) and math.isfinite(lat):
                    return lon, lat
    return None


@dataclass(frozen=True)
class PointSummary:
    """The predictive distribution at one location, in log10 and natural units."""

    mean_log10: float
    sd_log10: float
    median: float
    lower: float
    upper: float
    mean: float
    sd: float

    @classmethod
    def from_log10(cls, mean_log10: float, sd_log10: float) -> PointSummary:
        """Summarise ``log10 Y ~ N(m, s^2)``: median ``10^m``, 95% interval, log-normal mean/sd."""
        m, s = float(mean_log10), float(sd_log10)
        ln10 = math.log(10.0)
        mu, sig = m * ln10, s * ln10
        mean = math.exp(mu + sig**2 / 2)
        sd = mean * math.sqrt(math.expm1(sig**2))
        return cls(m, s, 10**m, 10 ** (m - Z95 * s), 10 ** (m + Z95 * s), mean, sd)


def prob_threshold(
    mean_log10: NDArray[np.floating], sd_log10: NDArray[np.floating], threshold: float, above: bool
) -> NDArray[np.float64]:
    """P(Y >= t) (``above``) or P(Y <= t) under ``log10 Y ~ N(mean, sd^2)``; NaN passes through
    (:func:`geodbk.exceedance.exceedance_probability` on log10 t)."""
    return exceedance_probability(mean_log10, sd_log10, math.log10(threshold), above=above)


def haversine_km(
    lon: float, lat: float, lons: NDArray[np.floating], lats: NDArray[np.floating]
) -> NDArray[np.float64]:
    """Great-circle distances (km) from one point to many."""
    r = 6371.0088
    p1, p2 = math.radians(lat), np.radians(lats)
    dphi = p2 - p1
    dlmb = np.radians(lons) - math.radians(lon)
    a = np.sin(dphi / 2) ** 2 + math.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    out: NDArray[np.float64] = 2 * r * np.arcsin(np.sqrt(np.clip(a, 0, 1)))
    return out


def nearest_tiles(tiles: pd.DataFrame, lon: float, lat: float, k: int = 5) -> pd.DataFrame:
    """The ``k`` observed tile-quarters nearest to a point, with their distance in km; the
    quarters of one tile (the same distance) latest first."""
    if tiles.empty:
        return tiles.assign(distance_km=pd.Series(dtype=float))
    dist = haversine_km(lon, lat, tiles["lon"].to_numpy(), tiles["lat"].to_numpy())
    out = tiles.assign(distance_km=dist)
    if "quarter" in out.columns:
        by = out.sort_values(["distance_km", "quarter"], ascending=[True, False], kind="stable")
        return by.head(k)
    return out.iloc[np.argsort(dist, kind="stable")[:k]]


def lognormal_pdf(
    x: NDArray[np.floating], mean_log10: float, sd_log10: float
) -> NDArray[np.float64]:
    """Density of ``Y`` (natural units) when ``log10 Y ~ N(m, s^2)``."""
    x = np.asarray(x, dtype=np.float64)
    s = max(sd_log10, 1e-12)
    z = (np.log10(x) - mean_log10) / s
    out: NDArray[np.float64] = np.exp(-0.5 * z**2) / (
        x * math.log(10.0) * s * math.sqrt(2 * math.pi)
    )
    return out
