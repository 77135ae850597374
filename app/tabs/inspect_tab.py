"""Inspect a point: the predictive distribution at a location and the nearest observed tiles."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from app import layers as L
from app import maps
from app.colormaps import format_lonlat, format_value
from app.context import RunContext
from app.kernel import RefPoint
from app.loaders import Z95, Grid, LoadError, scale_lonlat, stamp
from app.points import PointSummary, lognormal_pdf, nearest_tiles, point_from_selection
from app.quarters import is_quarter, with_time
from app.runs import RAW_TO_NATURAL, UNITS
from app.tabs.kernel_tab import choose_time
from app.tabs.map_tab import POINT_KEY
from app.ui import MAP_QUANTITY_KEY, MAP_TESTS_KEY, missing, quarter_slider
from geodbk.geo.contract import QUANTITY_LABELS
from geodbk.geo.longitude import native_longitude, wrap_near

SOURCE_KEY = "inspect_source"
CLICKED = "Clicked point"
#: The headline's name when it is the GP at the exact point (no grid cell to show).
MODEL_HEADING = "test: one speed test (the GP alone at this exact point, no tile offset)"
TYPED = "Coordinates"


#: Height (px) of the predictive-density chart, title and axis included: at 180 the curve had
#: about 60 px beside the metrics and the map.
DENSITY_HEIGHT = 240


def _on_click() -> None:
    point = point_from_selection(st.session_state.get("inspect_chart"), L.CLICKABLE_LAYERS)
    if point is not None:
        st.session_state[POINT_KEY] = point
        st.session_state[SOURCE_KEY] = CLICKED


def point_class(
    ctx: RunContext, lon: float, lat: float, tiles: pd.DataFrame | None
) -> tuple[bool | None, str]:
    """``(is_urban, label)`` of a point: inside an urban-area polygon, else the nearest tile's
    label; ``(None, "unknown")`` without either."""
    try:
        urban = ctx.urban_areas()
    except LoadError:
        urban = None  # the map's overlay warning already names the bad file
    if urban is not None and urban.get("features"):
        import shapely
        from shapely.geometry import shape

        pt = shapely.Point(lon, lat)
        for feat in urban["features"]:
            geom = feat.get("geometry")
            if geom and shape(geom).covers(pt):
                return True, "urban (inside an urban area)"
        return False, "rural (outside every urban area)"
    if tiles is not None and not tiles.empty:
        near = nearest_tiles(tiles, lon, lat, k=1)
        is_urban = bool(near["urban"].iloc[0])
        return is_urban, ("urban" if is_urban else "rural") + " (label of the nearest tile)"
    return None, "unknown"


def _choose_point(ctx: RunContext, presets: list[RefPoint]) -> tuple[float, float] | None:
    options = [CLICKED, *[f"{p.name} (preset)" for p in presets], TYPED]
    if st.session_state.get(SOURCE_KEY) not in options:
        st.session_state[SOURCE_KEY] = (
            CLICKED if POINT_KEY in st.session_state else options[1 if presets else -1]
        )
    c1, c2, c3 = st.columns([2, 1, 1])
    source = c1.selectbox("Location", options, key=SOURCE_KEY)
    if source == CLICKED:
        point = st.session_state.get(POINT_KEY)
        if point is None:
            st.info("Click the map below (or on the Map tab) to choose a location.")
        return point
    if source == TYPED:
        grid = ctx.grid() if ctx.files.has_grid else None
        lon0, lat0 = (
            (float(np.mean(grid.lon)), float(np.mean(grid.lat))) if grid is not None else (0.0, 0.0)
        )
        lon0 = float(native_longitude(lon0))  # a grid across the 180° meridian runs past 180
        lon = c2.number_input("Longitude", -180.0, 180.0, lon0, format="%.4f", key="inspect_lon")
        lat = c3.number_input("Latitude", -85.0, 85.0, lat0, format="%.4f", key="inspect_lat")
        if grid is not None:  # into the grid's turn of longitude
            lon = float(wrap_near(lon, centre=0.5 * float(grid.lon[0] + grid.lon[-1])))
        return float(lon), float(lat)
    preset = presets[[f"{p.name} (preset)" for p in presets].index(source)]
    return preset.lon, preset.lat


def render(ctx: RunContext) -> None:
    """Render the point-inspection tab."""
    t = ctx.target
    unit = UNITS[t]
    if not ctx.files.has_grid and not ctx.files.has_model:
        missing(f"This run has no {t} model or grid to inspect.", ctx.cmd("train"))
        return
    tiles = ctx.tiles().frame if ctx.inv.has_tiles else None
    presets = ctx.presets() if ctx.inv.has_tiles else []
    point = _choose_point(ctx, presets)
    quarter, t_in = _choose_quarter(ctx)
    grid_path = _grid_of(ctx, quarter)
    left, right = st.columns([1.1, 1])
    with left:
        _map(ctx, point, grid_path, quarter)
    with right:
        if point is None:
            return
        lon, lat = point
        when = f" in {quarter}" if quarter else ""
        st.subheader(f"{t.capitalize()} at {format_lonlat(lon, lat)}{when}")
        is_urban, area = point_class(ctx, lon, lat, tiles)
        at_point = _model_at_point(ctx, lon, lat, t_in=t_in, quarter=quarter, urban=is_urban)
        # the grid's cell only when the grid is the chosen quarter's (else: the model there)
        cell_grid = grid_path if _grid_is_of(ctx, grid_path, quarter) else None
        cell = map_quantity_at(ctx, lon, lat, cell_grid, _map_spec())
        when = f" of {quarter}" if quarter else ""
        summary: PointSummary | None = None
        heading, how = "", ""
        if cell is not None:  # what the Map tab shows, at this cell
            summary, heading = cell
            how = f"From the grid cell{when}, as the Map tab shows it."
            if at_point is not None:
                how += " " + how_at_point(at_point[0], unit)
        elif at_point is not None:
            (summary, how), heading = at_point, MODEL_HEADING
        elif cell_grid is not None:  # a grid without the quantities: its stored prediction
            summary = _stored_at(ctx, lon, lat, cell_grid)
            heading, how = "the grid cell's stored prediction", f"From the grid cell{when}."
        if summary is None:
            st.warning("No prediction available at this point (outside the grid and no model).")
        else:
            st.markdown(f"**{heading}**")
            m1, m2, m3 = st.columns([1, 1.7, 1])
            m1.metric(f"Median ({unit})", format_value(summary.median))
            m2.metric(
                f"95% interval ({unit})",
                f"{format_value(summary.lower)}–{format_value(summary.upper)}",
            )
            m3.metric(
                f"sd ({unit})",
                format_value(summary.sd),
                help=f"Log-normal sd in {unit}; on the log10 scale sd = {summary.sd_log10:.3f} "
                f"(×/÷ {10**summary.sd_log10:.2f}).",
            )
            st.caption(
                f"{heading[:1].upper()}{heading[1:]}: log-normal mean "
                f"{format_value(summary.mean, unit)}; sd of log10 = {summary.sd_log10:.3f}. {how}"
            )
            st.altair_chart(_density_chart(summary, unit), width="stretch")
        parts = quantity_parts(ctx, lon, lat, cell_grid)
        if parts is not None and cell_grid is not None:
            st.markdown("**What this place gets** (grid cell; 95% intervals)")
            st.dataframe(parts, hide_index=True, width="stretch")
            st.caption(parts_caption(ctx.grid(cell_grid)))
        region_note = _region_note(ctx, lon, lat)
        st.markdown(f"**Area:** {area}{region_note}")
        if tiles is not None and f"value_{t}" in tiles.columns:
            near = nearest_tiles(tiles, lon, lat, k=6)
            table = pd.DataFrame(
                {
                    "distance (km)": near["distance_km"].round(2),
                    "quarter": near["quarter"],
                    f"observed ({unit})": near[f"value_{t}"].round(2),
                    "tests": near["tests"],
                    "devices": near["devices"] if "devices" in near else np.nan,
                    "area": np.where(near["urban"], "urban", "rural"),
                }
            )
            st.markdown("**Nearest observed tiles**")
            st.dataframe(table, hide_index=True, width="stretch")


def parts_caption(grid: Grid) -> str:
    """What the rows of :func:`quantity_parts` mean; for a grid made without a tile effect the
    tile is f(x) plus the model's noise floor, with no offset of its own."""
    tile = (
        "tile: what the zoom-16 tile here typically gets (f plus the tile's own offset: its "
        "measured history, and the pull of its measured neighbours)"
        if maps.has_tile_effect(grid)
        else f"tile: f plus the model's noise floor (no tile effect was fitted for "
        f"{grid.target}, so a tile has no offset of its own, measured or not)"
    )
    return (
        f"area: the neighbourhood level f(x); {tile}; test: one speed test here (the tile, "
        "moved by what a single test's average gets, plus one test's noise)."
    )


def _map_spec() -> maps.LayerSpec:
    """The quantity the Map tab's "What the map shows" has chosen (the tile quantity until it
    has been opened)."""
    quantity = str(st.session_state.get(MAP_QUANTITY_KEY, "tile"))
    tests = float(st.session_state.get(MAP_TESTS_KEY, 1.0) or 1.0) if quantity == "average" else 1.0
    return maps.LayerSpec(kind="median", quantity=quantity, tests=tests)


def map_quantity_at(
    ctx: RunContext, lon: float, lat: float, grid_path: Path | None, spec: maps.LayerSpec
) -> tuple[PointSummary, str] | None:
    """The grid cell's distribution of the quantity ``spec`` names and its label (``None``
    without a grid, outside it, or for a grid without that quantity's variables)."""
    if grid_path is None:
        return None
    grid = ctx.grid(grid_path)
    needed = "area_mean" if spec.quantity == "latent" else "tile_mean"
    cell = grid.cell_of(lon, lat)
    sd = maps.quantity_std(grid, spec)
    if cell is None or needed not in grid.arrays or sd is None:
        return None
    mean = float(maps.quantity_mean(grid, spec)[cell])
    if not (np.isfinite(mean) and np.isfinite(sd[cell])):
        return None
    shift = np.log10(RAW_TO_NATURAL[ctx.target])
    label = maps.quantity_label(grid, spec)
    return PointSummary.from_log10(mean - shift, float(sd[cell])), label


def how_at_point(summary: PointSummary, unit: str = "") -> str:
    """One sentence on the GP alone at the exact point, beside a grid cell's quantity, with
    its values in ``unit``."""
    return (
        f"The GP alone at this exact point (one speed test, no tile offset): median "
        f"{format_value(summary.median, unit)}, 95% interval {format_value(summary.lower)}–"
        f"{format_value(summary.upper, unit)}."
    )


def quantity_parts(
    ctx: RunContext, lon: float, lat: float, grid_path: Path | None
) -> pd.DataFrame | None:
    """The grid cell's area, tile and test quantities and the tile's offset and neighbours'
    pull, in natural units (``None`` for grids written without these variables)."""
    if grid_path is None:
        return None
    grid = ctx.grid(grid_path)
    needed = ("area_mean", "std_f", "tile_mean", "tile_sd", "test_sd", "tile_offset")
    if any(n not in grid.arrays for n in needed):
        return None
    cell = grid.cell_of(lon, lat)
    if cell is None or not np.isfinite(grid.arrays["tile_mean"][cell]):
        return None
    shift = np.log10(RAW_TO_NATURAL[ctx.target])
    value = {
        n: float(grid.arrays[n][cell])
        for n in (*needed, "tile_pull", "tile_history")
        if n in grid.arrays
    }
    one_test = float(maps.quantity_mean(grid, maps.LayerSpec("median", quantity="single"))[cell])
    rows = []
    for name, mean, sd in (
        ("area: neighbourhood level f(x)", value["area_mean"], value["std_f"]),
        (QUANTITY_LABELS["tile"], value["tile_mean"], value["tile_sd"]),
        ("test: one speed test", one_test, value["test_sd"]),
    ):
        s = PointSummary.from_log10(mean - shift, sd)
        rows.append(
            {
                "quantity": name,
                "median": format_value(s.median),
                "95% interval": f"{format_value(s.lower)}–{format_value(s.upper)}",
            }
        )
    effect = maps.has_tile_effect(grid)  # without one, no tile has an offset or a pull
    history = "measured history" if value.get("tile_history", 0.0) > 0.5 else "no history"
    if effect:
        rows.append(
            {
                "quantity": f"tile's offset ({history})",
                "median": f"×{10 ** value['tile_offset']:.2f}",
                "95% interval": "",
            }
        )
    if effect and "tile_pull" in value:
        rows.append(
            {
                "quantity": "of which its neighbours' pull",
                "median": f"×{10 ** value['tile_pull']:.2f}",
                "95% interval": "",
            }
        )
    # one test around the tile: its tests' shift and its noise, sd² = test_sd² - tile_sd²
    noise_sd = math.sqrt(max(value["test_sd"] ** 2 - value["tile_sd"] ** 2, 0.0))
    rows.append(
        {
            "quantity": "one test's noise (its shift; 95% spread)",
            "median": f"×{10 ** (one_test - value['tile_mean']):.2f}",
            "95% interval": f"×/÷ {10 ** (Z95 * noise_sd):.2f}",
        }
    )
    return pd.DataFrame(rows)


def _choose_quarter(ctx: RunContext) -> tuple[str | None, float | None]:
    """The quarter to inspect: the model's slider for a time-aware model, else the Map tab's
    quarter grid (when there are several), else None."""
    if ctx.files.has_model and ctx.time_aware():
        return choose_time(ctx, "inspect")
    if ctx.files.quarter_grid_paths():
        qgrids = [g for g in ctx.quarter_grids() if is_quarter(g.quarter)]
        if len(qgrids) > 1:
            current = next((g.quarter for g in qgrids if g.current), qgrids[-1].quarter)
            labels = {g.quarter: g.label for g in qgrids}
            return quarter_slider(
                ctx.target, list(labels), where="inspect", default=current, labels=labels
            ), None
    return None, None


def _grid_of(ctx: RunContext, quarter: str | None) -> Path | None:
    """The grid file of ``quarter`` (``grids/TARGET.nc`` when it is that quarter's, or the
    quarter has no grid), or None without any grid."""
    if quarter is not None and ctx.files.quarter_grid_paths():
        for g in ctx.quarter_grids():
            if g.quarter == quarter:
                return g.path
    return ctx.files.grid if ctx.files.has_grid else None


def _grid_is_of(ctx: RunContext, grid_path: Path | None, quarter: str | None) -> bool:
    """Whether ``grid_path`` maps ``quarter`` (always, for no quarter or a grid that records
    none): :func:`_grid_of` falls back to ``grids/TARGET.nc`` for a quarter without a grid."""
    if grid_path is None or quarter is None:
        return grid_path is not None
    shown = ctx.grid(grid_path).attrs.get("quarter")
    return not (shown and is_quarter(str(shown)) and str(shown) != quarter)


def _region_note(ctx: RunContext, lon: float, lat: float) -> str:
    if not ctx.files.has_grid:
        return ""
    grid = ctx.grid()
    cell = grid.cell_of(lon, lat)
    if cell is None or not grid.in_region[cell]:
        return " · outside the modelled region: the prediction is an extrapolation"
    return ""


def _model_at_point(
    ctx: RunContext,
    lon: float,
    lat: float,
    *,
    t_in: float | None = None,
    quarter: str | None = None,
    urban: bool | None = None,
) -> tuple[PointSummary, str] | None:
    """The GP evaluated at the point, inputs ``[x1, x2]`` or ``[x1, x2, t]`` for a time-aware
    model at the chosen quarter: one speed test (a model with a noise floor per urban/rural
    class: that of the point's class ``urban``), and a sentence saying so; ``None`` without a
    model or when it cannot be evaluated (with a warning)."""
    if not ctx.files.has_model:
        return None
    try:
        model = ctx.model()
        X = scale_lonlat(np.array([lon]), np.array([lat]), ctx.scaling())
        kw = {"urban": urban} if getattr(model, "noise_urban", False) else {}
        pred: Any = model.predict_dist(with_time(X, t_in), **kw)
    except Exception as exc:
        st.warning(f"The model could not be evaluated here ({exc}); showing the grid cell.")
        return None
    m = float(np.asarray(pred.mean)[0]) - np.log10(RAW_TO_NATURAL[ctx.target])
    how = "Model evaluated at this exact point"
    how += f" for {quarter} (t = {t_in:.2f})." if t_in is not None else "."
    return PointSummary.from_log10(m, float(np.asarray(pred.std)[0])), how


def _stored_at(ctx: RunContext, lon: float, lat: float, grid_path: Path) -> PointSummary | None:
    """The grid cell's stored ``mean`` and ``std`` (``None`` outside the grid or region)."""
    grid = ctx.grid(grid_path)
    cell = grid.cell_of(lon, lat)
    if cell is None or not np.isfinite(grid.arrays["mean"][cell]):
        return None
    m = float(grid.arrays["mean"][cell]) - np.log10(RAW_TO_NATURAL[ctx.target])
    return PointSummary.from_log10(m, float(grid.arrays["std"][cell]))


def _density_chart(s: PointSummary, unit: str) -> alt.Chart:
    lo = max(s.lower / 2.5, 1e-6)
    hi = s.upper * 2.5
    x = np.geomspace(lo, hi, 300)
    # Density per log10 unit (so the log-x axis shows a bell): pdf(x) * x * ln 10.
    dens = lognormal_pdf(x, s.mean_log10, s.sd_log10) * x * np.log(10.0)
    frame = pd.DataFrame({"x": x, "density": dens, "inside": (x >= s.lower) & (x <= s.upper)})
    base = alt.Chart(frame).encode(
        x=alt.X("x:Q", scale=alt.Scale(type="log", nice=False), title=f"{unit} (log scale)"),
    )
    area = (
        base.mark_area(opacity=0.35, color="#3b528b")
        .encode(
            y=alt.Y("density:Q", title="density", axis=alt.Axis(labels=False, ticks=False)),
        )
        .transform_filter("datum.inside")
    )
    line = base.mark_line(color="#21918c").encode(y="density:Q")
    rules = (
        alt.Chart(pd.DataFrame({"x": [s.lower, s.median, s.upper]}))
        .mark_rule(color="#444", strokeDash=[4, 3])
        .encode(x="x:Q")
    )
    return (area + line + rules).properties(
        height=DENSITY_HEIGHT, title="Predictive distribution (shaded: 95% interval)"
    )


def _map(
    ctx: RunContext,
    point: tuple[float, float] | None,
    grid_path: Path | None,
    quarter: str | None,
) -> None:
    if grid_path is None:
        st.info("No grid to draw; choose a preset or type coordinates.")
        return
    grid = ctx.grid(grid_path)
    gstamp = stamp(grid_path)
    shared = maps.shared_grids([g.path for g in ctx.quarter_grids()])
    spec = _map_spec()  # the Map tab's quantity, in its colours
    url, _scale, _legend = maps.grid_layer_png(str(grid_path), gstamp, ctx.target, spec, shared)
    pick, radius = maps.click_points(str(grid_path), gstamp, ctx.target, spec)
    layer_list = [L.bitmap_layer(url, grid.bounds), L.click_grid_layer(pick, radius)]
    layer_list += maps.overlay_layers(ctx)
    if point is not None:
        marker = pd.DataFrame(
            {"lon": [point[0]], "lat": [point[1]], "label": ["inspected point"], "name": [""]}
        )
        layer_list += L.markers_layer(marker)[:1]
    st.pydeck_chart(
        L.deck(layer_list, grid.bounds, width_px=470, height_px=460),
        height=460,
        on_select=_on_click,
        selection_mode="single-object",
        key="inspect_chart",
    )
    shown = grid.attrs.get("quarter")
    when = f" of {shown}" if shown and is_quarter(str(shown)) else ""
    if quarter and shown and str(shown) != quarter and is_quarter(str(shown)):
        when += f" (no grid for {quarter}: `{ctx.cmd('predict')} --quarter {quarter}`)"
    what = maps.quantity_label(grid, spec)
    st.caption(
        f"Predicted median{when}, {what} (same colours as the Map tab). Click a cell to inspect it."
    )
