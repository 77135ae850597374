"""``geodbk predict``'s checks and descriptions: grid options and size, the map's box, the trend
spec, the quantity labels and the warning before another quantity's map is replaced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from geodbk.errors import DataError
from geodbk.geo.grids import make_grid
from geodbk.quantities import describe_quantity
from pipelines.predict import (
    AREA_LABEL,
    TILE_MARGIN_DEG,
    check_grid_options,
    check_grid_size,
    crs_attributes,
    describe_map_quantity,
    grid_bounds,
    warn_replacing_map,
)
from pipelines.rundir import RunDir

BOX = (-158.0, 18.0, -154.0, 22.0)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"resolution": float("nan"), "tile_zoom": None, "max_cells": 10}, "--resolution"),
        ({"resolution": -0.1, "tile_zoom": None, "max_cells": 10}, "--resolution"),
        ({"resolution": None, "tile_zoom": 24, "max_cells": 10}, "--tile-zoom must be"),
        ({"resolution": None, "tile_zoom": None, "max_cells": 0}, "--max-cells must be"),
    ],
)
def test_bad_grid_options_are_refused(options: dict, match: str) -> None:
    # valid options come back as map_grid's keyword arguments (extent and force defaulted)
    assert check_grid_options(resolution=0.01, tile_zoom=None, max_cells=1) == {
        "resolution": 0.01,
        "tile_zoom": None,
        "max_cells": 1,
        "extent": "tiles",
        "force": False,
    }
    with pytest.raises(DataError, match=match):
        check_grid_options(**options)


def test_grid_size_is_checked_before_any_work() -> None:
    grid = make_grid(BOX, resolution=0.5)  # 8 x 8 cells
    check_grid_size(grid, BOX, max_cells=64, force=False, n_vars=40)
    with pytest.raises(DataError, match=r"more than --max-cells 10.*--force"):
        check_grid_size(grid, BOX, max_cells=10, force=False, n_vars=40)
    check_grid_size(grid, BOX, max_cells=10, force=True, n_vars=40)
    coarse = make_grid(BOX, resolution=5.0)
    with pytest.raises(DataError, match="too coarse to map"):
        check_grid_size(coarse, BOX, max_cells=10, force=True, n_vars=40)


def test_the_map_box_is_cut_to_the_tiles_with_a_margin(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    table = pa.table({"lon": [-157.0, -156.0, float("nan")], "lat": [19.0, 20.5, 30.0]})
    pq.write_table(table, rd.tiles, row_group_size=1)
    assert grid_bounds(rd, BOX, extent="region") == BOX
    m = TILE_MARGIN_DEG
    assert grid_bounds(rd, BOX, extent="tiles") == pytest.approx(
        (-157.0 - m, 19.0 - m, -156.0 + m, 20.5 + m)
    )
    with pytest.raises(DataError, match="extent must be"):
        grid_bounds(rd, BOX, extent="world")
    assert 'AUTHORITY["EPSG","4326"]' in crs_attributes()["crs_wkt"]


def test_crs_attributes_are_what_rioxarray_writes_and_a_fresh_copy() -> None:
    import rioxarray  # noqa: F401  (registers .rio)
    import xarray as xr

    written = dict(xr.Dataset().rio.write_crs("EPSG:4326")["spatial_ref"].attrs)
    ours = crs_attributes()
    assert ours == written
    ours["crs_wkt"] = "changed"
    assert crs_attributes()["crs_wkt"] == written["crs_wkt"]


def test_quantity_labels_name_tests_devices_and_layers() -> None:
    constant = SimpleNamespace(tests_aware=False)
    tests = SimpleNamespace(tests_aware=True, devices_aware=True, noise_urban=True)
    assert describe_quantity(constant, 5) == "observation (constant noise)"
    assert describe_quantity(tests, 1).startswith("single speed test (tests=1), each cell's")
    assert describe_quantity(tests, 4, 2).startswith(
        "tile average of 4 speed tests from 2 devices (tests=4, devices=2)"
    )
    assert describe_map_quantity(tests, "area", 1, None, effect=None)[0] == AREA_LABEL
    assert (
        describe_map_quantity(tests, "tile", 1, None, effect=None)[0]
        == "tile: what the tile here typically gets (noise floor)"
    )
    assert (
        describe_map_quantity(tests, "tile", 1, None, effect=1)[0]
        == "tile: what the tile here typically gets (tile effect)"
    )
    label = describe_map_quantity(tests, "tile", 1, None, effect=1, layer=1)[0]
    assert label == "tile: what the tile here typically gets (local layer)"
    label, text = describe_map_quantity(constant, "test", 1, None, effect=None)
    assert (label, text) == ("test: observation (constant noise)", "observation (constant noise)")


def test_replacing_a_map_of_another_quantity_is_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import xarray as xr

    out = tmp_path / "download.nc"
    warn_replacing_map(out, "area")  # no grid yet: nothing to say
    xr.Dataset({"mean": ("x", [1.0])}, attrs={"quantity": "tile"}).to_netcdf(out)
    with caplog.at_level("WARNING", logger="geodbk"):
        warn_replacing_map(out, "tile")
        assert not caplog.records
        warn_replacing_map(out, "area")
    assert "holds the tile quantity's map" in caplog.text
    assert "--quantity tile" in caplog.text


def test_replacing_a_map_of_another_cell_size_or_extent_is_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A coarse quick look after a fine map replaces ``grids/TARGET.nc``: the warning names
    the old cell size and extent and the options that write them again."""
    import xarray as xr

    out = tmp_path / "download.nc"
    attrs = {"quantity": "tile", "resolution_deg": [0.001, 0.001], "extent": "region"}
    xr.Dataset({"mean": ("x", [1.0])}, attrs=attrs).to_netcdf(out)
    with caplog.at_level("WARNING", logger="geodbk"):
        warn_replacing_map(out, "tile", resolution_deg=(0.001, 0.001), extent="region")
        assert not caplog.records
        warn_replacing_map(out, "tile", resolution_deg=(0.01, 0.01), extent="tiles")
    assert "holds a map of 0.001° x 0.001° cells" in caplog.text
    assert "one of 0.01° x 0.01° cells" in caplog.text
    assert "--resolution 0.001" in caplog.text
    assert "over the region extent" in caplog.text and "--extent region" in caplog.text


def test_map_quarter_status_and_the_extrapolation_warning_follow_the_model() -> None:
    from geodbk.geo.timeaxis import TimeScaling
    from pipelines.places import map_quarter_status, time_extrapolation_warning

    ts = TimeScaling(first="2021Q1", last="2023Q4")
    seen = ["2021Q1", "2023Q4"]
    assert map_quarter_status(ts, "2022Q2", observed=seen) == "observed"
    assert map_quarter_status(ts, "2024Q2", observed=seen) == "extrapolation beyond 2023Q4"
    assert map_quarter_status(None, None, observed=seen) == "pooled"
    assert map_quarter_status(None, None, observed=seen, tile_offsets=True) == (
        "pooled; tile offsets at 2023Q4"
    )
    hold = time_extrapolation_warning("download", "2024Q2", ts, {"time_extrapolation": "hold"})
    trend = time_extrapolation_warning("download", "2020Q1", ts, {})  # unrecorded: trend
    assert hold.startswith("download 2024Q2: extrapolation beyond 2023Q4 (trained on 2021Q1..")
    assert "holds f at the nearest trained quarter (time extrapolation 'hold')" in hold
    assert "extrapolation before 2021Q1" in trend
    assert "extrapolates the trend (time extrapolation 'trend')" in trend


def test_replacing_a_test_map_of_other_tests_is_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`--quantity test --tests 8` after `--tests 4`: one quantity, another answer (the
    average of 8 tests, not of 4); the grid it replaces is named with its tests."""
    import xarray as xr

    out = tmp_path / "download.nc"
    attrs = {"quantity": "test", "tests": 4.0, "devices": 4.0}
    xr.Dataset({"mean": ("x", [1.0])}, attrs=attrs).to_netcdf(out)
    with caplog.at_level("WARNING", logger="geodbk"):
        warn_replacing_map(out, "test", tests=4.0, devices=4.0)
        assert not caplog.records
        warn_replacing_map(out, "test", tests=8.0, devices=8.0)
    assert "holds the test quantity's map of 4 tests from 4 devices" in caplog.text
    assert "replaced by that of 8 tests from 8 devices" in caplog.text
    assert "--quantity test --tests 4 --devices 4" in caplog.text
