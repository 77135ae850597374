"""Map assembly shared by the tabs: raster layers from grids, overlays, click grids, legends."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pydeck as pdk
import streamlit as st
from numpy.typing import NDArray

from app import layers as L
from app.colormaps import (
    CMAPS,
    ColorScale,
    Legend,
    auto_scale,
    colorize,
    format_value,
    mercator_rows,
    png_data_url,
)
from app.context import RunContext
from app.loaders import Z95, Grid, LoadError, Stamp, load_grid, stamp
from app.points import prob_threshold
from app.runs import UNITS, natural_to_log10, to_natural

#: Map layers a user can pick (raster layers first, then the observed tiles).
LAYERS: dict[str, str] = {
    "median": "Predicted median",
    "pi_width": "95% interval width",
    "std": "Predictive sd (log10)",
    "pi_lower": "Lower 95% bound",
    "pi_upper": "Upper 95% bound",
    "prob": "Probability vs a threshold",
    "tiles": "Observed tiles",
}

MAX_CLICK_POINTS = 2000

#: What the uncertainty layers describe (the median is the same for all three).
QUANTITIES: dict[str, str] = {
    "single": "A single speed test",
    "average": "Tile average of K speed tests",
    "latent": "Latent mean speed f(x)",
}


@dataclass(frozen=True)
class LayerSpec:
    """Which quantity a raster shows (hashable, used as a cache key).

    ``quantity`` (a key of :data:`QUANTITIES`) and ``tests`` (K for ``"average"``) choose what
    the interval, sd and probability layers describe; see :func:`quantity_std`.
    """

    kind: str  # a key of LAYERS except "tiles", or "kernel"
    threshold: float = 0.0
    above: bool = True
    quantity: str = "single"
    tests: float = 1.0


def noise_variance(grid: Grid, tests: float) -> float | None:
    """Observation-noise variance (log10 units²) of the tile average of ``tests`` speed tests.

    From the grid attributes that ``geodbk predict`` writes: tests-aware models
    ``s2_floor + s2_meas / tests^power``; constant-noise models ``s2`` whatever ``tests`` is.
    ``None`` for grids written before these attributes.
    """
    a = grid.attrs
    model = a.get("noise_model")
    try:
        if model == "tests":
            power = float(a.get("noise_power", 1.0))
            return float(a["noise_s2_floor"]) + float(a["noise_s2_meas"]) / max(tests, 1.0) ** power
        if model == "constant":
            return float(a["noise_s2"])
    except (KeyError, TypeError, ValueError):
        return None
    return None


def quantity_std(grid: Grid, spec: LayerSpec) -> NDArray[np.float64] | None:
    """Predictive sd (log10) of what ``spec.quantity`` asks for, or ``None`` to use ``std``.

    ``latent``: ``std_f``. ``single`` / ``average``: ``sqrt(std_f² + s2(K))`` with K = 1 or
    ``spec.tests`` (:func:`noise_variance`). ``None`` when the grid lacks ``std_f`` or the
    noise attributes (older grids: the stored ``std`` and intervals are shown).
    """
    if "std_f" not in grid.arrays:
        return None
    std_f = grid.arrays["std_f"]
    if spec.quantity == "latent":
        return std_f
    k = spec.tests if spec.quantity == "average" else 1.0
    s2 = noise_variance(grid, k)
    if s2 is None:
        return None
    out: NDArray[np.float64] = np.sqrt(std_f**2 + s2)
    return out


def quantity_label(grid: Grid, spec: LayerSpec) -> str:
    """Short description of what the uncertainty layers show, for legends."""
    if spec.quantity == "latent":
        return "latent mean f(x)"
    if grid.attrs.get("noise_model") == "constant":
        return "one observation (constant-noise model)"
    if quantity_std(grid, spec) is None:
        return str(grid.attrs.get("quantity", "as predicted"))
    if spec.quantity == "average" and spec.tests != 1:
        return f"tile average of {spec.tests:g} tests"
    return "single speed test"


def layer_values(grid: Grid, spec: LayerSpec) -> NDArray[np.float64]:
    """The 2-D array a raster layer shows, in natural units (probabilities in [0, 1])."""
    if spec.kind == "median":
        return grid.natural("mean")
    sd = quantity_std(grid, spec)
    if sd is not None and spec.kind in ("pi_width", "pi_lower", "pi_upper"):
        lower = to_natural(grid.arrays["mean"] - Z95 * sd, grid.target)
        upper = to_natural(grid.arrays["mean"] + Z95 * sd, grid.target)
        out: NDArray[np.float64] = {"pi_lower": lower, "pi_upper": upper}.get(
            spec.kind, upper - lower
        )
        return out
    if spec.kind in ("pi_width", "pi_lower", "pi_upper"):
        return grid.natural(spec.kind)
    if spec.kind == "std":
        return sd if sd is not None else grid.arrays["std"]
    if spec.kind == "prob":
        t = natural_to_log10(spec.threshold, grid.target)
        m, s = grid.arrays["mean"], (sd if sd is not None else grid.arrays["std"])
        # P(Y >= t) or P(Y <= t): the same formula as the pipelines' p_below/p_above grids.
        return prob_threshold(m, s, 10**t, spec.above)
    raise ValueError(f"unknown layer {spec.kind!r}")


def layer_legend(grid: Grid, spec: LayerSpec, scale: ColorScale) -> Legend:
    """Legend title, unit and note for a layer."""
    unit = UNITS[grid.target]
    t = grid.target
    if spec.kind == "median":
        return Legend(f"Predicted {t}, median", scale, unit)
    what = quantity_label(grid, spec)
    base = t
    t = f"{t} ({what})"
    if spec.kind == "pi_width":
        return Legend(f"Width of the 95% prediction interval of {t}", scale, unit)
    if spec.kind == "pi_lower":
        return Legend(f"Lower end of the 95% prediction interval of {t}", scale, unit)
    if spec.kind == "pi_upper":
        return Legend(f"Upper end of the 95% prediction interval of {t}", scale, unit)
    if spec.kind == "std":
        return Legend(
            f"Predictive sd of log10 {t}",
            scale,
            "log10 units",
            note="0.1 ≈ ×/÷ 1.26, 0.3 ≈ ×/÷ 2 around the median",
        )
    rel = "≥" if spec.above else "≤"
    return Legend(
        f"Probability P({base} {rel} {format_value(spec.threshold, unit)}), {what}", scale, ""
    )


def value_scale(grid: Grid) -> ColorScale:
    """One colour scale for the lower and upper bounds, so the two maps compare directly."""
    lo = grid.natural("pi_lower")
    hi = grid.natural("pi_upper")
    both = np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)]])
    return auto_scale(both, CMAPS["value"], quantiles=(0.01, 0.99))


def layer_scale(grid: Grid, spec: LayerSpec) -> ColorScale:
    """Colour scale for a layer: viridis for values, magma for uncertainty, YlGnBu for P.

    The median (and the observed tiles) use the median's own robust range; the two bounds share
    one range so they can be compared with each other.
    """
    if spec.kind == "median":
        return auto_scale(grid.natural("mean"), CMAPS["value"], quantiles=(0.01, 0.99))
    if spec.kind in ("pi_lower", "pi_upper"):
        return value_scale(grid)
    if spec.kind == "pi_width":
        return auto_scale(layer_values(grid, spec), CMAPS["uncertainty"])
    if spec.kind == "std":
        return auto_scale(layer_values(grid, spec), CMAPS["uncertainty"], log=False)
    return auto_scale(np.array([0.0, 1.0]), CMAPS["probability"], limits=(0.0, 1.0))


def raster_url(values: NDArray[np.floating], lats: NDArray[np.floating], scale: ColorScale) -> str:
    """Colour a north-up lat/lon raster, resample rows to Web Mercator, encode as PNG."""
    rgba = colorize(values, scale)
    return png_data_url(rgba[mercator_rows(lats)])


@st.cache_data(show_spinner=False, max_entries=64)
def grid_layer_png(
    path: str, stamp_: Stamp, target: str, spec: LayerSpec
) -> tuple[str, ColorScale, Legend]:
    """PNG data URL, scale and legend of one layer of a grid (cached per grid and layer)."""
    grid = load_grid(path, stamp_, target)
    scale = layer_scale(grid, spec)
    return (
        raster_url(layer_values(grid, spec), grid.lat, scale),
        scale,
        layer_legend(grid, spec, scale),
    )


@st.cache_data(show_spinner=False, max_entries=8)
def click_points(path: str, stamp_: Stamp, target: str) -> tuple[pd.DataFrame, float]:
    """A coarse set of in-region cell centres with a tooltip label, and their radius in metres."""
    grid = load_grid(path, stamp_, target)
    mask = grid.in_region
    n = int(mask.sum())
    stride = max(1, math.ceil(math.sqrt(n / MAX_CLICK_POINTS)))
    sub = mask[::stride, ::stride]
    rows, cols = np.nonzero(sub)
    lat = grid.lat[::stride][rows]
    lon = grid.lon[::stride][cols]
    unit = UNITS[target]
    med = grid.natural("mean")[::stride, ::stride][rows, cols]
    lo = grid.natural("pi_lower")[::stride, ::stride][rows, cols]
    hi = grid.natural("pi_upper")[::stride, ::stride][rows, cols]
    # Short labels keep the deck JSON small (it is sent to the browser on every rerun).
    labels = [
        f"<b>{format_value(m)}</b> {unit} (95%: {format_value(a)}–{format_value(b)})"
        for m, a, b in zip(med, lo, hi, strict=True)
    ]
    dy = abs(float(grid.lat[0] - grid.lat[1])) * stride if grid.lat.size > 1 else 0.01
    radius = dy * 111_320 * 0.75
    frame = pd.DataFrame({"lon": np.round(lon, 5), "lat": np.round(lat, 5), "label": labels})
    return frame, radius


def _optional(read: Callable[[], dict[str, Any] | None], what: str) -> dict[str, Any] | None:
    """Read an overlay; a bad file is a warning (the map still draws), not an error."""
    try:
        return read()
    except LoadError as exc:
        st.warning(f"The {what} overlay is left out: {exc}")
        return None


def overlay_layers(ctx: RunContext, fill_region: bool = False) -> list[pdk.Layer]:
    """Region boundary and urban outlines, as toggled in the sidebar."""
    out: list[pdk.Layer] = []
    if ctx.show_urban:
        urban = _optional(ctx.urban_areas, "urban-area")
        if urban is not None:  # a white halo under a dark line reads on any colour map
            out.append(L.outline_layer(urban, "urban-areas-halo", (255, 255, 255, 220), 3.0))
            out.append(L.outline_layer(urban, "urban-areas", (30, 30, 30, 255), 1.2))
    if ctx.show_region:
        region = _optional(ctx.region, "region-boundary")
        if region is not None:
            fill = (235, 235, 235, 255) if fill_region else None
            out.append(L.outline_layer(region, "region", (40, 40, 40, 255), 1.6, fill))
    return out


def region_fill(ctx: RunContext) -> list[pdk.Layer]:
    """A light-grey fill of the region, drawn under sparse layers for orientation."""
    try:
        region = ctx.region()
    except LoadError:
        return []  # overlay_layers reports it
    if region is None:
        return []
    return [L.outline_layer(region, "region-fill", (0, 0, 0, 0), 0.0, (236, 236, 236, 255))]


def grid_stamp(ctx: RunContext) -> Stamp:
    """Stamp of the chosen target's grid file."""
    return stamp(ctx.files.grid)
