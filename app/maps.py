"""Map assembly shared by the tabs: raster layers from grids, overlays, click grids, legends."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pydeck as pdk
import streamlit as st
from numpy.typing import NDArray

from app import layers as L
from app import params as P
from app.colormaps import (
    CMAPS,
    ColorScale,
    Legend,
    auto_scale,
    colorize,
    diverging_ticks,
    format_value,
    mercator_rows,
    png_data_url,
    value_cmap,
)
from app.context import RunContext
from app.loaders import Z95, Grid, LoadError, Stamp, load_geojson, load_grid, load_trend, stamp
from app.points import prob_threshold
from app.quarters import attr_flag
from app.runs import UNITS, natural_to_log10, to_natural
from geodbk.geo.contract import QUANTITY_LABELS
from geodbk.noise_formula import noise_variance as formula_noise_variance

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

#: Layers of a trend grid (``geodbk predict --trend Q1:Q2``), offered when one exists.
TREND_LAYERS: dict[str, str] = {
    "trend_change": "Change per year (trend)",
    "trend_p": "P(improved) (trend)",
}

MAX_CLICK_POINTS = 2000

#: What a raster layer describes (the names of ``geodbk.quantities``; "average" is the tile
#: average of K tests, offered for grids without a tile effect).
QUANTITIES: dict[str, str] = {
    "tile": "What the tile here typically gets (tile)",
    "latent": "Neighbourhood level f(x) (area)",
    "single": "A single speed test (test)",
    "average": "Tile average of K speed tests",
}


@dataclass(frozen=True)
class LayerSpec:
    """Which quantity a raster shows (hashable, used as a cache key).

    ``quantity`` (a key of :data:`QUANTITIES`) and ``tests`` (K for ``"average"``) choose what
    the median, interval, sd and probability layers describe; see :func:`quantity_std`.
    """

    kind: str  # a key of LAYERS except "tiles", or "kernel"
    threshold: float = 0.0
    above: bool = True
    quantity: str = "tile"
    tests: float = 1.0


def has_tile_effect(grid: Grid) -> bool:
    """Whether ``geodbk predict`` used a tile effect for this grid (attribute ``tile_effect``)."""
    return attr_flag(grid.attrs, "tile_effect")


def quantities_of(grid: Grid) -> dict[str, str]:
    """The quantities a grid can show: "average" needs a grid without a tile effect; an area
    map that left out the tile parts (attribute ``tile_parts_omitted``) shows only the area."""
    if attr_flag(grid.attrs, "tile_parts_omitted"):
        return {"latent": QUANTITIES["latent"]}
    return {k: v for k, v in QUANTITIES.items() if k != "average" or not has_tile_effect(grid)}


def noise_variance(grid: Grid, tests: float) -> float | NDArray[np.float64] | None:
    """Observation-noise variance (log10 units²) of the tile average of ``tests`` speed tests,
    evaluated by the model's own formula (:func:`geodbk.noise_formula.noise_variance`) on the
    noise parameters ``geodbk predict`` writes into the grid's attributes (``noise_model``,
    ``noise_<name>``); each test is taken from its own device (devices = tests). A floor per
    urban/rural class needs the grid variable ``urban``, and the result is then an array of
    the grid's shape. ``None`` for grids written without these attributes.
    """
    a = grid.attrs
    params = {k.removeprefix("noise_"): v for k, v in a.items() if k.startswith("noise_")}
    params["noise"] = params.pop("model", None)
    is_urban = None
    if "s2_floor_urban" in params and "urban" in grid.arrays:
        is_urban = (np.nan_to_num(grid.arrays["urban"]) > 0.5).astype(np.float64)
    k = max(float(tests), 1.0)
    try:
        value = formula_noise_variance(params, tests=k, devices=k, is_urban=is_urban)
    except (KeyError, TypeError, ValueError):
        return None
    return value if isinstance(value, np.ndarray) else float(value)


def quantity_mean(grid: Grid, spec: LayerSpec) -> NDArray[np.float64]:
    """Mean (log10) of what ``spec.quantity`` asks for: ``area_mean`` for the area quantity,
    ``tile_mean`` for the tile and test quantities, ``mean`` for grids without them; a single
    test's is moved by the grid's ``test_mean_shift`` (the tile effect's, recorded by
    ``geodbk predict``; 0 when absent)."""
    name = "area_mean" if spec.quantity == "latent" else "tile_mean"
    out: NDArray[np.float64] = grid.arrays.get(name, grid.arrays["mean"])
    moved = float(grid.attrs.get("test_mean_shift", 0.0))
    if spec.quantity == "single" and name in grid.arrays and moved != 0.0:
        return out + moved
    return out


def quantity_std(grid: Grid, spec: LayerSpec) -> NDArray[np.float64] | None:
    """Predictive sd (log10) of what ``spec.quantity`` asks for, or ``None`` to use ``std``.

    ``latent``: ``std_f``. ``tile``: the grid's ``tile_sd`` (older grids: ``sqrt(std_f² +
    s2_floor)``, the tile quantity of a model without a tile effect). ``single``: ``test_sd``
    (older grids: ``sqrt(std_f² + s2(1))``). ``average``: ``sqrt(std_f² + s2(K))`` with
    K = ``spec.tests`` (:func:`noise_variance`; grids without a tile effect). ``None`` when the
    grid lacks what is needed (the stored ``std`` and intervals are shown).
    """
    stored = {"tile": "tile_sd", "single": "test_sd"}.get(spec.quantity)
    if stored is not None and stored in grid.arrays:
        return grid.arrays[stored]
    if "std_f" not in grid.arrays:
        return None
    std_f = grid.arrays["std_f"]
    if spec.quantity == "latent":
        return std_f
    k = {"tile": math.inf, "average": spec.tests}.get(spec.quantity, 1.0)
    s2 = noise_variance(grid, k)
    if s2 is None:
        return None
    out: NDArray[np.float64] = np.sqrt(std_f**2 + s2)
    return out


def quantity_label(grid: Grid, spec: LayerSpec) -> str:
    """Short description of what the layers show, for legends: the quantity's name first."""
    if spec.quantity == "latent":
        return QUANTITY_LABELS["area"]
    if spec.quantity == "tile":
        return QUANTITY_LABELS["tile"]
    if grid.attrs.get("noise_model") == "constant":
        return "test: one observation (constant-noise model)"
    if quantity_std(grid, spec) is None:
        return str(grid.attrs.get("quantity_description", grid.attrs.get("quantity", "")))
    if spec.quantity == "average" and spec.tests != 1:
        return f"test: tile average of {spec.tests:g} tests"
    return "test: single speed test"


def _share_basis_text(attrs: Mapping[str, Any], prefix: str, share: float) -> str:
    """``, chosen on N validation tiles in K blocks``; for a share of 1, the whole prior kept
    as those tiles could not certify less; above 1, widened as their levels stray more than
    the prior says; from the grid's ``PREFIX_place_share_tiles``/``_units``; empty when the
    grid does not record them."""
    tiles = attrs.get(f"{prefix}_place_share_tiles")
    units = attrs.get(f"{prefix}_place_share_units")
    if tiles is None or units is None:
        return ""
    n, k = int(tiles), int(units)
    where = f"{n} validation tile{'' if n == 1 else 's'}"
    if k < n:
        where += f" in {k} held-out block{'' if k == 1 else 's'}"
    if share == 1.0:
        return f": the whole prior, as {where} could not certify less (see the report)"
    if share > 1.0:
        return f": wider than the prior, as the levels of {where} stray more (see the report)"
    return f", chosen on {where}"


def _group_shares_text(attrs: Mapping[str, Any], prefix: str) -> str:
    """``; urban tiles 0.05, rural tiles 1.25, each chosen on its own validation tiles`` from
    the grid's ``PREFIX_place_share_urban``/``_rural``; empty when no group chose its own."""
    own = [
        f"{g} tiles {float(attrs[f'{prefix}_place_share_{g}']):.2f}"
        for g in ("urban", "rural")
        if f"{prefix}_place_share_{g}" in attrs
    ]
    if not own:
        return ""
    return (
        f"; {', '.join(own)}, {'each ' if len(own) > 1 else ''}chosen on its own validation tiles"
    )


def tile_model_caption(attrs: Mapping[str, Any] | None) -> str | None:
    """How a grid's tile quantity was made, from the parameters ``geodbk predict`` records
    (``tile_effect_*``, ``local_layer_*``), each with its unit (:mod:`app.params`): the
    offsets' spread tau² per class (log10²; the local layer's, refitted with its field, when it
    has one), the multiple lambda of the GP's variance, the
    offsets' correlation rho per quarter (the local layer's, refitted per class, when it has
    one), the place share of an unmeasured tile's prior and the local layer's range (km) and
    variance sigma² (log10²), in one or two sentences ending in a full stop. ``None`` for a
    grid made without a tile effect."""
    a = attrs or {}
    if not attr_flag(a, "tile_effect"):
        return None
    layer = attr_flag(a, "local_layer")
    # the local layer refits tau² with its field: the maps use its values (older grids: the
    # tile effect's)
    tau2 = (P.prefixed(a, "local_layer_tau2_") if layer else {}) or P.prefixed(
        a, "tile_effect_tau2_"
    )
    parts = [f"τ² {P.per_group(tau2, P.VARIANCE_UNIT)}"] if tau2 else []
    if "tile_effect_latent_scale" in a:
        parts.append(f"λ {P.with_unit(a['tile_effect_latent_scale'], P.LAMBDA_UNIT)}")
    layer_rho = P.prefixed(a, "local_layer_rho_") if layer else {}
    if "tile_effect_rho" in a and not layer_rho:
        parts.append(f"ρ {P.with_unit(a['tile_effect_rho'], P.RHO_UNIT)}")
    prefix = "local_layer" if layer else "tile_effect"
    share = a.get(f"{prefix}_place_share")
    if share is not None:
        parts.append(
            f"place share {float(share):.2f}"
            + _share_basis_text(a, prefix, float(share))
            + _group_shares_text(a, prefix)
        )
    inner = "; ".join(parts)
    text = "Tile quantity: tile effect" + (f" ({inner})" if inner else "")
    if layer and "local_layer_range_km" in a:
        spatial = [
            f"range {P.with_unit(a['local_layer_range_km'], P.RANGE_UNIT)}",
            f"σ² {P.with_unit(a.get('local_layer_sigma2', 0.0), P.VARIANCE_UNIT)}",
        ]
        if layer_rho:
            spatial.append(f"ρ {P.per_group(layer_rho, P.RHO_UNIT)}")
        text += " + local layer (" + "; ".join(spatial) + ")"
    if layer and a.get("local_layer_unseen_prior") == "gp":  # geodbk.local_layer.UNSEEN_GP
        text += (
            ". A tile nobody measured has the GP's own spread of a tile around f(x) at a "
            "typical row's tests (chosen on the validation tiles), not τ²"
        )
    return text + "."


def licence_caption(attrs: Mapping[str, Any] | None) -> str | None:
    """``Data: SOURCE. Licence: LICENSE (TERMS).`` from a grid's or report's recorded licence
    attributes (``source``, ``license``, ``license_terms`` or ``terms``); ``None`` without."""
    a = attrs or {}
    if not a.get("license"):
        return None
    terms = a.get("license_terms") or a.get("terms")
    return f"Data: {a.get('source', '')}. Licence: {a['license']}" + (
        f" ({terms})." if terms else "."
    )


def layer_values(grid: Grid, spec: LayerSpec) -> NDArray[np.float64]:
    """The 2-D array a raster layer shows, in natural units (probabilities in [0, 1])."""
    mean = quantity_mean(grid, spec)
    if spec.kind == "median":
        return to_natural(mean, grid.target)
    sd = quantity_std(grid, spec)
    if sd is not None and spec.kind in ("pi_width", "pi_lower", "pi_upper"):
        lower = to_natural(mean - Z95 * sd, grid.target)
        upper = to_natural(mean + Z95 * sd, grid.target)
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
        m, s = mean, (sd if sd is not None else grid.arrays["std"])
        # P(Y >= t) or P(Y <= t): the same formula as the pipelines' p_below/p_above grids.
        return prob_threshold(m, s, 10**t, spec.above)
    raise ValueError(f"unknown layer {spec.kind!r}")


def layer_legend(grid: Grid, spec: LayerSpec, scale: ColorScale) -> Legend:
    """Legend title, unit and note for a layer."""
    unit = UNITS[grid.target]
    t = grid.target
    what = quantity_label(grid, spec)
    if spec.kind == "median":
        return Legend(f"Predicted {t}, median ({what})", scale, unit)
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


#: Most values per grid used to choose a colour range shared by several quarters' grids.
SCALE_SAMPLE = 250_000


def _pooled(grids: Sequence[Grid], values: Callable[[Grid], NDArray[np.float64]]) -> NDArray:
    """Finite values of every grid (each thinned to at most :data:`SCALE_SAMPLE`), joined."""
    parts = []
    for g in grids:
        v = np.asarray(values(g), dtype=np.float64).ravel()
        v = v[np.isfinite(v)]
        parts.append(v[:: max(1, v.size // SCALE_SAMPLE)])
    return np.concatenate(parts) if parts else np.zeros(0)


def value_scale(
    grid: Grid, others: Sequence[Grid] = (), spec: LayerSpec | None = None
) -> ColorScale:
    """One colour scale for the lower and upper bounds of ``spec``'s quantity (default: the
    tile quantity), so the two maps compare directly."""
    grids = [grid, *others]
    base = spec or LayerSpec("pi_lower")
    lower = replace(base, kind="pi_lower")
    upper = replace(base, kind="pi_upper")
    both = np.concatenate(
        [
            _pooled(grids, lambda g: layer_values(g, lower)),
            _pooled(grids, lambda g: layer_values(g, upper)),
        ]
    )
    return auto_scale(both, value_cmap(grid.target), quantiles=(0.01, 0.99))


def layer_scale(grid: Grid, spec: LayerSpec, others: Sequence[Grid] = ()) -> ColorScale:
    """Colour scale for a layer: viridis for values, magma for uncertainty, YlGnBu for P.

    The median uses its own robust range and the two bounds share one, each of the quantity
    ``spec`` shows (a single test's interval is far wider than a tile's), so the bounds can be
    compared with each other. ``others`` (the grids of the other
    quarters) widen the range so that every quarter is drawn on one scale and the quarter
    slider shows change, not a re-stretched colour map.
    """
    grids = [grid, *others]
    if spec.kind == "median":
        values = _pooled(grids, lambda g: layer_values(g, spec))
        return auto_scale(values, value_cmap(grid.target), quantiles=(0.01, 0.99))
    if spec.kind in ("pi_lower", "pi_upper"):
        return value_scale(grid, others, spec)
    if spec.kind == "pi_width":
        return auto_scale(_pooled(grids, lambda g: layer_values(g, spec)), CMAPS["uncertainty"])
    if spec.kind == "std":
        values = _pooled(grids, lambda g: layer_values(g, spec))
        return auto_scale(values, CMAPS["uncertainty"], log=False)
    return auto_scale(np.array([0.0, 1.0]), CMAPS["probability"], limits=(0.0, 1.0))


def raster_url(values: NDArray[np.floating], lats: NDArray[np.floating], scale: ColorScale) -> str:
    """Colour a north-up lat/lon raster, resample rows to Web Mercator, encode as PNG."""
    rgba = colorize(values, scale)
    return png_data_url(rgba[mercator_rows(lats)])


@st.cache_data(show_spinner=False, max_entries=64)
def grid_layer_png(
    path: str,
    stamp_: Stamp,
    target: str,
    spec: LayerSpec,
    shared: tuple[tuple[str, Stamp], ...] = (),
    max_px: int = 0,
) -> tuple[str, ColorScale, Legend]:
    """PNG data URL, scale and legend of one layer of a grid (cached per grid and layer).

    ``shared``: ``(path, stamp)`` of every quarter grid of the target, for one colour range
    across quarters (:func:`layer_scale`); empty for a single grid. ``max_px``: cap the image
    at that many pixels a side (:func:`thin`; 0 = full resolution).
    """
    grid = load_grid(path, stamp_, target)
    others = [load_grid(p, s, target) for p, s in shared if p != path]
    scale = layer_scale(grid, spec, others)
    values, lats = thin(layer_values(grid, spec), grid.lat, max_px)
    return raster_url(values, lats, scale), scale, layer_legend(grid, spec, scale)


def thin(
    values: NDArray[np.float64], lats: NDArray[np.float64], max_px: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """At most ``max_px`` pixels a side (0: all): every s-th cell, s = ceil(max(ny, nx) /
    max_px), taken from the middle of each s x s block (for a quick first frame)."""
    if max_px <= 0 or max(values.shape) <= max_px:
        return values, lats
    step = math.ceil(max(values.shape) / max_px)
    mid = step // 2
    return values[mid::step, mid::step], lats[mid::step]


def shared_grids(paths: Sequence[Path]) -> tuple[tuple[str, Stamp], ...]:
    """The ``shared`` argument of :func:`grid_layer_png` for a target's quarter grids."""
    return tuple((str(p), stamp(p)) for p in paths) if len(paths) > 1 else ()


@st.cache_data(show_spinner=False, max_entries=8)
def click_points(
    path: str, stamp_: Stamp, target: str, spec: LayerSpec | None = None
) -> tuple[pd.DataFrame, float]:
    """A coarse set of in-region cell centres with a tooltip label, and their radius in metres.

    The label gives the median and 95% interval of the quantity ``spec`` shows (default: the
    grid's stored quantity), so the hover agrees with the map's colours.
    """
    grid = load_grid(path, stamp_, target)
    mask = grid.in_region
    n = int(mask.sum())
    stride = max(1, math.ceil(math.sqrt(n / MAX_CLICK_POINTS)))
    sub = mask[::stride, ::stride]
    rows, cols = np.nonzero(sub)
    lat = grid.lat[::stride][rows]
    lon = grid.lon[::stride][cols]
    unit = UNITS[target]
    med, lo, hi = (v[::stride, ::stride][rows, cols] for v in summary_values(grid, spec))
    # Short labels keep the deck JSON small (it is sent to the browser on every rerun).
    labels = [
        f"<b>{format_value(m)}</b> {unit} (95%: {format_value(a)}–{format_value(b)})"
        for m, a, b in zip(med, lo, hi, strict=True)
    ]
    dy = abs(float(grid.lat[0] - grid.lat[1])) * stride if grid.lat.size > 1 else 0.01
    radius = dy * 111_320 * 0.75
    frame = pd.DataFrame({"lon": np.round(lon, 5), "lat": np.round(lat, 5), "label": labels})
    return frame, radius


#: The layers :func:`summary_values` returns, in order.
LAYERS_OF_SUMMARY = ("median", "pi_lower", "pi_upper")


def summary_values(
    grid: Grid, spec: LayerSpec | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Median, lower and upper 95% bound (natural units) of the quantity ``spec`` shows;
    ``None``: the grid's stored ``mean``, ``pi_lower`` and ``pi_upper``."""
    if spec is None:
        return grid.natural("mean"), grid.natural("pi_lower"), grid.natural("pi_upper")
    med, lo, hi = (layer_values(grid, replace(spec, kind=k)) for k in LAYERS_OF_SUMMARY)
    return med, lo, hi


# --------------------------------------------------------------------------------------------
# Trend grids: change per year of the latent mean between two quarters


def trend_ratio(grid: Grid, name: str = "ratio_per_year") -> NDArray[np.float64]:
    """Multiplicative change per year (natural units): ``ratio_*`` if stored, else
    ``10**change_*`` (the change is in log10 units per year)."""
    if name in grid.arrays:
        return grid.arrays[name]
    change = name.replace("ratio_per_year", "change_per_year").replace("ratio_", "change_")
    out: NDArray[np.float64] = 10.0 ** grid.arrays[change]
    return out


def trend_values(grid: Grid, kind: str) -> NDArray[np.float64]:
    """What a trend layer shows: the ratio per year, or P(improved) in [0, 1]."""
    if kind == "trend_change":
        return trend_ratio(grid)
    if kind == "trend_p":
        return grid.arrays["p_improved"]
    raise ValueError(f"unknown trend layer {kind!r}")


def trend_scale(grid: Grid, kind: str) -> ColorScale:
    """Diverging colour scales centred on no change, blue = improved.

    ``trend_change``: log scale from ``1/R`` to ``R`` with ``log10 R`` the 98% quantile of
    ``|change_per_year|`` (so 1 = no change is the centre); reversed for latency, where a
    ratio below 1 is the improvement. ``trend_p``: 0 to 1, centred on 0.5 (cannot tell).
    """
    improved_high = grid.target != "latency"
    if kind == "trend_p":
        return ColorScale(CMAPS["change"], 0.0, 1.0, False)
    change = np.asarray(grid.arrays["change_per_year"], dtype=np.float64)
    finite = np.abs(change[np.isfinite(change) & grid.in_region])
    top = float(np.quantile(finite, 0.98)) if finite.size else 0.0
    top = max(top, 1e-3)  # at least x/÷ 1.0023 per year, so a flat trend still has a range
    cmap = CMAPS["change"] if improved_high else CMAPS["change"].removesuffix("_r")
    return ColorScale(cmap, 10.0**-top, 10.0**top, True)


def trend_legend(grid: Grid, kind: str, scale: ColorScale) -> Legend:
    """Legend of a trend layer: ratio per year in natural units, or P(improved)."""
    t = grid.target
    first = grid.attrs.get("first_quarter", "?")
    last = grid.attrs.get("last_quarter", "?")
    better = "lower latency" if t == "latency" else f"higher {t}"
    if kind == "trend_change":
        return Legend(
            f"Change per year of the latent mean {t}, {first} → {last}",
            scale,
            "× per year",
            note=f"1 = no change · blue = improved ({better}), red = worse · test noise excluded",
            tick_values=diverging_ticks(scale),
        )
    return Legend(
        f"P(improved): P({better} in {last} than in {first}), latent mean",
        scale,
        "",
        note="0.5 = cannot tell · blue = likely improved, red = likely worse",
        tick_values=(0.0, 0.25, 0.5, 0.75, 1.0),
    )


def trend_caption(
    attrs: Mapping[str, Any] | None,
    target: str,
    kind: str,
    *,
    first: str = "?",
    last: str = "?",
    years: float | None = None,
) -> str:
    """What a trend layer shows, from the trend grid's attributes (``geodbk predict --trend``):
    the quantity (``quantity``), the quarters it spans (``first_quarter``, ``last_quarter``,
    ``years``; ``first``, ``last`` and ``years`` when the grid does not record them) and, for
    the change, its units: a factor per year (``ratio_per_year``), also stored in the grid's
    log10 ``units`` per year (``change_per_year``). Nothing is computed here."""
    a = attrs or {}
    first = str(a.get("first_quarter") or first)
    last = str(a.get("last_quarter") or last)
    span = P.as_number(a.get("years", years))
    apart = (
        f" ({P.format_number(span)} year{'' if span == 1 else 's'})" if math.isfinite(span) else ""
    )
    quantity = str(a.get("quantity") or "latent mean f(x) (noise excluded)")
    if kind == "trend_change":
        log_units = str(a.get("units") or "").partition(" (")[0].strip()
        stored = f"; change_per_year holds it in {log_units}" if log_units else ""
        what = (
            f"Change per year of {target}'s {quantity} from {first} to {last}{apart}, as a "
            "factor per year: ×1.10 = up 10% a year, ×0.90 = down 10%, ×1 = no change "
            f"(ratio_per_year{stored})."
        )
    else:
        better = "lower" if target == "latency" else "higher"
        what = (
            f"P(improved): the probability that {target}'s {quantity} is {better} in {last} "
            f"than in {first}{apart}, from the joint posterior of the two quarters; 0.5 = "
            "cannot tell."
        )
    return (
        f"{what} This is the trend of the typical {target}, not of single tests. Hover for "
        "values; click a cell to inspect it."
    )


@st.cache_data(show_spinner=False, max_entries=16)
def trend_layer_png(
    path: str, stamp_: Stamp, target: str, kind: str, max_px: int = 0
) -> tuple[str, ColorScale, Legend]:
    """PNG data URL, scale and legend of a trend layer (cached per file and layer)."""
    grid = load_trend(path, stamp_, target)
    scale = trend_scale(grid, kind)
    values, lats = thin(
        np.where(grid.in_region, trend_values(grid, kind), np.nan), grid.lat, max_px
    )
    return raster_url(values, lats, scale), scale, trend_legend(grid, kind, scale)


def trend_summary(grid: Grid, row: int, col: int) -> str:
    """``×1.12 per year (95%: ×1.01–×1.25), P(improved) 0.97`` for one cell."""
    ratio = trend_ratio(grid)[row, col]
    text = f"×{format_value(ratio)} per year"
    bounds = (("ratio_lower", "change_lower"), ("ratio_upper", "change_upper"))
    if all(any(name in grid.arrays for name in pair) for pair in bounds):
        lo = trend_ratio(grid, "ratio_lower")[row, col]
        hi = trend_ratio(grid, "ratio_upper")[row, col]
        text += f" (95%: ×{format_value(lo)}–×{format_value(hi)})"
    return text + f", P(improved) {format_value(grid.arrays['p_improved'][row, col])}"


@st.cache_data(show_spinner=False, max_entries=8)
def trend_click_points(path: str, stamp_: Stamp, target: str) -> tuple[pd.DataFrame, float]:
    """Click targets of a trend grid, labelled with the change per year and P(improved)."""
    grid = load_trend(path, stamp_, target)
    rows, cols, radius = _pick_cells(grid)
    labels = [f"<b>{trend_summary(grid, r, c)}</b>" for r, c in zip(rows, cols, strict=True)]
    frame = pd.DataFrame(
        {"lon": np.round(grid.lon[cols], 5), "lat": np.round(grid.lat[rows], 5), "label": labels}
    )
    return frame, radius


def _pick_cells(grid: Grid) -> tuple[NDArray[np.intp], NDArray[np.intp], float]:
    """Rows and columns of at most :data:`MAX_CLICK_POINTS` in-region cells (a regular
    stride) and the radius in metres that makes their circles tile the region."""
    mask = grid.in_region
    n = int(mask.sum())
    stride = max(1, math.ceil(math.sqrt(n / MAX_CLICK_POINTS)))
    sub_rows, sub_cols = np.nonzero(mask[::stride, ::stride])
    dy = abs(float(grid.lat[0] - grid.lat[1])) * stride if grid.lat.size > 1 else 0.01
    return sub_rows * stride, sub_cols * stride, dy * 111_320 * 0.75


def _optional(read: Callable[[], dict[str, Any] | None], what: str) -> dict[str, Any] | None:
    """Read an overlay; a bad file is a warning (the map still draws), not an error."""
    try:
        return read()
    except LoadError as exc:
        st.warning(f"The {what} overlay is left out: {exc}")
        return None


@st.cache_data(show_spinner=False, max_entries=16)
def _paths(path: str, stamp_: Stamp) -> list[L.Path]:
    """Outline paths of a GeoJSON file (cached per file version)."""

    return L.outline_paths(load_geojson(path, stamp_))


def overlay_layers(ctx: RunContext) -> list[pdk.Layer]:
    """Region boundary and urban outlines, as toggled in the sidebar, in one ``PathLayer``."""
    groups: list[tuple[list[L.Path], tuple[int, ...], float]] = []
    if ctx.show_urban and _optional(ctx.urban_areas, "urban-area") is not None:
        urban = _paths(str(ctx.inv.urban_areas), stamp(ctx.inv.urban_areas))
        # A white halo under a dark line reads on any colour map.
        groups += [(urban, (255, 255, 255, 220), 3.0), (urban, (30, 30, 30, 255), 1.2)]
    if ctx.show_region and _optional(ctx.region, "region-boundary") is not None:
        groups.append((_paths(str(ctx.inv.region), stamp(ctx.inv.region)), (40, 40, 40, 255), 1.6))
    return [L.outlines_layer(groups)] if groups else []


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
