"""pydeck layer builders: raster BitmapLayer, outlines, observed tiles, click targets, markers.

No base map is drawn unless asked for (:data:`app.basemap.BASEMAP_STYLE`, when the machine
is online): the region boundary and urban outlines give orientation. Decks are sent as compact JSON, and outlines are one ``PathLayer`` (a GeoJsonLayer
per overlay would cost a set of shader programs each; with software WebGL every program costs
a noticeable part of a second before the first frame).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pydeck as pdk
from pydeck.bindings.json_tools import default_serialize

from geodbk.geo.longitude import wrap_longitude

#: Layer ids that carry clickable points (their objects have ``lon``/``lat``).
PICK_LAYER_ID = "click-grid"
TILES_LAYER_ID = "tiles"
MARKERS_LAYER_ID = "markers"
CLICKABLE_LAYERS = (TILES_LAYER_ID, PICK_LAYER_ID)
OUTLINES_LAYER_ID = "outlines"
#: ``mapStyle`` value that makes Streamlit's deck component draw no base map at all (any other
#: value, or none, makes it load a Carto base map from the network).
NO_BASE_MAP = "__MAP_STYLE__"

Bounds = tuple[float, float, float, float]  # west, south, east, north


def bitmap_layer(image_url: str, bounds: Bounds, layer_id: str = "raster") -> pdk.Layer:
    """A raster drawn as one image between lon/lat bounds (west, south, east, north)."""
    return pdk.Layer(
        "BitmapLayer",
        id=layer_id,
        # Quoted so pydeck passes the data URL through as a string, not as an accessor.
        image=f"'{image_url}'",
        bounds=list(bounds),
        opacity=1.0,
        pickable=False,
        # Crisp cells when zoomed in (no blur at the region edge), smooth when zoomed out.
        texture_parameters={"minFilter": "linear", "magFilter": "nearest"},
    )


def outline_layer(
    geojson: Mapping[str, Any],
    layer_id: str,
    color: Sequence[int],
    width_px: float = 1.5,
    fill: Sequence[int] | None = None,
) -> pdk.Layer:
    """Polygon outlines from a GeoJSON FeatureCollection (optionally with a faint fill)."""
    return pdk.Layer(
        "GeoJsonLayer",
        id=layer_id,
        data=dict(geojson),
        stroked=True,
        filled=fill is not None,
        get_fill_color=list(fill) if fill is not None else [0, 0, 0, 0],
        get_line_color=list(color),
        line_width_min_pixels=width_px,
        get_line_width=0,
        pickable=False,
    )


Path = list[list[float]]


def outline_paths(geojson: Mapping[str, Any], digits: int = 5) -> list[Path]:
    """The rings and lines of a GeoJSON FeatureCollection as ``[[lon, lat], ...]`` paths.

    Polygon and MultiPolygon rings (holes included), LineStrings and MultiLineStrings;
    coordinates rounded to ``digits`` decimals (1e-5 degrees is about 1 m) to keep the JSON small.
    """

    def rings(geom: Mapping[str, Any]) -> Iterable[Any]:
        kind, coords = geom.get("type"), geom.get("coordinates") or []
        if kind == "Polygon":
            yield from coords
        elif kind == "MultiPolygon":
            for poly in coords:
                yield from poly
        elif kind == "LineString":
            yield coords
        elif kind == "MultiLineString":
            yield from coords
        elif kind == "GeometryCollection":
            for g in geom.get("geometries") or []:
                yield from rings(g)

    out: list[Path] = []
    for feat in geojson.get("features") or []:
        geom = feat.get("geometry") if isinstance(feat, Mapping) else None
        if not isinstance(geom, Mapping):
            continue
        for ring in rings(geom):
            path = [[round(float(p[0]), digits), round(float(p[1]), digits)] for p in ring]
            if len(path) >= 2:
                out.append(path)
    return out


def outlines_layer(
    groups: Sequence[tuple[Sequence[Path], Sequence[int], float]],
    layer_id: str = OUTLINES_LAYER_ID,
) -> pdk.Layer:
    """All outlines in one ``PathLayer``: ``(paths, rgba colour, width in pixels)`` per group,
    drawn in order (so a wide white halo group goes first, under its dark line)."""
    data = [
        {"path": path, "color": list(color), "width": float(width)}
        for paths, color, width in groups
        for path in paths
    ]
    return pdk.Layer(
        "PathLayer",
        id=layer_id,
        data=data,
        get_path="path",
        get_color="color",
        get_width="width",
        width_units="'pixels'",  # quoted: a plain string would become an accessor
        width_min_pixels=1,
        pickable=False,
    )


def tiles_layer(frame: pd.DataFrame, colors: np.ndarray) -> pdk.Layer:
    """Observed tiles as squares; a minimum outline width keeps them visible when zoomed out.

    Parameters
    ----------
    frame
        Rows with ``west``, ``south``, ``east``, ``north``, ``lon``, ``lat`` and ``label``.
    colors
        ``(n, 4)`` uint8 fill colours.
    """
    data = pd.DataFrame(
        {
            "polygon": [
                [[w, s], [e, s], [e, n], [w, n]]
                for w, s, e, n in zip(
                    frame["west"], frame["south"], frame["east"], frame["north"], strict=True
                )
            ],
            "color": [list(map(int, c)) for c in colors],
            "lon": frame["lon"].to_numpy(),
            "lat": frame["lat"].to_numpy(),
            "label": frame["label"].to_numpy(),
        }
    )
    return pdk.Layer(
        "PolygonLayer",
        id=TILES_LAYER_ID,
        data=data,
        get_polygon="polygon",
        get_fill_color="color",
        get_line_color="color",
        stroked=True,
        line_width_min_pixels=2,
        pickable=True,
        auto_highlight=True,
    )


def click_grid_layer(points: pd.DataFrame, radius_m: float) -> pdk.Layer:
    """Nearly invisible points covering the region so a click on a raster returns a location.

    Parameters
    ----------
    points
        Rows with ``lon``, ``lat`` and ``label`` (shown as the tooltip).
    radius_m
        Point radius in metres (about half the spacing, so the points tile the region).
    """
    return pdk.Layer(
        "ScatterplotLayer",
        id=PICK_LAYER_ID,
        data=points[["lon", "lat", "label"]],
        get_position=["lon", "lat"],
        get_radius=radius_m,
        get_fill_color=[255, 255, 255, 1],
        pickable=True,
        auto_highlight=True,
        highlight_color=[255, 255, 255, 90],
    )


def markers_layer(points: pd.DataFrame) -> list[pdk.Layer]:
    """Reference/inspected points: white dots with a dark ring and a text label."""
    data = points[["lon", "lat", "label", "name"]]
    return [
        pdk.Layer(
            "ScatterplotLayer",
            id=MARKERS_LAYER_ID,
            data=data,
            get_position=["lon", "lat"],
            get_radius=1,
            radius_min_pixels=6,
            get_fill_color=[255, 255, 255, 255],
            get_line_color=[20, 20, 20, 255],
            line_width_min_pixels=2,
            stroked=True,
            pickable=False,  # not selectable: Streamlit would dim unselected markers
        ),
        pdk.Layer(
            "TextLayer",
            id="marker-labels",
            data=data,
            get_position=["lon", "lat"],
            get_text="name",
            get_size=13,
            get_color=[20, 20, 20, 255],
            get_pixel_offset=[0, -16],
            background=True,
            get_background_color=[255, 255, 255, 210],
            pickable=False,
        ),
    ]


def _shift_x(coords: Any, shift: float) -> Any:
    """Nested ``[x, y]`` coordinate lists with ``x + shift``."""
    if coords and isinstance(coords[0], (int, float)):
        return [coords[0] + shift, *coords[1:]]
    return [_shift_x(c, shift) for c in coords]


def _first_x(coords: Any) -> float:
    while coords and not isinstance(coords[0], (int, float)):
        coords = coords[0]
    return float(coords[0]) if coords else 0.0


def _into_turn(layer: pdk.Layer, *, west: float, raster_shift: float) -> None:
    """Move a layer's longitudes by whole turns into ``[west, west + 360)`` (a point by its own,
    a tile, path or polygon by its first vertex's); a raster's bounds by ``raster_shift``."""

    def turned(x: float) -> float:
        return float(wrap_longitude(x, west=west)) - x

    if layer.type == "BitmapLayer":
        w, s, e, n = layer.bounds
        layer.bounds = [w + raster_shift, s, e + raster_shift, n]
        return
    data = layer.data
    if isinstance(data, Mapping):  # GeoJSON
        for feat in data.get("features") or []:
            geom = feat.get("geometry") or {}
            if geom.get("type") == "Polygon":
                geom["coordinates"] = _shift_x(
                    geom["coordinates"], turned(_first_x(geom["coordinates"]))
                )
            elif geom.get("type") == "MultiPolygon":
                geom["coordinates"] = [
                    _shift_x(poly, turned(_first_x(poly))) for poly in geom["coordinates"]
                ]
        return
    rows = data if isinstance(data, list) else []
    points = [row for row in rows if "lon" in row]
    lon = np.array([float(row["lon"]) for row in points])
    for row, shift in zip(points, wrap_longitude(lon, west=west) - lon, strict=True):
        row["lon"] = float(row["lon"] + shift)
        if "polygon" in row:
            row["polygon"] = _shift_x(row["polygon"], float(shift))
    for row in rows:
        if "lon" not in row and "path" in row:
            row["path"] = _shift_x(row["path"], turned(_first_x(row["path"])))


def view_longitude(bounds: Bounds) -> float:
    """The longitude of the bounds' middle in [-180, 180) (where deck.gl keeps a view centre)."""
    return float(wrap_longitude((bounds[0] + bounds[2]) / 2, west=-180.0))


def fit_view(bounds: Bounds, width_px: int = 900, height_px: int = 520) -> pdk.ViewState:
    """A view state centred on the bounds, zoomed so they fit the given canvas size, with the
    centre's longitude in [-180, 180): deck.gl moves a centre beyond it a whole turn away from
    the bounds, so :func:`deck` moves the layers into the view's turn."""
    west, south, east, north = bounds
    lon = view_longitude(bounds)
    lat = (south + north) / 2

    def merc_y(la: float) -> float:
        la = max(min(la, 85.0), -85.0)
        return math.log(math.tan(math.pi / 4 + math.radians(la) / 2))

    dx = max(east - west, 1e-6) / 360.0
    dy = max(merc_y(north) - merc_y(south), 1e-9) / (2 * math.pi)
    zoom_x = math.log2(width_px / 512.0 / dx)
    zoom_y = math.log2(height_px / 512.0 / dy)
    zoom = max(min(zoom_x, zoom_y) - 0.15, 0.0)
    return pdk.ViewState(longitude=lon, latitude=lat, zoom=round(zoom, 2), pitch=0, bearing=0)


class CompactDeck(pdk.Deck):
    """A ``pydeck.Deck`` serialised without indentation (about half the JSON of ``to_json``)."""

    def to_json(self) -> str:
        """Compact JSON of the deck (what ``st.pydeck_chart`` sends to the browser)."""
        return json.dumps(self, sort_keys=True, default=default_serialize, separators=(",", ":"))


def deck(
    layers: Sequence[pdk.Layer],
    bounds: Bounds,
    *,
    tooltip: bool = True,
    width_px: int = 900,
    height_px: int = 520,
    basemap: str | None = None,
) -> pdk.Deck:
    """Assemble a deck with an ``{label}`` HTML tooltip, drawn over the map style ``basemap``
    (a style URL) or over no base map at all (:data:`NO_BASE_MAP`, the default). Bounds across
    the 180° meridian (a region's frame) move every layer's longitudes into the view's turn
    (:func:`view_longitude`), in place."""
    centre = view_longitude(bounds)
    turn = centre - (bounds[0] + bounds[2]) / 2
    if turn != 0.0 or bounds[0] + turn < -180.0 or bounds[2] + turn > 180.0:
        for layer in layers:  # across the 180° meridian: everything into the view's turn
            _into_turn(layer, west=centre - 180.0, raster_shift=turn)
    out = CompactDeck(
        layers=list(layers),
        initial_view_state=fit_view(bounds, width_px, height_px),
        map_style=None,
        tooltip={"html": "{label}", "style": {"fontSize": "12px"}} if tooltip else False,
    )
    out.map_style = basemap or NO_BASE_MAP
    return out
