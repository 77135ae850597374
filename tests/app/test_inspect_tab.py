"""The Inspect tab: the parts of what a place gets (area, tile, test, offset, pull), the preset
points and typed coordinates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from apptest_helpers import AppFactory, assert_clean, element_types, open_tab, tab, texts
from streamlit.testing.v1 import AppTest

from app import loaders
from app.ui import MAP_QUANTITY_KEY
from geodbk.geo.contract import Z95


def _at_measured_cell(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> tuple[AppTest, loaders.Grid, int, int]:
    """The demo app with its Inspect point in a cell whose tile has measured history, the
    download grid and that cell's (row, col)."""
    root, name = demo_root
    path = root / name / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    rows, cols = np.nonzero(np.nan_to_num(grid.arrays["tile_history"]) == 1.0)
    assert rows.size
    r, c = int(rows[0]), int(cols[0])
    at = make_app(root, name)
    at.session_state["inspect_point"] = (float(grid.lon[c]), float(grid.lat[r]))
    return at, grid, r, c


def test_inspect_shows_the_three_quantities_and_the_tiles_offset(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    at, grid, r, c = _at_measured_cell(make_app, demo_root)
    at.run()
    inspect = open_tab(at, "Inspect a point")
    assert_clean(at)
    assert any(m.startswith("**What this place gets**") for m in texts(inspect, "markdown"))
    frames = [d.value for d in inspect.dataframe]
    parts = next(f for f in frames if "quantity" in f.columns)
    names = parts["quantity"].tolist()
    assert names[:3] == [
        "area: neighbourhood level f(x)",
        "tile: what the tile here typically gets",
        "test: one speed test",
    ]
    assert names[3] == "tile's offset (measured history)"
    assert names[4] == "of which its neighbours' pull"
    offset = float(grid.arrays["tile_offset"][r, c])
    assert parts["median"].iloc[3] == f"×{10**offset:.2f}"
    # one test around the tile: the grid's tests shift and the noise between test_sd and tile_sd
    assert names[5] == "one test's noise (its shift; 95% spread)"
    moved = float(grid.attrs.get("test_mean_shift", 0.0))
    assert parts["median"].iloc[5] == f"×{10**moved:.2f}"
    test_sd, tile_sd = (float(grid.arrays[n][r, c]) for n in ("test_sd", "tile_sd"))
    noise_sd = np.sqrt(test_sd**2 - tile_sd**2)
    assert noise_sd > 0.05  # one test is noisy
    assert parts["95% interval"].iloc[5] == f"×/÷ {10 ** (Z95 * noise_sd):.2f}"


def test_demo_inspect_presets_and_coordinates(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    inspect = open_tab(at, "Inspect a point")
    options = at.selectbox(key="inspect_source").options
    assert options[0] == "Clicked point" and options[-1] == "Coordinates"
    assert {"Urban (preset)", "Rural (preset)", "Remote (preset)"} <= set(options)
    for option in options[1:-1]:
        at.selectbox(key="inspect_source").set_value(option).run()
        assert_clean(at)
        inspect = tab(at, "Inspect a point")
        assert element_types(inspect)["metric"] == 3, option
    at.selectbox(key="inspect_source").set_value("Coordinates").run()
    lon0 = float(at.number_input(key="inspect_lon").value or 0.0)
    at.number_input(key="inspect_lon").set_value(lon0 + 0.01).run()
    at.number_input(key="inspect_lat").set_value(at.number_input(key="inspect_lat").value).run()
    assert_clean(at)
    assert element_types(tab(at, "Inspect a point"))["metric"] == 3
    # A point far outside the region is flagged as an extrapolation, not an error.
    at.number_input(key="inspect_lon").set_value(0.0).run()
    assert_clean(at)
    area = [m for m in texts(tab(at, "Inspect a point"), "markdown") if m.startswith("**Area:**")]
    assert "outside the modelled region" in area[0]


def test_inspect_headline_is_the_map_tabs_quantity_at_the_cell(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    from app.colormaps import format_value
    from app.runs import RAW_TO_NATURAL

    at, grid, r, c = _at_measured_cell(make_app, demo_root)
    shift = np.log10(RAW_TO_NATURAL["download"])
    for quantity, heading, variable in (
        ("tile", "tile: what the tile here typically gets", "tile_mean"),
        ("latent", "area: neighbourhood level f(x)", "area_mean"),
    ):
        at.session_state[MAP_QUANTITY_KEY] = quantity
        inspect = open_tab(at, "Inspect a point")
        assert f"**{heading}**" in texts(inspect, "markdown"), quantity
        median = 10 ** (float(grid.arrays[variable][r, c]) - shift)
        assert inspect.metric[0].value == format_value(median), quantity
    # a measured tile's level differs from its neighbourhood's, so the two headlines differ
    assert not np.isclose(grid.arrays["tile_mean"][r, c], grid.arrays["area_mean"][r, c])


def test_the_density_chart_is_tall_enough_to_read() -> None:
    """The predictive density had about 60 px of plot at 180 px (title and axis included)."""
    from app.points import PointSummary
    from app.tabs.inspect_tab import DENSITY_HEIGHT, _density_chart

    spec = _density_chart(PointSummary.from_log10(1.6, 0.1), "Mbps").to_dict()
    assert spec["height"] == DENSITY_HEIGHT >= 240


def test_a_quarter_without_a_grid_is_not_shown_another_quarters_cell(
    make_app: AppFactory, demo_root: tuple[Path, str], tmp_path: Path
) -> None:
    import shutil

    from app.tabs.inspect_tab import MODEL_HEADING

    root, name = demo_root
    run = shutil.copytree(root / name, tmp_path / "runs" / name)
    (run / "grids" / "download_2023Q1.nc").unlink()  # 2023Q1: the model's, without a grid
    at, grid, _r, _c = _at_measured_cell(make_app, (run.parent, name))
    assert grid.attrs.get("quarter") == "2023Q4"
    inspect = open_tab(at, "Inspect a point")
    assert any("From the grid cell of 2023Q4" in x for x in texts(inspect, "caption"))
    at.select_slider(key="quarter_inspect_download").set_value("2023Q1").run()
    assert_clean(at)
    inspect = tab(at, "Inspect a point")
    assert inspect.subheader[0].value.endswith("in 2023Q1")
    # the headline is the model at 2023Q1, not the 2023Q4 grid's cell named as 2023Q1's
    assert f"**{MODEL_HEADING}**" in texts(inspect, "markdown")
    captions = texts(inspect, "caption")
    assert not any("From the grid cell of 2023Q1" in x for x in captions), captions
    assert any("for 2023Q1" in x for x in captions), captions
    # and no table of the 2023Q4 cell's parts
    assert "**What this place gets** (grid cell; 95% intervals)" not in texts(inspect, "markdown")


def test_the_gp_alone_sentence_names_its_unit(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    import re

    at, _grid, _r, _c = _at_measured_cell(make_app, demo_root)
    at.run()
    for target, unit in (("download", "Mbps"), ("latency", "ms")):
        at.sidebar.selectbox(key="target").set_value(target)
        inspect = open_tab(at, "Inspect a point")
        gp = [x for x in texts(inspect, "caption") if "The GP alone at this exact point" in x]
        assert gp, target
        sentence = gp[0].split("The GP alone at this exact point")[1]
        assert re.search(
            rf"median [\d.,]+ {unit}, 95% interval [\d.,]+–[\d.,]+ {unit}\.", sentence
        ), sentence


def test_the_inspect_map_draws_the_map_tabs_quantity(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    import json

    from app import maps
    from app.colormaps import format_value
    from app.layers import PICK_LAYER_ID

    at, grid, _r, _c = _at_measured_cell(make_app, demo_root)
    at.session_state[MAP_QUANTITY_KEY] = "latent"
    inspect = open_tab(at, "Inspect a point")
    assert any(
        x.startswith("Predicted median of 2023Q4, area: neighbourhood level f(x)")
        for x in texts(inspect, "caption")
    ), texts(inspect, "caption")
    deck = json.loads(inspect.get("deck_gl_json_chart")[0].proto.json)
    points = next(x for x in deck["layers"] if x.get("id") == PICK_LAYER_ID)["data"]
    area = maps.layer_values(grid, maps.LayerSpec("median", quantity="latent"))
    for d in points[:50]:
        rr = int(np.argmin(np.abs(grid.lat - float(d["lat"]))))
        cc = int(np.argmin(np.abs(grid.lon - float(d["lon"]))))
        assert str(d["label"]).startswith(f"<b>{format_value(area[rr, cc])}</b>"), d["label"]


def test_a_grid_without_a_tile_effect_shows_no_tile_offset(
    make_app: AppFactory, demo_root: tuple[Path, str], tmp_path: Path
) -> None:
    """A target trained without a tile effect (the tile is f plus the noise floor) has no tile
    offset: the parts table must not list one as '(no history)' for a measured tile."""
    import shutil

    import xarray as xr

    root, name = demo_root
    run = shutil.copytree(root / name, tmp_path / "runs" / name)
    path = run / "grids" / "latency.nc"
    with xr.open_dataset(path) as ds:
        grid = ds.load()
    grid.attrs["tile_effect"] = 0
    grid["tile_offset"] = grid["tile_offset"] * 0.0
    grid["tile_pull"] = grid["tile_pull"] * 0.0
    grid.to_netcdf(path)
    at, _grid, _r, _c = _at_measured_cell(make_app, (run.parent, name))
    at.run()
    at.sidebar.selectbox(key="target").set_value("latency")
    inspect = open_tab(at, "Inspect a point")
    parts = inspect.dataframe[0].value
    assert not any("offset" in q or "pull" in q for q in parts["quantity"]), list(parts["quantity"])
    captions = texts(inspect, "caption")
    assert any("no tile effect was fitted for latency" in c for c in captions), captions
    assert not any("its measured history, and the pull" in c for c in captions), captions
