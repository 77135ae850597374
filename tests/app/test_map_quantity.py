"""The map tab's quantity choice ("What the map shows") reaches the colour range, the hover
labels, the selected point's caption and the sd caption, not only the raster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from apptest_helpers import AppFactory, assert_clean, legend_titles, tab, texts

from app import maps
from app.colormaps import format_value
from app.layers import PICK_LAYER_ID
from app.loaders import Grid, load_grid, stamp


def _grid(root: Path, name: str) -> Grid:
    path = root / name / "grids" / "download.nc"
    return load_grid(str(path), stamp(path), "download")


def _ticks(legend: str) -> list[float]:
    """The numbers of a legend's tick labels."""
    labels = re.findall(r'white-space:nowrap">([^<]*)</span>', legend)
    return [float(x.replace(",", "")) for x in labels if re.fullmatch(r"[\d.,]+", x)]


def _map_app(make_app: AppFactory, demo_root: tuple[Path, str]) -> Any:
    """The demo app, run once on its Map tab."""
    at = make_app(*demo_root)
    at.run()
    return at


def test_bounds_colour_range_is_the_shown_quantitys(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    grid = _grid(*demo_root)
    at = _map_app(make_app, demo_root)
    at.selectbox(key="layer").set_value("pi_upper").run()
    at.selectbox(key="quantity").set_value("single").run()
    assert_clean(at)
    upper = maps.layer_values(grid, maps.LayerSpec("pi_upper", quantity="single"))
    upper = upper[np.isfinite(upper)]
    ticks = _ticks(legend_titles(tab(at, "Map"))[0])
    # a single test's upper bounds lie inside the legend's range, not past its top end
    assert ticks and max(ticks) >= float(np.median(upper)) * 0.5, (ticks, np.median(upper))
    scale = maps.layer_scale(grid, maps.LayerSpec("pi_upper", quantity="single"))
    assert np.mean(upper > scale.vmax) < 0.05


def _hover_labels(at: object) -> list[dict[str, object]]:
    deck = json.loads(tab(at, "Map").get("deck_gl_json_chart")[0].proto.json)
    layer = next(x for x in deck["layers"] if x.get("id") == PICK_LAYER_ID)
    data: list[dict[str, object]] = layer["data"]
    return data


def test_hover_and_selected_point_give_the_shown_quantity(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    grid = _grid(*demo_root)
    at = _map_app(make_app, demo_root)
    at.selectbox(key="quantity").set_value("latent").run()
    assert_clean(at)
    area = maps.layer_values(grid, maps.LayerSpec("median", quantity="latent"))
    tile = grid.natural("mean")
    # a cell where the area and tile medians read differently
    rows, cols = np.nonzero(grid.in_region & (np.abs(area / tile - 1) > 0.2))
    assert rows.size, "the demo grid has no cell whose area and tile medians differ"
    r, c = int(rows[0]), int(cols[0])
    point = (float(grid.lon[c]), float(grid.lat[r]))
    at.session_state["inspect_point"] = point
    at.run()
    assert_clean(at)
    caps = [x for x in texts(tab(at, "Map"), "caption") if x.startswith("Selected point")]
    assert caps and f"median {format_value(area[r, c], 'Mbps')}" in caps[0], caps
    assert "area" in caps[0]
    # the hover labels give the area medians too
    labels = _hover_labels(at)
    medians = {
        (round(float(d["lon"]), 5), round(float(d["lat"]), 5)): str(d["label"]) for d in labels
    }
    for (lon, lat), label in list(medians.items())[:50]:
        cc = int(np.argmin(np.abs(grid.lon - lon)))
        rr = int(np.argmin(np.abs(grid.lat - lat)))
        assert label.startswith(f"<b>{format_value(area[rr, cc])}</b>"), (label, area[rr, cc])


def test_sd_caption_names_the_noise_of_the_shown_quantity(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    at = _map_app(make_app, demo_root)
    at.selectbox(key="layer").set_value("std").run()
    caps = texts(tab(at, "Map"), "caption")
    assert any("tile noise included" in x for x in caps), caps
    at.selectbox(key="quantity").set_value("latent").run()
    assert_clean(at)
    caps = texts(tab(at, "Map"), "caption")
    assert not any("tile noise included" in x for x in caps), caps
    assert any("no tile or test noise" in x for x in caps), caps
    assert "area" in legend_titles(tab(at, "Map"))[0]


def test_the_chosen_quantity_survives_reruns_of_other_tabs(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    """Streamlit drops a widget's state after a run that does not draw it: the choice made on
    the Map tab must still be the Inspect tab's after it reruns, and the Map tab's when it
    comes back."""
    from apptest_helpers import open_tab

    at = _map_app(make_app, demo_root)
    at.selectbox(key="quantity").set_value("latent").run()
    assert_clean(at)
    inspect = open_tab(at, "Inspect a point")
    for _ in range(2):
        at.run()
        assert_clean(at)
    inspect = tab(at, "Inspect a point")
    assert any("area: neighbourhood level f(x)" in c for c in texts(inspect, "caption")), texts(
        inspect, "caption"
    )
    open_tab(at, "Map")
    assert at.selectbox(key="quantity").value == "latent"
