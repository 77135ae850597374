"""Areas tab: the area summaries of ``geodbk summarize`` (one file per target and polygon
file) as a choropleth of the typical speed, a table with 90% intervals and a CSV download."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pydeck as pdk
import streamlit as st

from app import layers as L
from app import maps
from app.colormaps import Legend, auto_scale, colors_for, format_value, legend_html, value_cmap
from app.context import RunContext
from app.loaders import Stamp, stamp
from app.ui import missing, table_csv_button
from geodbk.geo.frame import frame_bounds
from geodbk.geo.timeaxis import quarter_text

MAP_HEIGHT = 520
#: Polygons are simplified to this tolerance (degrees, about 50 m) before they are sent to the
#: browser: agency outlines are far more detailed than a map at state scale can show.
DRAW_TOLERANCE_DEG = 0.0005
#: Columns shown in the table (those the file has), in this order.
TABLE_COLUMNS = (
    "id",
    "name",
    "n_cells",
    "area_km2",
    "mean_natural",
    "lower_natural",
    "upper_natural",
    "independent_lower_natural",
    "independent_upper_natural",
    "n_tiles",
    "n_tests",
    "tiles_raw_mean_natural",
)


def summary_files(ctx: RunContext) -> list[Path]:
    """``RUN/summaries/TARGET_*.parquet`` of the chosen target, newest first (every quarter
    and quantity: ``TARGET_<stem>[_<quarter>][_<quantity>].parquet``)."""
    folder = ctx.inv.path / "summaries"
    if not folder.is_dir():
        return []
    files = folder.glob(f"{ctx.target}_*.parquet")
    return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)


@st.cache_data(show_spinner=False, max_entries=64)
def summary_label(path: str, stamp_: Stamp) -> str:
    """``counties.geojson: tile quantity, 2023Q4 (download_counties.parquet)``: what a summary
    file holds, from its metadata (the file name alone when that is unreadable)."""
    import pyarrow.parquet as pq

    name = Path(path).name
    try:
        info = json.loads((pq.read_schema(path).metadata or {}).get(b"geodbk_summary", b"{}"))
    except (OSError, ValueError):
        return name
    if not isinstance(info, dict) or not info:
        return name
    areas = info.get("areas_file") or name
    return f"{areas}: {info.get('quantity', 'tile')} quantity, {quarter_text(info.get('quarter'), info.get('quarter_status'))} ({name})"


@st.cache_data(show_spinner=False, max_entries=8)
def load_summary(
    path: str, stamp_: Stamp
) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any], L.Bounds]:
    """The summary table (geometry as simplified GeoJSON features), its provenance, its licence
    and the areas' bounds."""
    import geopandas as gpd
    import pyarrow.parquet as pq

    gdf = gpd.read_parquet(path)
    meta = pq.read_schema(path).metadata or {}
    info = json.loads(meta.get(b"geodbk_summary", b"{}"))
    licence = json.loads(meta.get(b"geodbk_data_licence", b"{}"))
    mapped = gdf[gdf["n_cells"] > 0] if "n_cells" in gdf and (gdf["n_cells"] > 0).any() else gdf
    w, s, e, n = frame_bounds(mapped.geometry.to_numpy())  # the areas the map covers
    gdf = gdf.set_geometry(gdf.geometry.simplify(DRAW_TOLERANCE_DEG, preserve_topology=True))
    geo = json.loads(gdf.to_json(drop_id=True))
    frame = pd.DataFrame(gdf.drop(columns="geometry"))
    frame["_feature"] = geo["features"]
    return frame, info, licence, (w, s, e, n)


#: Column headers of the table (``{unit}``: the target's, Mbps or ms) and their formats.
TABLE_HEADERS: dict[str, tuple[str, str | None]] = {
    "id": ("id", None),
    "name": ("name", None),
    "n_cells": ("grid cells", "%d"),
    "area_km2": ("area (km²)", "%.0f"),
    "mean_natural": ("mean ({unit})", "%.1f"),
    "lower_natural": ("90% lower ({unit})", "%.1f"),
    "upper_natural": ("90% upper ({unit})", "%.1f"),
    "independent_lower_natural": ("independent cells: 90% lower ({unit})", "%.1f"),
    "independent_upper_natural": ("independent cells: 90% upper ({unit})", "%.1f"),
    "n_tiles": ("observed tiles", "%d"),
    "n_tests": ("tests", "%d"),
    "tiles_raw_mean_natural": ("observed tiles' test-weighted mean ({unit})", "%.1f"),
}
_SHARE = re.compile(r"^share_(ge|le)_([0-9p]+)(mbps|ms)(_lower|_upper)?$")


def share_label(column: str) -> str:
    """``share_ge_25mbps`` -> ``share ≥ 25 Mbps``, ``share_le_100ms_lower`` -> ``share ≤ 100 ms,
    90% lower`` (``geodbk summarize``'s tier columns); other names with spaces for
    underscores."""
    m = _SHARE.match(column)
    if m is None:
        return column.replace("_", " ")
    rel, value, unit, bound = m.groups()
    text = f"share {'≥' if rel == 'ge' else '≤'} {value.replace('p', '.')} "
    text += "Mbps" if unit == "mbps" else "ms"
    return text + (f", 90% {bound.removeprefix('_')}" if bound else "")


def table_config(columns: list[str], unit: str) -> dict[str, Any]:
    """Streamlit column configs of the table: readable headers with units, numbers rounded
    (speeds to 0.1, areas to 1 km², shares as percentages); the data keep their names."""
    config: dict[str, Any] = {}
    for c in columns:
        if c in TABLE_HEADERS:
            header, fmt = TABLE_HEADERS[c]
            header = header.format(unit=unit)
            config[c] = (
                st.column_config.NumberColumn(header, format=fmt)
                if fmt
                else st.column_config.TextColumn(header)
            )
        elif c.startswith("share_"):
            config[c] = st.column_config.NumberColumn(share_label(c), format="percent")
    return config


def share_columns(frame: pd.DataFrame) -> list[str]:
    """The tier share columns (``share_ge_25mbps``, ...; not their bounds)."""
    return [
        c for c in frame.columns if c.startswith("share_") and not c.endswith(("_lower", "_upper"))
    ]


def render(ctx: RunContext) -> None:
    """Render the areas tab."""
    files = summary_files(ctx)
    if not files:
        missing(
            f"This run has no area summaries for {ctx.target}.",
            f"geodbk summarize --run {ctx.inv.path} --target {ctx.target} --areas COUNTIES.zip",
        )
        return
    path = st.selectbox(
        "Areas file",
        files,
        format_func=lambda p: summary_label(str(p), stamp(p)),
        key="areas_file",
    )
    frame, info, licence, bounds = load_summary(str(path), stamp(path))
    shares = share_columns(frame)
    options = ["mean_natural", *shares]
    unit = ctx.unit

    typical = "typical latency" if ctx.target == "latency" else "typical speed"

    def label(c: str) -> str:
        return f"{typical} (area mean)" if c == "mean_natural" else share_label(c)

    shown = st.selectbox("Colour by", options, format_func=label, key="areas_colour")
    values = frame[shown].to_numpy(dtype=float)
    if shown == "mean_natural":
        scale = auto_scale(values, value_cmap(ctx.target))
        legend = Legend(f"Area mean of the {info.get('quantity', 'tile')} quantity", scale, unit)
    else:
        scale = auto_scale(np.array([0.0, 1.0]), "RdYlGn", limits=(0.0, 1.0))
        legend = Legend(f"Share of area {label(shown).removeprefix('share ')}", scale, "")
    colours = colors_for(values, scale, alpha=200)
    features = []
    for feature, colour, row in zip(frame["_feature"], colours, frame.itertuples(), strict=True):
        mean, lo, hi = (
            getattr(row, c, np.nan) for c in ("mean_natural", "lower_natural", "upper_natural")
        )
        text = f"<b>{row.id}</b><br/>{format_value(mean, unit)} (90%: {format_value(lo)}–{format_value(hi)})"
        features.append(
            {**feature, "properties": {"label": text, "fill": [int(c) for c in colour]}}
        )
    layer = pdk.Layer(
        "GeoJsonLayer",
        {"type": "FeatureCollection", "features": features},
        id="areas",
        pickable=True,
        stroked=True,
        filled=True,
        get_fill_color="properties.fill",
        get_line_color=[60, 60, 60, 160],
        line_width_min_pixels=0.5,
    )
    st.markdown(legend_html(legend), unsafe_allow_html=True)
    st.pydeck_chart(
        L.deck(
            [layer, *maps.overlay_layers(ctx)], bounds, height_px=MAP_HEIGHT, basemap=ctx.basemap
        ),
        height=MAP_HEIGHT,
    )
    cols = [c for c in TABLE_COLUMNS if c in frame.columns]
    cols += [c for s in shares for c in (s, f"{s}_lower", f"{s}_upper") if c in frame.columns]
    st.dataframe(
        frame[cols], hide_index=True, width="stretch", column_config=table_config(cols, unit)
    )
    table_csv_button(path.with_suffix(".csv"), run_name=ctx.inv.path.name, key="dl_areas_csv")
    st.caption(
        f"{len(frame)} areas, {info.get('samples', '?')} joint posterior samples, quantity "
        f"{info.get('quantity', '?')}, quarter {quarter_text(info.get('quarter'), info.get('quarter_status'))}. Intervals are 90%; "
        "the independent-cells interval shows what treating the cells as independent would give. "
        "The observed tiles' test-weighted mean averages their measured values, weighted by "
        "tests, with no model (`tiles_raw_mean_natural` in the CSV, which keeps every column)."
    )
    credit = maps.licence_caption({**licence, "license_terms": licence.get("terms")})
    if credit:
        st.caption(credit)
