"""Places tab: the predictions of ``geodbk predict --at`` and the service classes of
``geodbk service --at`` at a file's places (serviceable locations, anchor institutions), as
points on the map and a table with the file's own columns, the quantity and the quarter named.

The tab reads the files as written; it computes nothing of the model's."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pydeck as pdk
import shapely
import streamlit as st

from app import layers as L
from app import maps
from app.colormaps import Legend, auto_scale, colors_for, format_value, legend_html, value_cmap
from app.context import RunContext
from app.loaders import Stamp, stamp
from app.ui import missing, table_csv_button
from geodbk.geo.contract import (
    PLACES_OUTPUT_COLUMNS,
    PREDICTIONS_KEY,
    QUANTITY_LABELS,
    SERVICE_KEY,
)
from geodbk.geo.frame import frame_bounds
from geodbk.geo.timeaxis import quarter_text
from geodbk.service import class_colours

MAP_HEIGHT = 520
#: What a place's point may be coloured by in a predictions file: column -> what it is.
PREDICTION_COLOURS: dict[str, str] = {
    "median": "median",
    "lower_natural": "95% lower bound",
    "upper_natural": "95% upper bound",
}
#: The columns either kind of file adds after the places file's own (besides ``p_*``).
OUTPUT_COLUMNS = frozenset({*PLACES_OUTPUT_COLUMNS, "service_class"})
#: Point colour of a place with no values (outside the region or without a place: not drawn).
NO_VALUE_RGBA = (150, 150, 150, 160)
#: Most places drawn on the map (a seeded random sample beyond it; a state's serviceable
#: locations number about a million) and rows shown in the table (the CSV holds them all).
MAX_DRAWN_PLACES = 20_000
MAX_TABLE_ROWS = 10_000


def places_files(run: Path, target: str) -> list[Path]:
    """The run's places files, newest first: ``predictions/TARGET_*.parquet`` of ``target``
    (``geodbk predict --at``), then ``service/classes_*.parquet`` (``geodbk service --at``,
    one per file for all three targets)."""

    def newest(paths: list[Path]) -> list[Path]:
        return sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)

    predictions = run / "predictions"
    service = run / "service"
    found = newest(list(predictions.glob(f"{target}_*.parquet"))) if predictions.is_dir() else []
    if service.is_dir():
        found += newest([p for p in service.glob("classes_*.parquet") if p.is_file()])
    return found


def file_kind(path: Path) -> str:
    """``service`` for a ``geodbk service --at`` file, ``predictions`` otherwise."""
    return "service" if path.parent.name == "service" else "predictions"


@st.cache_data(show_spinner=False, max_entries=2)  # a state's file holds ~1M rows
def load_places(path: str, stamp_: Stamp) -> tuple[pd.DataFrame, dict[str, Any], dict[str, Any]]:
    """A places file's rows, what it records of itself (``geodbk_predictions`` or
    ``geodbk_service``) and its data licence."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    key = SERVICE_KEY if file_kind(Path(path)) == "service" else PREDICTIONS_KEY
    info = _json(meta.get(key))
    licence = _json(meta.get(b"geodbk_data_licence"))
    return table.to_pandas(), info, licence


def _json(raw: bytes | None) -> dict[str, Any]:
    """A metadata entry as a dict (empty when absent or unreadable)."""
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@st.cache_data(show_spinner=False, max_entries=64)
def places_label(path: str, stamp_: Stamp) -> str:
    """``locations.csv: tile quantity, 2023Q4 (download_locations.parquet)``, or ``...:
    service classes, tile quantity, ...`` for a service file: what it holds, from its
    metadata (the file name alone when that is unreadable)."""
    import pyarrow.parquet as pq

    name = Path(path).name
    kind = file_kind(Path(path))
    try:
        meta = pq.read_schema(path).metadata or {}
    except OSError:
        return name
    info = _json(meta.get(SERVICE_KEY if kind == "service" else PREDICTIONS_KEY))
    if not info:
        return name
    what = "service classes, " if kind == "service" else ""
    quarter = quarter_text(info.get("quarter"), info.get("quarter_status"))
    return (
        f"{info.get('at', name)}: {what}{info.get('quantity', 'tile')} quantity, {quarter} ({name})"
    )


def id_columns(frame: pd.DataFrame) -> list[str]:
    """The places file's own columns: those before ``quadkey``, where both stages write them
    (renamed ``input_<name>`` where they clash with an output); without ``quadkey``, every
    column that is not an output."""
    columns = [str(c) for c in frame.columns]
    if "quadkey" in columns:
        return columns[: columns.index("quadkey")]
    return [c for c in columns if c not in OUTPUT_COLUMNS and not c.startswith("p_")]


def located(frame: pd.DataFrame) -> np.ndarray:
    """Whether each row has a place (files without the ``located`` column: every row)."""
    return frame["located"].to_numpy(bool) if "located" in frame else np.ones(len(frame), bool)


def mapped(frame: pd.DataFrame) -> np.ndarray:
    """Whether each row has values: a place inside the region."""
    return located(frame) & ~frame["outside_region"].to_numpy(bool)


def place_status(frame: pd.DataFrame) -> pd.Series:
    """Per row: ``mapped`` (values), ``outside the region`` or ``no place`` (no values)."""
    return pd.Series(
        np.where(
            ~located(frame), "no place", np.where(mapped(frame), "mapped", "outside the region")
        ),
        index=frame.index,
    )


def counts_text(frame: pd.DataFrame) -> str:
    """``1,200 places: 1,197 mapped, 2 outside the region (no values), 1 without a place``."""
    status = place_status(frame).value_counts()
    parts = [f"{int(status.get('mapped', 0)):,} mapped"]
    if status.get("outside the region", 0):
        parts.append(f"{int(status['outside the region']):,} outside the region (no values)")
    if status.get("no place", 0):
        parts.append(f"{int(status['no place']):,} without a place (no values)")
    return f"{len(frame):,} places: " + ", ".join(parts)


def drawn_places(frame: pd.DataFrame, limit: int | None = None) -> pd.DataFrame:
    """The mapped places to draw: all of them up to ``limit`` (default
    :data:`MAX_DRAWN_PLACES`), else a random sample of ``limit`` (seed 0, so reruns draw the
    same), in the file's order."""
    limit = MAX_DRAWN_PLACES if limit is None else limit
    inside = frame[mapped(frame)]
    if len(inside) <= limit:
        return inside
    return inside.sample(n=limit, random_state=0).sort_index()


def _name_of(frame: pd.DataFrame, ids: list[str]) -> pd.Series:
    """Each place's name in the tooltip: its first id column, else its row number."""
    if ids:
        return frame[ids[0]].astype("string").fillna("–").astype(str)
    return pd.Series([f"row {i + 1}" for i in range(len(frame))], index=frame.index)


def prediction_points(
    frame: pd.DataFrame, column: str, *, target: str, unit: str
) -> tuple[pd.DataFrame, Legend]:
    """The places of a predictions file to draw (:func:`drawn_places`) coloured by
    ``column`` (natural units; the colour scale from every mapped place), each with an HTML
    ``label`` (name, median, 95% interval, whether its tile has history), and the legend
    naming the quantity and unit."""
    scale = auto_scale(frame.loc[mapped(frame), column].to_numpy(dtype=float), value_cmap(target))
    drawn = drawn_places(frame)
    values = drawn[column].to_numpy(dtype=float)
    quantity = str(drawn["quantity"].iloc[0]) if len(drawn) else "tile"
    legend = Legend(
        f"{PREDICTION_COLOURS[column].capitalize()} of the {QUANTITY_LABELS.get(quantity, quantity)}",
        scale,
        unit,
    )
    names = _name_of(drawn, id_columns(frame))
    history = drawn.get("tile_history", pd.Series(False, index=drawn.index)).to_numpy(bool)
    labels = [
        f"<b>{html.escape(n)}</b><br/>{format_value(m, unit)} "
        f"(95%: {format_value(lo)}–{format_value(hi)})<br/>"
        + ("tile measured" if h else "tile never measured")
        for n, m, lo, hi, h in zip(
            names,
            drawn["median"].to_numpy(float),
            drawn["lower_natural"].to_numpy(float),
            drawn["upper_natural"].to_numpy(float),
            history,
            strict=True,
        )
    ]
    points = pd.DataFrame(
        {
            "lon": drawn["lon"].to_numpy(float),
            "lat": drawn["lat"].to_numpy(float),
            "label": labels,
            "fill": [list(map(int, c)) for c in colors_for(values, scale, alpha=230)],
        }
    )
    return points, legend


def service_points(frame: pd.DataFrame, classes: list[str]) -> pd.DataFrame:
    """The places of a service file to draw (:func:`drawn_places`) coloured by their most
    probable class (the service map's palette), each with an HTML ``label`` (name, class and
    its probability)."""
    drawn = drawn_places(frame)
    palette = class_colours(len(classes), alpha=235)
    code = {name: i for i, name in enumerate(classes)}
    names = _name_of(drawn, id_columns(frame))
    probability = {c: drawn[f"p_{c}"].to_numpy(float) for c in classes if f"p_{c}" in drawn}
    labels, fills = [], []
    for i, (name, cls) in enumerate(zip(names, drawn["service_class"].astype(str), strict=True)):
        p = probability[cls][i] if cls in probability else np.nan
        labels.append(
            f"<b>{html.escape(name)}</b><br/>{html.escape(cls)} (probability {format_value(100 * float(p))}%)"
        )
        fills.append(list(palette.get(code.get(cls, -1), NO_VALUE_RGBA)))
    return pd.DataFrame(
        {
            "lon": drawn["lon"].to_numpy(float),
            "lat": drawn["lat"].to_numpy(float),
            "label": labels,
            "fill": fills,
        }
    )


def service_classes(info: dict[str, Any], frame: pd.DataFrame) -> list[str]:
    """The service's class names, worst first: as recorded (``classes``), else from the
    ``p_<class>`` columns in order."""
    recorded = info.get("classes")
    if isinstance(recorded, str):
        recorded = recorded.split()
    if isinstance(recorded, list) and recorded:
        return [str(c) for c in recorded]
    return [c.removeprefix("p_") for c in frame.columns if c.startswith("p_") and "tier" not in c]


def table_config(columns: list[str], unit: str) -> dict[str, Any]:
    """Streamlit column configs: readable headers with units; probabilities as percentages."""
    number = st.column_config.NumberColumn
    headers = {
        "median": number(f"median ({unit})", format="%.1f"),
        "lower_natural": number(f"95% lower ({unit})", format="%.1f"),
        "upper_natural": number(f"95% upper ({unit})", format="%.1f"),
        "tile_history": st.column_config.CheckboxColumn("tile measured"),
        "outside_region": st.column_config.CheckboxColumn("outside the region"),
        "service_class": st.column_config.TextColumn("most probable class"),
    }
    config: dict[str, Any] = {c: headers[c] for c in columns if c in headers}
    for c in columns:
        if c.startswith("p_tier_"):
            config[c] = number(f"P(meets tier {c.removeprefix('p_tier_')})", format="percent")
        elif c.startswith("p_"):
            config[c] = number(f"P({c.removeprefix('p_')})", format="percent")
    return config


def render(ctx: RunContext) -> None:
    """Render the places tab."""
    files = places_files(ctx.inv.path, ctx.target)
    if not files:
        missing(
            f"This run has no predictions at places for {ctx.target}.",
            f"geodbk predict --run {ctx.inv.path} --target {ctx.target} --at LOCATIONS.csv",
        )
        return
    path = st.selectbox(
        "Places file",
        files,
        format_func=lambda p: places_label(str(p), stamp(p)),
        key="places_file",
    )
    frame, info, licence = load_places(str(path), stamp(path))
    kind = file_kind(path)
    if kind == "service":
        classes = service_classes(info, frame)
        points = service_points(frame, classes)
        names = ", ".join(classes)
        st.markdown(f"**Most probable service class** ({names}; red: unserved, green: served)")
        outputs = ["service_class", *[c for c in frame.columns if c.startswith("p_")]]
    else:
        options: list[str] = list(PREDICTION_COLOURS)
        shown = st.selectbox(
            "Colour by", options, format_func=lambda c: PREDICTION_COLOURS[c], key="places_colour"
        )
        points, legend = prediction_points(
            frame, shown or options[0], target=ctx.target, unit=ctx.unit
        )
        st.markdown(legend_html(legend), unsafe_allow_html=True)
        outputs = ["median", "lower_natural", "upper_natural", "tile_history"]
    if len(points):
        layer = pdk.Layer(
            "ScatterplotLayer",
            id="places",
            data=points,
            get_position=["lon", "lat"],
            get_radius=1,
            radius_min_pixels=5,
            get_fill_color="fill",
            get_line_color=[30, 30, 30, 200],
            line_width_min_pixels=1,
            stroked=True,
            pickable=True,
        )
        lon, lat = points["lon"].to_numpy(float), points["lat"].to_numpy(float)
        bounds = frame_bounds(shapely.points(lon, lat))
        st.pydeck_chart(
            L.deck(
                [layer, *maps.overlay_layers(ctx)],
                padded_bounds(bounds),
                height_px=MAP_HEIGHT,
                basemap=ctx.basemap,
            ),
            height=MAP_HEIGHT,
        )
    else:
        st.info("None of this file's places lies in the run's region: there is nothing to map.")
    cols = [*id_columns(frame), "quadkey", *[c for c in outputs if c in frame.columns]]
    cols += [c for c in ("quantity", "quarter", "outside_region") if c in frame.columns]
    st.dataframe(
        frame[cols].head(MAX_TABLE_ROWS),
        hide_index=True,
        width="stretch",
        column_config=table_config(cols, ctx.unit),
    )
    table_csv_button(path.with_suffix(".csv"), run_name=ctx.inv.path.name, key="dl_places_csv")
    quantity = str(info.get("quantity") or (frame["quantity"].iloc[0] if len(frame) else "tile"))
    interval = (
        "Class probabilities are the model's; the most probable class is the one drawn."
        if kind == "service"
        else "Intervals are 95% prediction intervals of the quantity."
    )
    limits: list[str] = []
    if len(points) < int(mapped(frame).sum()):
        limits.append(f"the map draws a random {len(points):,} of them")
    if len(frame) > MAX_TABLE_ROWS:
        limits.append(f"the table shows the first {MAX_TABLE_ROWS:,} rows")
    sampled = f" ({' and '.join(limits)}; the CSV holds every place)" if limits else ""
    st.caption(
        f"{counts_text(frame)}{sampled}. Quantity {QUANTITY_LABELS.get(quantity, quantity)}; "
        f"{quarter_text(info.get('quarter'), info.get('quarter_status'))}. {interval} "
        "The CSV keeps every column, with log10 values and the file's own columns."
    )
    credit = maps.licence_caption({**licence, "license_terms": licence.get("terms")})
    if credit:
        st.caption(credit)


def padded_bounds(bounds: L.Bounds, *, share: float = 0.06, margin_deg: float = 0.01) -> L.Bounds:
    """``bounds`` grown on every side by ``share`` of their width (east-west) and height, and
    at least ``margin_deg``: the points at the edge are drawn whole, and a single place still
    gets a view."""
    w, s, e, n = bounds
    dx = max(share * (e - w), margin_deg)
    dy = max(share * (n - s), margin_deg)
    return (w - dx, s - dy, e + dx, n + dy)
