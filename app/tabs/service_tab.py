"""Service tab: the most probable BEAD service class of each cell (``geodbk service``) on a
classed map with a key of the classes' colours and tiers (red unserved through yellow to green
served), and a headline strip of the area-weighted expected shares."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
import pydeck as pdk
import streamlit as st
from numpy.typing import NDArray

from app import layers as L
from app import maps
from app.colormaps import mercator_rows, png_data_url
from app.context import RunContext
from app.loaders import LoadError, Stamp, grid_engine, load_grid_attrs, stamp
from app.ui import missing
from geodbk.geo.contract import QUANTITY_LABELS, service_headline
from geodbk.service import (
    HELD_OUT_CLASS_HEADER,
    class_colours,
    class_definitions,
    held_out_class_rows,
    held_out_group_text,
    parse_tiers,
)

MAP_HEIGHT = 520


def classes_grids(ctx: RunContext) -> list[Path]:
    """The run's classes grids: ``RUN/service/classes.nc`` (the tile quantity at the latest
    quarter) first, then ``classes_<quarter>_<quantity>.nc`` by name."""
    folder = ctx.inv.path / "service"
    grids = sorted(p for p in folder.glob("classes*.nc") if p.is_file())
    return sorted(grids, key=lambda p: (p.name != "classes.nc", p.name))


def grid_label(path: Path, recorded: str = "") -> str:
    """What a classes grid's file name says it holds: ``tile, latest quarter`` for
    ``classes.nc``, ``2022Q4, area`` for ``classes_2022Q4_area.nc``
    (:func:`geodbk.geo.contract.output_name`); ``recorded`` (the grid's ``quarter``
    attribute) names the quarter of a file name without one."""
    parts = path.stem.removeprefix("classes").strip("_").split("_")
    latest = f"{recorded} (latest)" if recorded else "latest quarter"
    quarter = next((p for p in parts if len(p) == 6 and p[4] == "Q"), latest)
    quantity = next((p for p in parts if p in QUANTITY_LABELS), "tile")
    return f"{quantity}, {quarter}"


def _recorded_quarter(path: Path) -> str:
    """The ``quarter`` attribute of a classes grid (``""`` when unrecorded or unreadable)."""
    try:
        return str(load_grid_attrs(str(path), stamp(path)).get("quarter") or "")
    except LoadError:
        return ""


def load_headline(path: Path) -> dict[str, Any] | None:
    """The headline of the classes grid ``path`` (``headline.json`` beside ``classes.nc``,
    :func:`geodbk.geo.contract.service_headline`: shares of area and tiles with intervals) when
    it was written for this grid, else None."""
    import json

    headline = path.parent / service_headline(path.name)
    if not headline.is_file() or headline.stat().st_mtime < path.stat().st_mtime - 60:
        return None  # absent, or older than the grid it would describe
    try:
        data = json.loads(headline.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "area" in data else None


def share_text(entry: dict[str, Any] | None) -> str:
    """``"90%: 59.6–60.3%"`` from a headline entry ``{mean, lower, upper}``."""
    if not entry:
        return ""
    return f"90%: {100 * entry['lower']:.1f}–{100 * entry['upper']:.1f}%"


@st.cache_data(show_spinner=False, max_entries=4)
def load_classes(path: str, stamp_: Stamp) -> dict[str, Any]:
    """The class codes, class probabilities, coordinates and attributes of a classes grid."""
    import xarray as xr

    with xr.open_dataset(path, engine=grid_engine(path)) as ds:
        probs = [str(v) for v in ds.data_vars if str(v).startswith("p_") and "tier" not in str(v)]
        raw = np.asarray(ds["service_class"].values, dtype=np.float64)  # NaN: outside the region
        return {
            "codes": np.where(np.isfinite(raw), raw, -1).astype(np.int16),
            "probs": {p: np.asarray(ds[p].values, dtype=np.float64) for p in probs},
            "meanings": str(ds["service_class"].attrs.get("flag_meanings", "")).split(),
            "lon": np.asarray(ds["x"].values, dtype=np.float64),
            "lat": np.asarray(ds["y"].values, dtype=np.float64),
            "attrs": {str(k): v for k, v in ds.attrs.items()},
        }


def class_rgba(codes: NDArray[np.int16], n_classes: int) -> NDArray[np.uint8]:
    """RGBA image of class codes in the class raster's colours
    (:func:`geodbk.service.class_colours`, red through yellow to green), transparent outside
    the region (codes < 0)."""
    rgba = np.zeros((*codes.shape, 4), dtype=np.uint8)
    for code, colour in class_colours(n_classes, alpha=235).items():
        rgba[codes == code] = colour
    return rgba


def class_legend_html(names: list[str], tiers: str, latency_ms: Any) -> str:
    """A key of the class map: each class's swatch in the raster's colours
    (:func:`geodbk.service.class_colours`), its name and what it means at ``tiers``
    (:func:`geodbk.service.class_definitions`; the name alone when the tiers cannot be read or
    do not match the classes)."""
    try:
        meanings = class_definitions(parse_tiers(tiers), float(latency_ms))
    except (TypeError, ValueError):
        meanings = ()
    if len(meanings) != len(names):
        meanings = ("",) * len(names)
    colours = class_colours(len(names))
    items = []
    for code, (name, meaning) in enumerate(zip(names, meanings, strict=True)):
        r, g, b, _ = colours[code]
        text = html.escape(name) + (f": {html.escape(meaning)}" if meaning else "")
        items.append(
            f'<span style="display:inline-block;margin-right:1.2em;white-space:nowrap">'
            f'<span style="display:inline-block;width:0.9em;height:0.9em;vertical-align:middle;'
            f'margin-right:0.35em;background:rgb({r},{g},{b})"></span>{text}</span>'
        )
    return '<div style="font-size:0.85em;line-height:1.8">' + "".join(items) + "</div>"


def classes_quarter(attrs: dict[str, Any], headline: dict[str, Any] | None = None) -> str:
    """The quarter the classes are of: the classes grid's ``quarter`` attribute (``2023Q4``,
    ``pooled 2022Q1:2023Q4``), else ``headline.json``'s; ``""`` when neither records one."""
    quarter = str(attrs.get("quarter", "") or "").strip()
    if not quarter and headline:
        quarter = str(headline.get("quarter", "") or "").strip()
    return quarter


def area_shares(data: dict[str, Any]) -> dict[str, float]:
    """Area-weighted (cos latitude) mean of each class probability over the region's cells:
    the expected share of the area in each class."""
    w = np.cos(np.deg2rad(data["lat"]))[:, None] * np.ones(data["codes"].shape)
    out = {}
    for name, p in data["probs"].items():
        inside = np.isfinite(p)
        out[name.removeprefix("p_")] = float((p * w)[inside].sum() / w[inside].sum())
    return out


def held_out_tables(headline: dict[str, Any] | None) -> list[tuple[str, list[list[str]]]]:
    """The classes' held-out check of a headline (``held_out_check``, written by
    ``geodbk service``) as one (caption, table rows) per group of test tiles: well measured,
    then less measured; empty without one."""
    check = (headline or {}).get("held_out_check")
    if not isinstance(check, dict):
        return []
    out = []
    for part in (check.get("well_measured"), check.get("less_measured")):
        if not isinstance(part, dict) or not isinstance(part.get("all"), dict):
            continue
        whole = part["all"]
        out.append((f"{held_out_group_text(part)}.", held_out_class_rows(whole, check["classes"])))
    return out


def _render_held_out_check(headline: dict[str, Any] | None) -> None:
    """The held-out check's tables under the map, or a line saying why there is none."""
    if not headline:
        return
    st.markdown("**Held-out check: the classes of test tiles**")
    tables = held_out_tables(headline)
    if not tables:
        st.caption(
            "No held-out check: the classes were not scored on test tiles (a headline written "
            "before the check, the test quantity, or no test tiles with tests of all three "
            "targets); run `geodbk service` again on a run with a test split."
        )
        return
    st.caption(
        "Each test tile's class is that of its tests-weighted download, upload and latency "
        "levels; the expected share is the mean of the map's probability of the class at those "
        "tiles. An observed share whose 95% interval (counted by place) leaves out the expected "
        "one is marked (outside). Tiles with fewer tests are more like the map's typical tile."
    )
    for caption, rows in tables:
        st.caption(caption)
        st.table({h: [r[i] for r in rows] for i, h in enumerate(HELD_OUT_CLASS_HEADER)})


def render(ctx: RunContext) -> None:
    """Render the service tab."""
    grids = classes_grids(ctx)
    if not grids:
        missing(
            "This run has no service classes (all three targets joined).",
            ctx.inv.command("service"),
        )
        return
    path = grids[0]
    if len(grids) > 1:
        chosen = st.selectbox(
            "Classes grid (quantity, quarter)",
            [str(g) for g in grids],
            format_func=lambda name: grid_label(Path(name), _recorded_quarter(Path(name))),
            key="service_grid",
            help="Each `geodbk service` call of another quantity or quarter writes its own grid.",
        )
        path = Path(chosen or grids[0])
    data = load_classes(str(path), stamp(path))
    attrs = data["attrs"]
    names = data["meanings"] or ["unserved", "underserved", "served"]
    shares = area_shares(data)
    latency = attrs.get("latency_ms", "")
    try:
        latency_text = f"{float(latency):g}"
    except (TypeError, ValueError):
        latency_text = str(latency)
    headline = load_headline(path)
    quarter = classes_quarter(attrs, headline)
    st.markdown(
        f"**Service classes{f', {quarter}' if quarter else ''}**: "
        f"{attrs.get('quantity_label', attrs.get('quantity', ''))}; tiers "
        f"{attrs.get('tiers', '')} Mbps, latency ≤ {latency_text} ms"
    )
    cols = st.columns(len(names))
    for col, name in zip(cols, names, strict=True):
        col.metric(f"Expected share of area {name}", f"{100 * shares.get(name, float('nan')):.1f}%")
        if headline:
            tiles = headline.get("tiles", {}).get(name)
            col.caption(
                f"{share_text(headline['area'].get(name))}"
                + (f" · of tiles {100 * tiles['mean']:.1f}% ({share_text(tiles)})" if tiles else "")
            )
    st.caption(
        "The shares are expected shares: each cell's class probabilities averaged over the "
        "region. The map shows each cell's most probable class, so a class that is often likely "
        "but seldom the most likely covers less of the map than its share."
    )
    codes = data["codes"]
    image = class_rgba(codes, len(names))[mercator_rows(data["lat"])]
    dx = float(abs(data["lon"][1] - data["lon"][0])) if data["lon"].size > 1 else 0.01
    dy = float(abs(data["lat"][0] - data["lat"][1])) if data["lat"].size > 1 else 0.01
    bounds = (
        float(data["lon"][0] - dx / 2),
        float(data["lat"][-1] - dy / 2),
        float(data["lon"][-1] + dx / 2),
        float(data["lat"][0] + dy / 2),
    )
    layer_list: list[pdk.Layer] = [L.bitmap_layer(png_data_url(image), bounds, "classes")]
    layer_list += maps.overlay_layers(ctx)
    st.pydeck_chart(
        L.deck(layer_list, bounds, height_px=MAP_HEIGHT, basemap=ctx.basemap), height=MAP_HEIGHT
    )
    st.markdown(
        class_legend_html(names, str(attrs.get("tiers", "")), attrs.get("latency_ms")),
        unsafe_allow_html=True,
    )
    description = str(attrs.get("quantity_description", "")).rstrip(".")
    st.caption(
        "Most probable class of each cell, coloured as in the key above. "
        f"{description[:1].upper()}{description[1:]}. The shares are expectations "
        "(the mean of each cell's class probability)"
        + (
            f"; the 90% intervals come from {headline.get('samples')} joint posterior samples "
            f"of the three models (`service/{service_headline(path.name)}`), the shares of "
            "tiles from the run's "
            "observed tiles."
            if headline
            else "; run `geodbk service` again for their intervals."
        )
    )
    _render_held_out_check(headline)
    licence = maps.licence_caption(attrs)
    if licence:
        st.caption(licence)
