"""Colour mapping of grids to RGBA/PNG for pydeck BitmapLayers, and legends in real units.

Colour maps: sequential ``viridis`` for predicted values (mean, bounds, observed tiles), drawn
so that yellow is always the better service (reversed for latency, where lower is better:
:func:`value_cmap`), ``magma`` for uncertainty (interval width, sd), ``YlGnBu`` for probabilities, ``cividis``
for kernel slices and the diverging ``coolwarm`` (centred on no change, blue = improved) for
trends. Positive quantities spanning more than a decade are coloured on a log scale
with tick labels in natural units (Mbps or ms).
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from html import escape

import numpy as np
from numpy.typing import NDArray

from geodbk.geo.longitude import native_longitude

#: Colour map per kind of layer.
CMAPS: dict[str, str] = {
    "value": "viridis",
    "uncertainty": "magma",
    "probability": "YlGnBu",
    "kernel": "cividis",
    # Diverging, centred on "no change"; reversed so blue = higher (speeds: improved).
    "change": "coolwarm_r",
}


#: Targets where a lower value is the better service.
LOWER_IS_BETTER: frozenset[str] = frozenset({"latency"})


def value_cmap(target: str) -> str:
    """The colour map of a target's values: ``viridis`` (yellow = fast) for speeds, reversed
    for latency so that yellow is the better service on every target's map."""
    cmap = CMAPS["value"]
    return f"{cmap}_r" if target in LOWER_IS_BETTER else cmap


@dataclass(frozen=True)
class ColorScale:
    """How values map to colours.

    Attributes
    ----------
    cmap
        Matplotlib colour-map name.
    vmin, vmax
        Limits in data units (natural units; both > 0 when ``log``).
    log
        Colour by ``log10(value)`` between ``log10(vmin)`` and ``log10(vmax)``.
    """

    cmap: str
    vmin: float
    vmax: float
    log: bool = False

    def normalise(self, values: NDArray[np.floating]) -> NDArray[np.float64]:
        """Map values to [0, 1] (clipped); NaN stays NaN."""
        v = np.asarray(values, dtype=np.float64)
        lo, hi = self.vmin, self.vmax
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.log10(np.where(v > 0, v, np.nan))
            lo, hi = math.log10(lo), math.log10(hi)
        span = hi - lo if hi > lo else 1.0
        return np.clip((v - lo) / span, 0.0, 1.0)


@lru_cache(maxsize=16)
def lut(cmap: str) -> NDArray[np.uint8]:
    """Return a ``(256, 4)`` uint8 lookup table for a matplotlib colour map."""
    from matplotlib import colormaps

    table = colormaps[cmap](np.linspace(0.0, 1.0, 256))
    out: NDArray[np.uint8] = np.round(table * 255).astype(np.uint8)
    return out


def auto_scale(
    values: NDArray[np.floating],
    cmap: str,
    *,
    log: bool | None = None,
    quantiles: tuple[float, float] = (0.02, 0.98),
    limits: tuple[float, float] | None = None,
) -> ColorScale:
    """Choose colour limits from the data.

    Parameters
    ----------
    values
        Data in natural units (NaN ignored).
    cmap
        Colour-map name.
    log
        Force a log (True) or linear (False) scale; ``None`` picks log when all values are
        positive and the robust range spans more than a factor of 10.
    quantiles
        Robust lower/upper quantiles used as limits.
    limits
        Fixed limits (used as given; e.g. ``(0, 1)`` for probabilities).

    Returns
    -------
    ColorScale
    """
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if limits is not None:
        lo, hi = limits
        use_log = bool(log) and lo > 0
        return ColorScale(cmap, float(lo), float(hi), use_log)
    if finite.size == 0:
        return ColorScale(cmap, 0.0, 1.0, False)
    lo, hi = (float(q) for q in np.quantile(finite, quantiles))
    positive = bool(np.all(finite > 0))
    use_log = (positive and hi / max(lo, 1e-300) > 10.0) if log is None else (log and positive)
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = (lo / 1.5, hi * 1.5) if use_log else (lo - pad, hi + pad)
    return ColorScale(cmap, lo, hi, bool(use_log))


def colorize(
    values: NDArray[np.floating], scale: ColorScale, alpha: int = 235
) -> NDArray[np.uint8]:
    """Colour a 2-D array: ``(ny, nx, 4)`` uint8 RGBA, NaN fully transparent.

    Parameters
    ----------
    values
        2-D data in natural units, row 0 at the top (north).
    scale
        The colour scale.
    alpha
        Opacity (0–255) of valid cells.
    """
    norm = scale.normalise(values)
    valid = np.isfinite(norm)
    idx = np.zeros(norm.shape, dtype=np.intp)
    idx[valid] = np.round(norm[valid] * 255).astype(np.intp)
    rgba = lut(scale.cmap)[idx].copy()
    rgba[..., 3] = np.where(valid, alpha, 0).astype(np.uint8)
    return rgba


def colors_for(
    values: NDArray[np.floating], scale: ColorScale, alpha: int = 230
) -> NDArray[np.uint8]:
    """Colour a 1-D array of values: ``(n, 4)`` uint8 RGBA (for point/polygon layers)."""
    return colorize(np.asarray(values, dtype=np.float64)[None, :], scale, alpha)[0]


def mercator_rows(lats: NDArray[np.floating]) -> NDArray[np.intp]:
    """Row indices that resample a lat-ordered raster to rows equally spaced in Web Mercator.

    A BitmapLayer stretches its image linearly between its bounds in Web Mercator, so a raster
    on a regular latitude grid must be resampled in y to keep cells where they belong.

    Parameters
    ----------
    lats
        Cell-centre latitudes of the rows, in image order (top row first), equally spaced.

    Returns
    -------
    ndarray of int
        For each output row (same count, top first), the source row to take.
    """
    lats = np.asarray(lats, dtype=np.float64)
    n = lats.size
    if n < 2:
        return np.arange(n, dtype=np.intp)
    step = (lats[-1] - lats[0]) / (n - 1)
    edge_top, edge_bottom = lats[0] - step / 2, lats[-1] + step / 2

    def merc(lat: NDArray[np.float64]) -> NDArray[np.float64]:
        lat = np.clip(lat, -85.0, 85.0)
        out: NDArray[np.float64] = np.log(np.tan(np.pi / 4 + np.radians(lat) / 2))
        return out

    y_top, y_bottom = merc(np.array(edge_top)), merc(np.array(edge_bottom))
    centres = y_top + (np.arange(n) + 0.5) / n * (y_bottom - y_top)
    lat_out = np.degrees(2 * np.arctan(np.exp(centres)) - np.pi / 2)
    rows = np.floor((lat_out - edge_top) / step).astype(np.intp)
    out: NDArray[np.intp] = np.clip(rows, 0, n - 1)
    return out


def png_data_url(rgba: NDArray[np.uint8]) -> str:
    """Encode an RGBA array as a ``data:image/png;base64,...`` URL."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba), mode="RGBA").save(buf, format="PNG", optimize=False)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def format_lonlat(lon: float, lat: float, digits: int = 4) -> str:
    """``"lon, lat"`` as users read them: the longitude in [-180, 180] (a map across the 180°
    meridian runs past 180)."""
    return f"{float(native_longitude(lon)):.{digits}f}, {lat:.{digits}f}"


def format_value(value: float, unit: str = "") -> str:
    """Format a value compactly for legends and tables (3 significant figures)."""
    if not math.isfinite(value):
        return "–"
    a = abs(value)
    if a == 0:
        text = "0"
    elif a >= 1000:
        text = f"{value:,.0f}"
    elif a >= 100:
        text = f"{value:.0f}"
    elif a >= 10:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
    elif a >= 0.01:
        text = f"{value:.2f}".rstrip("0").rstrip(".")
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}".strip()


def ticks(scale: ColorScale, max_ticks: int = 6) -> list[tuple[float, float]]:
    """Tick values and their positions in [0, 1] along the colour bar.

    Log scales get 1-2-5 ticks (in natural units); linear scales get "nice" steps.

    Returns
    -------
    list of (position, value)
    """
    lo, hi = scale.vmin, scale.vmax
    if hi <= lo:
        return [(0.0, lo)]
    if scale.log:
        values: list[float] = []
        for mult in ((1.0,), (1.0, 3.0), (1.0, 2.0, 5.0)):
            cand = [
                m * 10.0**e
                for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                for m in mult
            ]
            cand = [c for c in cand if lo * (1 - 1e-9) <= c <= hi * (1 + 1e-9)]
            if len(cand) > max_ticks:
                break
            values = cand
        if len(values) < 2:
            values = [lo, hi]
    else:
        # The smallest "nice" step (1, 2, 2.5, 5 x 10^k) giving at most max_ticks ticks.
        mag = 10.0 ** math.floor(math.log10((hi - lo) / max_ticks))
        values = []
        for step in (m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0, 20.0, 25.0, 50.0)):
            start = math.ceil(lo / step - 1e-9) * step
            values = list(np.arange(start, hi + step * 1e-6, step))
            if len(values) <= max_ticks:
                break
        if len(values) < 2:
            values = [lo, hi]
    pos = scale.normalise(np.array(values, dtype=np.float64))
    return [(float(p), float(v)) for p, v in zip(pos, values, strict=True)]


def diverging_ticks(scale: ColorScale, n_side: int = 2) -> tuple[float, ...]:
    """Ticks symmetric about the centre of a diverging scale: for a log scale from 1/R to R,
    ``R^(k/n_side)`` for k = -n_side..n_side (so 1 sits in the middle)."""
    if scale.log:
        top = math.log10(scale.vmax)
        return tuple(10.0 ** (top * k / n_side) for k in range(-n_side, n_side + 1))
    mid = (scale.vmin + scale.vmax) / 2
    half = (scale.vmax - scale.vmin) / 2
    return tuple(mid + half * k / n_side for k in range(-n_side, n_side + 1))


@dataclass(frozen=True)
class Legend:
    """A colour-bar legend: title (with units), scale, and tick labels."""

    title: str
    scale: ColorScale
    unit: str = ""
    note: str = ""
    #: Tick values to label (natural units); empty: chosen by :func:`ticks`.
    tick_values: tuple[float, ...] = ()


def legend_ticks(legend: Legend) -> list[tuple[float, float]]:
    """(position, value) of the legend's ticks: its own ``tick_values``, else :func:`ticks`."""
    if not legend.tick_values:
        return ticks(legend.scale)
    values = np.array(legend.tick_values, dtype=np.float64)
    pos = legend.scale.normalise(values)
    return [(float(p), float(v)) for p, v in zip(pos, values, strict=True)]


def legend_html(legend: Legend, width_px: int = 360) -> str:
    """Render a legend as a small HTML colour bar with tick labels in real units; every text
    (title, unit, note: they may come from run files) is HTML-escaped."""
    table = lut(legend.scale.cmap)
    stops = ", ".join(
        f"rgb({r},{g},{b}) {100 * i / 10:.0f}%"
        for i, (r, g, b, _) in enumerate(table[np.linspace(0, 255, 11).astype(int)])
    )
    labels = "".join(
        f'<span style="position:absolute;left:{100 * p:.1f}%;transform:translateX(-50%);'
        f'white-space:nowrap">{escape(format_value(v))}</span>'
        for p, v in legend_ticks(legend)
    )
    unit = f" ({escape(legend.unit)})" if legend.unit else ""
    scale_note = " · log scale" if legend.scale.log else ""
    note = (
        f'<div style="font-size:0.75rem;color:#666">{escape(legend.note)}</div>'
        if legend.note
        else ""
    )
    return (
        f'<div class="geodbk-legend" style="max-width:{width_px}px;font-size:0.8rem;'
        f'margin:0.2rem 0 0.6rem 0">'
        f'<div style="font-weight:600;margin-bottom:2px">{escape(legend.title)}{unit}'
        f'<span style="font-weight:400;color:#666">{scale_note}</span></div>'
        f'<div style="height:12px;border-radius:2px;background:linear-gradient(to right, {stops})">'
        f"</div>"
        f'<div style="position:relative;height:1.1rem;margin:0 6px">{labels}</div>{note}</div>'
    )
