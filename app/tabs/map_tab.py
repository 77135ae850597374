"""Map tab: predicted median, interval width, sd, bounds, threshold probability, observed tiles,
a quarter slider over per-quarter grids and the trend layers of time-aware models.

A page load draws the map progressively (:func:`first_paint`): the first script run of a session
sends the raster alone (one BitmapLayer, at most :data:`FIRST_PAINT_PX` pixels a side), which
the browser draws quickly; :func:`finish_first_paint` then reruns the page and the full map
(click targets, outlines, full resolution) replaces it in the same chart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import pydeck as pdk
import streamlit as st

from app import layers as L
from app import maps
from app.colormaps import (
    Legend,
    auto_scale,
    colors_for,
    format_lonlat,
    format_value,
    legend_html,
    value_cmap,
)
from app.context import RunContext
from app.held_out_check import held_out_check_caption, threshold_check_caption
from app.loaders import Grid, LoadError, load_metrics, stamp
from app.points import point_from_selection
from app.quarters import QuarterGrid, TrendFile, describe_quarter, model_quarters
from app.runs import UNITS
from app.ui import (
    MAP_QUANTITY_KEY,
    MAP_TESTS_KEY,
    missing,
    quarter_slider,
    selected_quarter_key,
)
from geodbk.geo.contract import DEFAULT_THRESHOLDS
from geodbk.geo.timeaxis import extrapolation_of

MAP_HEIGHT = 520
#: Most tiles drawn as polygons at once (a quarter of a state is usually far fewer).
MAX_TILES = 20_000
POINT_KEY = "inspect_point"
#: Session keys of the progressive first paint (see :func:`first_paint`).
REFINED_KEY = "_geodbk_refined"
LIGHT_KEY = "_geodbk_light_map"
#: Largest side (pixels) of the quick first frame's raster.
FIRST_PAINT_PX = 512


def _on_click(chart_key: str) -> None:
    """Store a clicked location as the point to inspect."""
    state = st.session_state.get(chart_key)
    point = point_from_selection(state, L.CLICKABLE_LAYERS)
    if point is not None:
        st.session_state[POINT_KEY] = point
        st.session_state["inspect_source"] = "Clicked point"


def render(ctx: RunContext) -> None:
    """Render the map tab."""
    t = ctx.target
    unit = UNITS[t]
    trends = ctx.files.trend_files()
    names = {k: v for k, v in maps.LAYERS.items() if k != "tiles"}
    if trends:
        names |= maps.TREND_LAYERS
    names["tiles"] = maps.LAYERS["tiles"]
    c1, c2, c3 = st.columns([2.2, 1.4, 1.4])
    kind = c1.selectbox(
        "Layer",
        list(names),
        format_func=names.__getitem__,
        key="layer",
        bind="query-params",
    )
    if kind in maps.TREND_LAYERS:
        _render_trend(ctx, kind, trends, c2)
        return
    quantity, tests = _quantity_controls(ctx, kind)
    spec = maps.LayerSpec(kind, quantity=quantity, tests=tests)
    if kind == "prob":
        default = DEFAULT_THRESHOLDS[t][0]
        thr = c2.number_input(
            f"Threshold ({unit})",
            min_value=0.01,
            max_value=100_000.0,
            value=default,
            step=1.0 if unit == "Mbps" else 5.0,
            key=f"threshold_{t}",
        )
        better = "at least" if t != "latency" else "at most"
        worse = "below" if t != "latency" else "above"
        direction = c3.radio(
            "Probability that the service is",
            [better, worse],
            horizontal=True,
            key=f"direction_{t}",
            help="Computed per cell from the predictive mean and sd (Gaussian in log10).",
        )
        above = (direction == "at least") or (direction == "above")
        spec = maps.LayerSpec("prob", float(thr), above, quantity=quantity, tests=tests)

    if kind == "tiles":
        _render_tiles(ctx, c2)
        return
    qgrids = ctx.quarter_grids()
    if not qgrids:
        missing(f"This run has no predictive grid for {t}.", ctx.cmd("predict"))
        return
    chosen = _choose_grid(ctx, qgrids)
    path = chosen.path
    grid = ctx.grid(path)
    gstamp = stamp(path)
    shared = maps.shared_grids([g.path for g in qgrids])
    light = first_paint()
    url, _scale, legend = maps.grid_layer_png(
        str(path), gstamp, t, spec, shared, FIRST_PAINT_PX if light else 0
    )

    def extras() -> list[pdk.Layer]:
        pick, radius = maps.click_points(str(path), gstamp, t, spec)
        return [L.click_grid_layer(pick, radius), *maps.overlay_layers(ctx), *_point_marker()]

    st.markdown(legend_html(legend), unsafe_allow_html=True)
    _draw(url, grid.bounds, extras, light, basemap=ctx.basemap)
    _caption(ctx, kind, chosen, len(qgrids), spec.quantity)
    made = maps.tile_model_caption(grid.attrs)
    if made and spec.quantity != "latent":
        st.caption(made)
    for checked in _held_out_checks(ctx, grid, spec):
        st.caption(checked)
    licence = maps.licence_caption(grid.attrs)
    if licence:
        st.caption(licence)
    _clicked_summary(ctx, grid, spec)


def _held_out_checks(ctx: RunContext, grid: Grid, spec: maps.LayerSpec) -> list[str]:
    """The report's checks of a tile map against held-out tiles, when the run has a report of
    the same training: the map's coverage (:func:`app.held_out_check.held_out_check_caption`)
    and, on the tile quantity's probability layer, its threshold's
    (:func:`app.held_out_check.threshold_check_caption`)."""
    if not ctx.files.has_report:
        return []
    metrics, summary = (_report_json(ctx, name) for name in ("metrics.json", "summary.json"))
    captions = [held_out_check_caption(metrics, summary, grid.attrs)]
    if spec.kind == "prob" and spec.quantity == "tile":
        captions.append(threshold_check_caption(metrics, summary, grid.attrs, spec.threshold))
    return [c for c in captions if c]


def _report_json(ctx: RunContext, name: str) -> dict | None:
    """The target's report file ``name`` as a dict; ``None`` when absent or unreadable."""
    path = ctx.files.report_dir / name
    try:
        data = load_metrics(str(path), stamp(path)) if path.is_file() else None
    except LoadError:
        return None
    return data if isinstance(data, dict) else None


def refine_delay() -> float:
    """Seconds between the quick first frame and the full map (``GEODBK_APP_REFINE_S``,
    default 2; 0 turns the progressive first paint off)."""
    try:
        return max(0.0, float(os.environ.get("GEODBK_APP_REFINE_S", "2.0")))
    except ValueError:
        return 2.0


def first_paint() -> bool:
    """Whether this run draws the quick first frame: the raster alone, at most
    :data:`FIRST_PAINT_PX` pixels a side.

    True only on a session's first script run (a page load) with the progressive first paint
    on; it marks the run so that :func:`finish_first_paint` reruns the page with the full map
    (click targets, outlines, full resolution) shortly after.
    """
    if st.session_state.get(REFINED_KEY) or refine_delay() <= 0:
        return False
    st.session_state[LIGHT_KEY] = True
    return True


def finish_first_paint() -> bool:
    """Called once the page is drawn: after a quick first frame wait :func:`refine_delay`
    (the browser draws it meanwhile) and rerun for the full map. Returns False otherwise."""
    st.session_state[REFINED_KEY] = True
    if not st.session_state.pop(LIGHT_KEY, False):
        return False
    time.sleep(refine_delay())
    st.rerun()
    return True  # not reached: st.rerun raises


def _draw(
    url: str,
    bounds: L.Bounds,
    extras: Callable[[], list[pdk.Layer]],
    light: bool,
    *,
    basemap: str | None = None,
) -> None:
    """The map: the raster, plus (unless ``light``) click targets, outlines and the marker,
    over the base map style ``basemap`` (``None``: none)."""
    layer_list = [L.bitmap_layer(url, bounds), *([] if light else extras())]
    st.pydeck_chart(
        L.deck(layer_list, bounds, height_px=MAP_HEIGHT, basemap=basemap),
        height=MAP_HEIGHT,
        on_select=lambda: _on_click("map_chart"),
        selection_mode="single-object",
        key="map_chart",
    )


def _choose_grid(ctx: RunContext, qgrids: list[QuarterGrid]) -> QuarterGrid:
    """The quarter slider (more than one quarter grid) and the chosen grid.

    A time-aware model with a single grid gets a disabled slider and the command that adds
    quarters; an extrapolated quarter (after the training quarters) gets a warning.
    """
    current = next((g for g in qgrids if g.current), qgrids[-1])
    chosen = current
    if len(qgrids) > 1 or current.time_aware:
        by_quarter = {g.quarter: g for g in qgrids}
        quarter = quarter_slider(
            ctx.target,
            list(by_quarter),
            where="map",
            default=current.quarter,
            labels={g.quarter: g.label for g in qgrids},
            help="Quarters with a predictive grid (`geodbk predict --quarter Q`). "
            "'(extrapolation)': after the quarters the model was trained on.",
            disabled=len(by_quarter) < 2,
        )
        chosen = by_quarter[quarter]
        if len(by_quarter) < 2:
            trained = model_quarters(ctx.model_metadata())
            span = f"{trained[0]}:{trained[-1]}" if trained else "all"
            st.caption(
                f"{current.quarter} is the only quarter with a grid. Add others with "
                f"`{ctx.cmd('predict')} --quarter {span}` (the model's quarters; any range, "
                "or one quarter)."
            )
    if chosen.extrapolation:
        held = extrapolation_of(ctx.model_metadata()) == "hold"
        how = (
            "the model holds its last trained quarter's map there (the extrapolation policy "
            "chosen on validation data), so read it as 'no change since then'"
            if held
            else "this map extrapolates the trend, so it is a forecast"
        )
        st.warning(
            f"{chosen.quarter} is an extrapolation in time ({chosen.status}): the model saw no "
            f"data for this quarter; {how}."
        )
    return chosen


def _quantity_controls(ctx: RunContext, kind: str) -> tuple[str, float]:
    """ "What the map shows": what a tile typically gets, the neighbourhood level f(x), a
    single speed test, or (grids without a tile effect) the tile average of K tests."""
    if kind == "tiles":
        return "tile", 1.0
    options = maps.quantities_of(ctx.grid()) if ctx.files.has_grid else dict(maps.QUANTITIES)
    chosen = st.session_state.get(MAP_QUANTITY_KEY)
    if chosen not in options:  # chosen on a grid that offered it, or not yet
        chosen = next(iter(options))
    st.session_state["quantity"] = st.session_state[MAP_QUANTITY_KEY] = chosen
    tests_default = st.session_state.get(MAP_TESTS_KEY, 4)
    st.session_state["quantity_tests"] = st.session_state[MAP_TESTS_KEY] = tests_default

    def keep(widget: str, shared: str) -> None:
        st.session_state[shared] = st.session_state[widget]

    q1, q2 = st.columns([2.2, 2.8])
    quantity = q1.selectbox(
        "What the map shows",
        list(options),
        format_func=options.__getitem__,
        key="quantity",
        on_change=keep,
        args=("quantity", MAP_QUANTITY_KEY),
        help="tile (the default): what a zoom-16 tile here typically gets, its own measured "
        "history included where it has one (a tile without history carries the spread of "
        "tiles around their neighbourhood); area: the neighbourhood level f(x), the smooth "
        "surface; test: what one speed test here would measure (widest). The tile average of "
        "K tests is offered for grids made without a tile effect.",
    )
    tests = 1.0
    if quantity == "average":
        tests = float(
            q2.number_input(
                "K (tests per tile)",
                min_value=1,
                max_value=1000,
                step=1,
                key="quantity_tests",
                on_change=keep,
                args=("quantity_tests", MAP_TESTS_KEY),
            )
        )
    return str(quantity), tests


def _point_marker() -> list[pdk.Layer]:
    point = st.session_state.get(POINT_KEY)
    if point is None:
        return []
    import pandas as pd

    frame = pd.DataFrame(
        {"lon": [point[0]], "lat": [point[1]], "label": ["selected point"], "name": [""]}
    )
    return L.markers_layer(frame)[:1]


#: What the sd layer's sd holds beyond f(x)'s own uncertainty, per quantity.
_SD_PARTS: dict[str, str] = {
    "tile": "tile noise included",
    "latent": "f(x) alone: no tile or test noise",
    "single": "one speed test's noise included",
    "average": "the noise of the tile average of K tests included",
}


def _caption(
    ctx: RunContext, kind: str, chosen: QuarterGrid, n_quarters: int = 1, quantity: str = "tile"
) -> None:
    """What the layer shows (for the sd layer: which noise its sd holds, per ``quantity``),
    the quarter, and how to inspect a cell."""
    notes = {
        "median": "Median of the predictive distribution (10^mean on the log10 scale).",
        "pi_width": "Upper minus lower end of the 95% prediction interval: wide = uncertain. "
        f"In {'ms' if ctx.target == 'latency' else 'Mbps'} the width grows with the "
        f"{'latency' if ctx.target == 'latency' else 'speed'} itself; the sd (log10) layer "
        "shows the relative uncertainty.",
        "std": f"Predictive sd on the log10 scale ({_SD_PARTS.get(quantity, _SD_PARTS['tile'])}): "
        "relative uncertainty.",
        "pi_lower": "2.5% quantile of the predictive distribution.",
        "pi_upper": "97.5% quantile of the predictive distribution.",
        "prob": "Probability per grid cell under the model's Gaussian predictive in log10.",
    }
    shows = describe_quarter(chosen.quarter, chosen.status)
    when = f" Shows {shows}." if shows else ""
    if n_quarters > 1:
        when += f" One colour range for all {n_quarters} quarters, so the slider shows change."
    st.caption(
        f"{notes.get(kind, '')}{when} Hover for values; click a cell to inspect it (Inspect tab)."
    )


def _clicked_summary(ctx: RunContext, grid: Grid, spec: maps.LayerSpec | None = None) -> None:
    """A caption with the selected point's median and 95% interval of the quantity ``spec``
    shows (``None``: the grid's stored quantity)."""
    point = st.session_state.get(POINT_KEY)
    if point is None:
        return
    cell = grid.cell_of(*point)
    lon, lat = point
    if cell is None or not grid.in_region[cell]:
        st.caption(f"Selected point {format_lonlat(lon, lat)} is outside the region.")
        return
    unit = UNITS[ctx.target]
    r, c = cell
    med, lo, hi = (v[r, c] for v in maps.summary_values(grid, spec))
    what = f" ({maps.quantity_label(grid, spec)})" if spec is not None else ""
    st.caption(
        f"Selected point {format_lonlat(lon, lat)}: median {format_value(med, unit)}, 95% "
        f"interval {format_value(lo)}–{format_value(hi, unit)}{what}. Details in the Inspect tab."
    )


def _render_tiles(ctx: RunContext, col: st.delta_generator.DeltaGenerator) -> None:
    t = ctx.target
    unit = UNITS[t]
    if not ctx.inv.has_tiles:
        missing("This run has no tiles.parquet.", ctx.cmd("ingest"))
        return
    table = ctx.tiles()
    if f"value_{t}" not in table.frame.columns:
        st.info(f"tiles.parquet has no {t} column.")
        return
    quarters = list(table.quarters)
    # start at the quarter the other layers show (the shared quarter choice), else the latest
    shared = st.session_state.get(selected_quarter_key(t))
    start = quarters.index(shared) if shared in quarters else len(quarters) - 1
    quarter = col.selectbox("Quarter", quarters, index=start, key="tiles_quarter")
    frame = table.frame[table.frame["quarter"] == quarter]
    n_all = len(frame)
    if n_all > MAX_TILES:  # keep the page light: the tiles with the most tests
        frame = frame.nlargest(MAX_TILES, "tests")
    values = frame[f"value_{t}"].to_numpy(dtype=float)
    # One scale for every quarter (robust range of all observed tiles), so quarters compare;
    # observed tiles spread far wider than the smooth predicted median, hence their own range.
    all_values = table.frame[f"value_{t}"].to_numpy(dtype=float)
    scale = auto_scale(all_values, value_cmap(t))
    frame = frame.assign(
        label=[
            f"<b>{format_value(v, unit)}</b> observed ({q})<br/>{n} tests · "
            f"{'urban' if u else 'rural'}<br/><span style='color:#aaa'>{k}</span>"
            for v, q, n, u, k in zip(
                values,
                frame["quarter"],
                frame["tests"],
                frame["urban"],
                frame["quadkey"],
                strict=True,
            )
        ]
    )
    colors = colors_for(values, scale)
    w, s, e, n = (
        float(np.nanmin(table.frame["west"])),
        float(np.nanmin(table.frame["south"])),
        float(np.nanmax(table.frame["east"])),
        float(np.nanmax(table.frame["north"])),
    )
    bounds = (w, s, e, n)
    if ctx.files.has_grid:
        bounds = ctx.grid().bounds
    layer_list = [*maps.region_fill(ctx), L.tiles_layer(frame, colors), *maps.overlay_layers(ctx)]
    layer_list += _point_marker()
    st.markdown(
        legend_html(Legend(f"Observed {t} (tile average), {quarter}", scale, unit)),
        unsafe_allow_html=True,
    )
    st.pydeck_chart(
        L.deck(layer_list, bounds, height_px=MAP_HEIGHT, basemap=ctx.basemap),
        height=MAP_HEIGHT,
        on_select=lambda: _on_click("tiles_chart"),
        selection_mode="single-object",
        key="tiles_chart",
    )
    shown = f"the {len(frame):,} with the most tests of " if n_all > len(frame) else ""
    st.caption(
        f"{shown}{n_all:,} tiles observed in {quarter} "
        f"({int(frame['urban'].sum()):,} urban, {int((~frame['urban']).sum()):,} rural); "
        "tiles are drawn at least 2 px wide so they stay visible when zoomed out."
    )
    if ctx.files.has_grid:
        _clicked_summary(ctx, ctx.grid())


def _render_trend(
    ctx: RunContext,
    kind: str,
    trends: list[TrendFile],
    col: st.delta_generator.DeltaGenerator,
) -> None:
    """Change per year of the latent mean between two quarters, or P(improved)."""
    t = ctx.target
    trend = trends[-1]
    if len(trends) > 1:
        labels = [f.label for f in trends]
        pick_label = col.selectbox("Trend period", labels, index=len(labels) - 1, key=f"trend_{t}")
        trend = trends[labels.index(pick_label)]
    grid = ctx.trend(trend)
    tstamp = stamp(trend.path)
    light = first_paint()
    url, _scale, legend = maps.trend_layer_png(
        str(trend.path), tstamp, t, kind, FIRST_PAINT_PX if light else 0
    )

    def extras() -> list[pdk.Layer]:
        pick, radius = maps.trend_click_points(str(trend.path), tstamp, t)
        return [L.click_grid_layer(pick, radius), *maps.overlay_layers(ctx), *_point_marker()]

    st.markdown(legend_html(legend), unsafe_allow_html=True)
    _draw(url, grid.bounds, extras, light, basemap=ctx.basemap)
    first = str(grid.attrs.get("first_quarter", trend.first))
    last = str(grid.attrs.get("last_quarter", trend.last))
    status = str(grid.attrs.get("quarter_status") or "observed")
    if status != "observed":
        st.warning(f"This trend reaches outside the training quarters ({status}).")
    st.caption(
        maps.trend_caption(
            grid.attrs, t, kind, first=trend.first, last=trend.last, years=trend.years
        )
    )
    licence = maps.licence_caption(grid.attrs)
    if licence:
        st.caption(licence)
    point = st.session_state.get(POINT_KEY)
    if point is not None:
        cell = grid.cell_of(*point)
        if cell is not None and grid.in_region[cell]:
            st.caption(
                f"Selected point {format_lonlat(*point)}: "
                f"{maps.trend_summary(grid, *cell)} ({first} → {last})."
            )
