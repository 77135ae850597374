"""Map tab: predicted median, interval width, sd, bounds, threshold probability, observed tiles."""

from __future__ import annotations

import numpy as np
import pydeck as pdk
import streamlit as st

from app import layers as L
from app import maps
from app.colormaps import CMAPS, Legend, auto_scale, colors_for, format_value, legend_html
from app.context import RunContext
from app.points import point_from_selection
from app.runs import DEFAULT_THRESHOLDS, UNITS
from app.ui import missing

MAP_HEIGHT = 520
#: Most tiles drawn as polygons at once (a quarter of a state is usually far fewer).
MAX_TILES = 20_000
POINT_KEY = "inspect_point"


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
    c1, c2, c3 = st.columns([2.2, 1.4, 1.4])
    kind = c1.selectbox(
        "Layer",
        list(maps.LAYERS),
        format_func=maps.LAYERS.__getitem__,
        key="layer",
        bind="query-params",
    )
    quantity, tests = _quantity_controls(kind)
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
    if not ctx.files.has_grid:
        missing(f"This run has no predictive grid for {t}.", ctx.cmd("predict"))
        return
    grid = ctx.grid()
    gstamp = maps.grid_stamp(ctx)
    url, _scale, legend = maps.grid_layer_png(str(ctx.files.grid), gstamp, t, spec)
    pick, radius = maps.click_points(str(ctx.files.grid), gstamp, t)
    layer_list: list[pdk.Layer] = [L.bitmap_layer(url, grid.bounds)]
    layer_list += [L.click_grid_layer(pick, radius), *maps.overlay_layers(ctx)]
    layer_list += _point_marker()
    st.markdown(legend_html(legend), unsafe_allow_html=True)
    st.pydeck_chart(
        L.deck(layer_list, grid.bounds, height_px=MAP_HEIGHT),
        height=MAP_HEIGHT,
        on_select=lambda: _on_click("map_chart"),
        selection_mode="single-object",
        key="map_chart",
    )
    _caption(ctx, kind)
    _clicked_summary(ctx)


def _quantity_controls(kind: str) -> tuple[str, float]:
    """ "What the map shows": a single speed test, the tile average of K tests, or f(x)."""
    if kind in ("median", "tiles"):
        return "single", 1.0
    q1, q2 = st.columns([2.2, 2.8])
    quantity = q1.selectbox(
        "What the map shows",
        list(maps.QUANTITIES),
        format_func=maps.QUANTITIES.__getitem__,
        key="quantity",
        help="A single speed test at a location (widest), the average of K tests in a tile "
        "(the noise shrinks as s2_floor + s2_meas / K), or the latent mean speed f(x) "
        "(no test noise). The median is the same for all three.",
    )
    tests = 1.0
    if quantity == "average":
        tests = float(
            q2.number_input("K (tests per tile)", min_value=1, max_value=1000, value=4, step=1)
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


def _caption(ctx: RunContext, kind: str) -> None:
    notes = {
        "median": "Median of the predictive distribution (10^mean on the log10 scale).",
        "pi_width": "Upper minus lower end of the 95% prediction interval: wide = uncertain. "
        "In Mbps the width grows with the speed itself; the sd (log10) layer shows the "
        "relative uncertainty.",
        "std": "Predictive sd on the log10 scale (tile noise included): relative uncertainty.",
        "pi_lower": "2.5% quantile of the predictive distribution.",
        "pi_upper": "97.5% quantile of the predictive distribution.",
        "prob": "Probability per grid cell under the model's Gaussian predictive in log10.",
    }
    st.caption(f"{notes.get(kind, '')} Hover for values; click a cell to inspect it (Inspect tab).")


def _clicked_summary(ctx: RunContext) -> None:
    point = st.session_state.get(POINT_KEY)
    if point is None:
        return
    grid = ctx.grid()
    cell = grid.cell_of(*point)
    lon, lat = point
    if cell is None or not grid.in_region[cell]:
        st.caption(f"Selected point {lon:.4f}, {lat:.4f} is outside the region.")
        return
    unit = UNITS[ctx.target]
    r, c = cell
    st.caption(
        f"Selected point {lon:.4f}, {lat:.4f}: median "
        f"{format_value(grid.natural('mean')[r, c], unit)}, 95% interval "
        f"{format_value(grid.natural('pi_lower')[r, c])}–"
        f"{format_value(grid.natural('pi_upper')[r, c], unit)}. Details in the Inspect tab."
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
    quarters = table.quarters
    quarter = col.selectbox("Quarter", quarters, index=len(quarters) - 1, key="tiles_quarter")
    frame = table.frame[table.frame["quarter"] == quarter]
    n_all = len(frame)
    if n_all > MAX_TILES:  # keep the page light: the tiles with the most tests
        frame = frame.nlargest(MAX_TILES, "tests")
    values = frame[f"value_{t}"].to_numpy(dtype=float)
    # One scale for every quarter (robust range of all observed tiles), so quarters compare;
    # observed tiles spread far wider than the smooth predicted median, hence their own range.
    all_values = table.frame[f"value_{t}"].to_numpy(dtype=float)
    scale = auto_scale(all_values, CMAPS["value"])
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
        L.deck(layer_list, bounds, height_px=MAP_HEIGHT),
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
        _clicked_summary(ctx)
