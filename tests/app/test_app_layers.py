"""The deck.gl layers: the raster bitmap, outlines with holes, the view that fits a region and
the base map only when given a style."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from shapely.geometry import box, mapping

from app import layers as L
from app.colormaps import png_data_url
from app.layers import NO_BASE_MAP, bitmap_layer, deck, fit_view, outline_paths, outlines_layer


def test_png_data_url_and_bitmap_layer_keep_the_url_as_a_string() -> None:
    url = png_data_url(np.zeros((3, 4, 4), dtype=np.uint8))
    assert url.startswith("data:image/png;base64,")
    layer = bitmap_layer(url, (-1.0, -2.0, 3.0, 4.0))
    js = deck([layer], (-1.0, -2.0, 3.0, 4.0)).to_json()
    doc = json.loads(js)
    assert doc["layers"][0]["image"] == url  # not turned into a "@@=" accessor expression
    assert doc["layers"][0]["bounds"] == [-1.0, -2.0, 3.0, 4.0]
    assert doc["mapStyle"] == NO_BASE_MAP  # Streamlit then draws no (network) base map
    assert "\n" not in js and ", " not in js.replace(url, "")  # compact JSON


def test_outlines_are_one_path_layer_with_rings_and_holes() -> None:
    square = [[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]
    hole = [[0.2, 0.2], [0.4, 0.2], [0.4, 0.4], [0.2, 0.2]]
    fc = {
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [square, hole]}},
            {
                "type": "Feature",
                "geometry": {"type": "MultiPolygon", "coordinates": [[square], [square]]},
            },
            {"type": "Feature", "geometry": None},
            {"type": "Feature", "geometry": {"type": "Point", "coordinates": [0, 0]}},
        ],
    }
    paths = outline_paths(fc)
    assert len(paths) == 4 and paths[1] == [[0.2, 0.2], [0.4, 0.2], [0.4, 0.4], [0.2, 0.2]]
    layer = outlines_layer([(paths[:1], (255, 255, 255, 200), 3.0), (paths, (0, 0, 0, 255), 1.0)])
    doc = json.loads(deck([layer], (0.0, 0.0, 1.0, 1.0)).to_json())["layers"][0]
    assert doc["@@type"] == "PathLayer" and doc["widthUnits"] == "pixels"
    assert len(doc["data"]) == 5 and doc["data"][0]["width"] == 3.0  # the halo first
    assert doc["data"][-1]["color"] == [0, 0, 0, 255]


def test_fit_view_centres_and_zooms_out_for_bigger_regions() -> None:
    small = fit_view((-158.0, 21.2, -157.6, 21.6))
    big = fit_view((-160.0, 18.0, -154.0, 23.0))
    assert small.longitude == pytest.approx(-157.8) and small.latitude == pytest.approx(21.4)
    assert small.zoom > big.zoom > 0


def test_deck_draws_a_base_map_only_when_given_a_style() -> None:
    from app.basemap import BASEMAP_STYLE, reachable

    layers = [bitmap_layer("data:image/png;base64,AAAA", (0.0, 0.0, 1.0, 1.0))]
    assert json.loads(deck(layers, (0.0, 0.0, 1.0, 1.0)).to_json())["mapStyle"] == NO_BASE_MAP
    styled = deck(layers, (0.0, 0.0, 1.0, 1.0), basemap=BASEMAP_STYLE)
    assert json.loads(styled.to_json())["mapStyle"] == BASEMAP_STYLE
    assert reachable("127.0.0.1", port=9, timeout_s=0.5) is False  # nothing listens there


def test_a_map_across_the_180_meridian_draws_every_layer_in_the_views_turn() -> None:
    bounds = (179.85, 51.5, 180.16, 51.75)  # a grid in its region's frame, east of 180
    points = pd.DataFrame({"lon": [179.9, 180.1], "lat": [51.6, 51.6], "label": ["w", "e"]})
    halves = {
        "type": "FeatureCollection",
        "features": [
            {"type": "Feature", "properties": {}, "geometry": mapping(box(a, 51.5, b, 51.75))}
            for a, b in ((179.85, 180.0), (-180.0, -179.85))
        ],
    }
    paths = L.outline_paths(halves)
    tiles = pd.DataFrame(
        {"west": [179.99, -180.0], "south": 51.6, "east": [180.0, -179.99], "north": 51.61}
    ).assign(lon=lambda f: (f.west + f.east) / 2, lat=51.605, label=["w", "e"])
    layers = [
        L.bitmap_layer("data:,", bounds),
        L.tiles_layer(tiles, np.full((2, 4), 200, dtype=np.uint8)),
        L.click_grid_layer(points, 10.0),
        L.outlines_layer([(paths, (0, 0, 0, 255), 1.0)]),
        L.outline_layer(halves, "fill", (0, 0, 0, 0), 0.0, (1, 1, 1, 255)),
    ]
    doc = json.loads(L.deck(layers, bounds).to_json())
    centre = doc["initialViewState"]["longitude"]
    assert -180.0 <= centre < 180.0
    by_id = {layer["id"]: layer for layer in doc["layers"]}
    west, _, east, _ = by_id["raster"]["bounds"]
    assert west < centre < east and east - west == pytest.approx(0.31)
    xs = [p["lon"] for p in by_id[L.PICK_LAYER_ID]["data"]]
    xs += [x for row in by_id[L.TILES_LAYER_ID]["data"] for x, _ in row["polygon"]]
    xs += [x for row in by_id[L.OUTLINES_LAYER_ID]["data"] for x, _ in row["path"]]
    for feat in by_id["fill"]["data"]["features"]:
        xs += [x for ring in feat["geometry"]["coordinates"] for x, _ in ring]
    assert west - 1e-9 <= min(xs) and max(xs) <= east + 1e-9  # all beside the raster
