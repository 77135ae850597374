"""``geodbk summarize``: area summaries on the quick demo run against its grid and tiles."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import shapely
import xarray as xr

from geodbk.geo.areas import read_areas
from geodbk.geo.grids import Grid
from geodbk.geo.timeaxis import format_quarter, quarter_index
from pipelines import cli
from pipelines.rundir import DEFAULT_THRESHOLDS, RunDir, target_spec
from pipelines.summarize import (
    SUMMARY_KEY,
    _warn_on_empty_areas_in_region,
    run_summarize,
    summary_columns,
    summary_paths,
    tier_name,
)

SAMPLES = 4000
#: The quick demo's grid (``geodbk demo --quick`` caps it at 2,500 cells).
QUICK_CELLS = 2500


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("summarize") / "run"
    shutil.copytree(tiny_run, r, ignore=shutil.ignore_patterns("checkpoints", "exports"))
    return r


@pytest.fixture(scope="module")
def grid(run: Path) -> xr.Dataset:
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        return ds.load()


def _cell_box(grid: xr.Dataset, i: int, j: int, shrink: float = 0.25) -> shapely.Polygon:
    """A box around cell (i, j)'s centre, ``shrink`` of a cell inside its edges."""
    x, y = float(grid.x[j]), float(grid.y[i])
    dx = float(abs(grid.x[1] - grid.x[0]))
    dy = float(abs(grid.y[1] - grid.y[0]))
    return shapely.box(
        x - (0.5 - shrink) * dx,
        y - (0.5 - shrink) * dy,
        x + (0.5 - shrink) * dx,
        y + (0.5 - shrink) * dy,
    )


@pytest.fixture(scope="module")
def areas_file(run: Path, grid: xr.Dataset) -> tuple[Path, tuple[int, int]]:
    """One-cell, whole-grid and outside polygons (GeoJSON, EPSG:3857 to test reprojection)."""
    inside = grid["in_region"].to_numpy()
    rows, cols = np.nonzero(inside)
    k = rows.size // 2
    cell = (int(rows[k]), int(cols[k]))
    x, y = grid.x.to_numpy(), grid.y.to_numpy()
    whole = shapely.box(x.min() - 1, y.min() - 1, x.max() + 1, y.max() + 1)
    gdf = gpd.GeoDataFrame(
        {"GEOID": ["one", "all", "far"], "NAME": ["one cell", "whole grid", "elsewhere"]},
        geometry=[_cell_box(grid, *cell), whole, shapely.box(10, 10, 11, 11)],
        crs="EPSG:4326",
    ).to_crs("EPSG:3857")
    path = run.parent / "areas.geojson"
    gdf.to_file(path)
    return path, cell


@pytest.fixture(scope="module")
def summary(run: Path, areas_file: tuple[Path, tuple[int, int]]) -> pd.DataFrame:
    out = run_summarize(
        run,
        target="download",
        areas=areas_file[0],
        samples=SAMPLES,
        max_cells=QUICK_CELLS,
        seed=1,
    )
    assert out == summary_paths(RunDir(run), "download", areas_file[0])[0]
    return gpd.read_parquet(out).set_index("id")


def test_a_one_cell_polygon_equals_that_cell_s_prediction(
    summary: pd.DataFrame, grid: xr.Dataset, areas_file: tuple[Path, tuple[int, int]]
) -> None:
    i, j = areas_file[1]
    row = summary.loc["one"]
    assert row["n_cells"] == 1 and row["cells_from"] == "centres" and row["name"] == "one cell"
    mean, sd = float(grid["mean"][i, j]), float(grid["std"][i, j])
    np.testing.assert_allclose(row["mean_log10"], mean, rtol=1e-5)  # exact: the cell's mean
    np.testing.assert_allclose(row["mean_natural"], 10**mean / 1000, rtol=1e-4)
    # the 90% interval of one cell is mean -+ 1.645 sd, within Monte Carlo error
    assert abs(row["lower_log10"] - (mean - 1.645 * sd)) < 0.1 * sd
    assert abs(row["upper_log10"] - (mean + 1.645 * sd)) < 0.1 * sd
    np.testing.assert_allclose(row["independent_upper_log10"] - mean, 1.6449 * sd, rtol=1e-3)
    share = 1.0 - float(grid["p_below_25mbps"][i, j])
    np.testing.assert_allclose(row["share_ge_25mbps"], share, atol=1e-5)
    # one cell is served or not: the sampled share is 0 or 1, the interval extended to the point
    point, lower, upper = (row[f"share_ge_25mbps{s}"] for s in ("", "_lower", "_upper"))
    assert {lower, upper} <= {0.0, 1.0, point} and lower <= point <= upper


def test_a_polygon_covering_the_grid_equals_the_global_area_mean(
    summary: pd.DataFrame, grid: xr.Dataset
) -> None:
    row = summary.loc["all"]
    inside = grid["in_region"].to_numpy()
    w = np.broadcast_to(np.cos(np.radians(grid.y.to_numpy()))[:, None], inside.shape)[inside]
    values = grid["mean"].to_numpy()[inside].astype(np.float64)
    assert row["n_cells"] == inside.sum() and row["cells_from"] == "centres"
    np.testing.assert_allclose(row["mean_log10"], (w * values).sum() / w.sum(), rtol=1e-6)
    served = 1.0 - grid["p_below_25mbps"].to_numpy()[inside].astype(np.float64)
    np.testing.assert_allclose(row["share_ge_25mbps"], (w * served).sum() / w.sum(), atol=1e-6)
    assert row["lower_log10"] < row["mean_log10"] < row["upper_log10"]
    # the cells share the model's error: the joint interval is wider than the independent one
    joint = row["upper_log10"] - row["lower_log10"]
    indep = row["independent_upper_log10"] - row["independent_lower_log10"]
    assert joint > 2 * indep
    assert 0 <= row["share_ge_100mbps_lower"] <= row["share_ge_100mbps_upper"] <= 1
    assert row["area_km2"] > 0 and row["polygon_area_km2"] > row["area_km2"]


def test_the_observed_tiles_of_the_mapped_quarter_weighted_by_tests(
    summary: pd.DataFrame, run: Path
) -> None:
    tiles = pd.read_parquet(
        run / "tiles.parquet", columns=["quadkey", "quarter", "tests", "avg_d_kbps"]
    )
    latest = tiles[tiles["quarter"] == tiles["quarter"].max()]  # the demo model is time-aware
    row = summary.loc["all"]
    assert row["quarter"] == latest["quarter"].iloc[0]
    assert row["n_tiles"] == latest["quadkey"].nunique()
    assert row["n_tests"] == latest["tests"].sum()
    raw = (latest["tests"] * latest["avg_d_kbps"]).sum() / latest["tests"].sum() / 1000
    np.testing.assert_allclose(row["tiles_raw_mean_natural"], raw, rtol=1e-9)
    geo = 10 ** ((latest["tests"] * np.log10(latest["avg_d_kbps"])).sum() / latest["tests"].sum())
    np.testing.assert_allclose(row["tiles_raw_geomean_natural"], geo / 1000, rtol=1e-9)
    assert row["tiles_lower_log10"] < row["tiles_mean_log10"] < row["tiles_upper_log10"]


def test_every_point_lies_in_its_interval_and_shares_within_0_and_1(
    run: Path, grid: xr.Dataset
) -> None:
    """One-cell areas served with probability near 0 or 1: the sampled share is 1 (or 0) in
    nearly every sample, so both sample quantiles sit at the bound while the expected share
    (the point) does not; the interval is extended to it."""
    inside = grid["in_region"].to_numpy()
    served = [1.0 - grid[f"p_below_{t:g}mbps"].to_numpy() for t in DEFAULT_THRESHOLDS["download"]]
    near = np.zeros_like(inside)
    for p in served:
        near |= ((p > 0.98) & (p < 0.997)) | ((p > 0.003) & (p < 0.02))
    rows, cols = np.nonzero(inside & near)
    assert rows.size, "the demo grid has no cell served with probability near 0 or 1"
    pick = np.linspace(0, rows.size - 1, min(rows.size, 40)).astype(int)
    src = run.parent / "near_bounds.geojson"
    gpd.GeoDataFrame(
        {"GEOID": [f"c{k}" for k in range(pick.size)]},
        geometry=[_cell_box(grid, int(rows[k]), int(cols[k])) for k in pick],
        crs=4326,
    ).to_file(src)
    out = run_summarize(run, target="download", areas=src, samples=200, max_cells=QUICK_CELLS)
    table = pd.read_parquet(out)
    spec = target_spec("download")
    for t in DEFAULT_THRESHOLDS["download"]:
        name = tier_name(spec, t)
        point, lo, hi = (table[f"{name}{s}"].to_numpy() for s in ("", "_lower", "_upper"))
        assert ((0.0 <= lo) & (lo <= point) & (point <= hi) & (hi <= 1.0)).all(), name
    for prefix in ("", "tiles_"):
        for unit in ("log10", "natural"):
            point, lo, hi = (
                table[f"{prefix}{kind}_{unit}"].to_numpy() for kind in ("mean", "lower", "upper")
            )
            ok = np.isfinite(point)
            assert ((lo[ok] <= point[ok]) & (point[ok] <= hi[ok])).all(), f"{prefix}{unit}"


def test_a_repeated_id_column_is_refused_naming_the_values_and_the_fix(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: xr.Dataset
) -> None:
    """Tracts carrying only their county code: the summary would hold several rows per id."""
    x, y = float(grid.x.mean()), float(grid.y.mean())
    boxes = [shapely.box(x + k * 0.01, y, x + (k + 1) * 0.01, y + 0.01) for k in range(4)]
    src = tmp_path / "tracts.geojson"
    gpd.GeoDataFrame(
        {"COUNTYFP": ["003", "003", "003", "001"], "GEOID": ["a", "b", "c", "d"]},
        geometry=boxes,
        crs=4326,
    ).to_file(src)
    args = ["summarize", "--run", str(run), "--target", "download", "--samples", "20"]
    assert cli.main([*args, "--areas", str(src), "--id-column", "COUNTYFP"]) == 3
    err = capsys.readouterr().err
    assert "tracts.geojson: column 'COUNTYFP' (--id-column) repeats" in err
    assert "'003' in 3 rows" in err and "'001'" not in err  # only the repeated ids
    assert "dissolve" in err and "such as GEOID" in err and "Columns found: COUNTYFP, GEOID" in err
    assert not summary_paths(RunDir(run), "download", src)[0].exists()


def test_a_polygon_outside_the_grid_is_an_empty_row(summary: pd.DataFrame) -> None:
    row = summary.loc["far"]
    assert row["n_cells"] == 0 and row["cells_from"] == "none" and row["n_tiles"] == 0
    assert row["area_km2"] == 0
    numeric = [c for c in summary.columns if c.endswith(("_log10", "_natural")) or "share" in c]
    assert row[numeric].isna().all()


def _grid(west: float, south: float, east: float, north: float, step: float) -> Grid:
    """A north-up grid of ``step``-degree cells over the box."""
    x = np.arange(west + step / 2, east, step)
    y = np.arange(north - step / 2, south, -step)
    return Grid(x=x, y=y, dx=step, dy=step)


def test_areas_on_land_the_map_does_not_reach_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "islands.geojson"
    gpd.GeoDataFrame(
        {"GEOID": ["island", "sea"]},
        geometry=[shapely.box(0, 0, 1, 1), shapely.box(5, 5, 6, 6)],
        crs="EPSG:4326",
    ).to_file(path)
    region = shapely.box(-1, -1, 2, 2)
    grid = _grid(-1, -1, -0.5, 2, 0.1)  # the tiles end west of the island
    with caplog.at_level("WARNING", logger="geodbk"):
        _warn_on_empty_areas_in_region(
            read_areas(path), region, np.array([0, 1]), grid=grid, extent="tiles"
        )
    assert "1 area(s) overlap the region" in caplog.text and "e.g. island)" in caplog.text
    assert "--extent region" in caplog.text and "--resolution" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="geodbk"):
        _warn_on_empty_areas_in_region(
            read_areas(path), region, np.array([1]), grid=grid, extent="tiles"
        )
    assert not caplog.records  # the sea alone: nothing the map missed


@pytest.mark.parametrize("extent", ["tiles", "region"])
def test_a_sliver_inside_the_grid_is_told_to_use_a_finer_resolution(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, extent: str
) -> None:
    """A polygon inside the grid box that holds no cell centre of the region (a coastal
    sliver) is not fixed by ``--extent region``: the warning names ``--resolution``."""
    path = tmp_path / "sliver.geojson"
    gpd.GeoDataFrame(
        {"GEOID": ["sliver"]}, geometry=[shapely.box(0.99, 0.2, 1.05, 0.3)], crs="EPSG:4326"
    ).to_file(path)
    region = shapely.box(-1, -1, 1, 2)  # the sliver's land part: 0.99 to 1
    with caplog.at_level("WARNING", logger="geodbk"):
        _warn_on_empty_areas_in_region(
            read_areas(path), region, np.array([0]), grid=_grid(-1, -1, 2, 2, 0.1), extent=extent
        )
    assert "1 area(s) overlap the region" in caplog.text and "e.g. sliver)" in caplog.text
    assert "finer --resolution" in caplog.text and "--extent region" not in caplog.text


def test_columns_licence_and_metadata_of_both_files(
    run: Path, summary: pd.DataFrame, areas_file: tuple[Path, tuple[int, int]]
) -> None:
    spec = target_spec("download")
    columns = summary_columns(spec, DEFAULT_THRESHOLDS["download"])
    parquet, csv = summary_paths(RunDir(run), "download", areas_file[0])
    assert parquet.name == "download_areas.parquet" and csv.name == "download_areas.csv"
    assert list(gpd.read_parquet(parquet).columns) == [*columns, "geometry"]
    meta = pq.read_schema(parquet).metadata
    assert b"geo" in meta  # GeoParquet
    licence = json.loads(meta[b"geodbk_data_licence"])
    assert licence["license"].startswith("no third-party licence")  # the synthetic demo data
    info = json.loads(meta[SUMMARY_KEY])
    assert info["areas_file"] == "areas.geojson" and info["samples"] == SAMPLES
    assert info["id_column"] == "GEOID" and info["quantity"] == "tile"
    header = [line for line in csv.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    assert len(header) == 2 and "Licence: no third-party licence" in header[1]
    # a spreadsheet reader learns that the *_log10 columns are of kbps, not of Mbps
    assert "*_log10 columns: log10 of avg_d_kbps" in header[0]
    assert "*_natural columns: Mbps" in header[0] and "units Mbps" not in header[0]
    assert "share_* columns: fractions 0-1" in header[0]
    table = pd.read_csv(csv, comment="#", dtype={"id": str})
    assert list(table.columns) == columns and table["id"].tolist() == ["one", "all", "far"]
    np.testing.assert_allclose(table["mean_log10"], summary["mean_log10"].to_numpy(), rtol=1e-12)
    for path in (parquet, csv):  # no absolute local path in any output
        assert str(run.resolve()).encode() not in path.read_bytes()
        assert str(areas_file[0].parent.resolve()).encode() not in path.read_bytes()


def test_the_area_quantity_of_one_cell_is_f(
    run: Path, grid: xr.Dataset, areas_file: tuple[Path, tuple[int, int]]
) -> None:
    i, j = areas_file[1]
    src = run.parent / "one_cell.geojson"
    gpd.GeoDataFrame({"id": ["c"]}, geometry=[_cell_box(grid, i, j)], crs=4326).to_file(src)
    out = run_summarize(
        run, target="download", areas=src, samples=SAMPLES, quantity="area", max_cells=QUICK_CELLS
    )
    row = pd.read_parquet(out).iloc[0]
    mean, sd = float(grid["area_mean"][i, j]), float(grid["std_f"][i, j])
    np.testing.assert_allclose(row["mean_log10"], mean, rtol=1e-5)
    assert abs(row["upper_log10"] - row["lower_log10"] - 2 * 1.645 * sd) < 0.15 * sd
    assert row["quantity"] == "area"


def test_cli_exit_codes_and_messages(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "tracts.geojson"
    gpd.GeoDataFrame(
        {"GEOID": ["1"], "county": ["x"]}, geometry=[shapely.box(0, 0, 1, 1)], crs=4326
    ).to_file(src)
    base = ["summarize", "--run", str(run), "--target", "download", "--areas"]
    assert cli.main([*base, str(src), "--id-column", "TRACT"]) == 3
    err = capsys.readouterr().err
    assert "tracts.geojson" in err and "'TRACT'" in err and "GEOID, county" in err
    bad = tmp_path / "bad.geojson"
    bad.write_text("not a polygon file", encoding="utf-8")
    assert cli.main([*base, str(bad)]) == 3
    assert "bad.geojson: cannot read this areas file" in capsys.readouterr().err
    assert cli.main([*base, str(src), "--samples", "5"]) == 3
    assert "--samples must be a whole number of at least 20" in capsys.readouterr().err
    no_run = ["summarize", "--run", str(tmp_path / "nope"), "--target", "download"]
    assert cli.main([*no_run, "--areas", str(src)]) == 5
    capsys.readouterr()
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("tiles.parquet", "region.geojson"):
        shutil.copy(run / name, bare / name)
    untrained = ["summarize", "--run", str(bare), "--target", "upload", "--areas", str(src)]
    assert cli.main(untrained) == 4
    assert "geodbk train --run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli.main(["summarize", "--run", str(run), "--target", "speed", "--areas", str(src)])
    assert usage.value.code == 2


def test_areas_all_outside_the_map_are_refused_and_keep_an_earlier_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: xr.Dataset
) -> None:
    src = tmp_path / "zone.geojson"
    x, y = float(grid.x.mean()), float(grid.y.mean())
    gpd.GeoDataFrame(
        {"id": ["z"]}, geometry=[shapely.box(x - 0.05, y - 0.05, x + 0.05, y + 0.05)], crs=4326
    ).to_file(src)
    base = [
        "summarize",
        "--run",
        str(run),
        "--target",
        "latency",
        "--samples",
        "50",
        "--max-cells",
        str(QUICK_CELLS),
        "--areas",
        str(src),
    ]
    assert cli.main(base) == 0
    parquet, csv = summary_paths(RunDir(run), "latency", src)
    before = (parquet.read_bytes(), csv.read_bytes())
    assert "share_le_100ms" in pd.read_csv(csv, comment="#").columns  # latency: at or below
    gpd.GeoDataFrame({"id": ["z"]}, geometry=[shapely.box(10, 10, 11, 11)], crs=4326).to_file(src)
    assert cli.main(base) == 3
    assert "none of the 1 areas of zone.geojson holds a map cell" in capsys.readouterr().err
    assert (parquet.read_bytes(), csv.read_bytes()) == before


def test_another_quarter_of_a_time_aware_model_gets_its_own_files(
    run: Path, areas_file: tuple[Path, tuple[int, int]]
) -> None:
    tiles = pd.read_parquet(run / "tiles.parquet", columns=["quadkey", "quarter"])
    first = sorted(tiles["quarter"].unique())[0]
    out = run_summarize(
        run,
        target="download",
        areas=areas_file[0],
        samples=50,
        max_cells=QUICK_CELLS,
        quarter=first,
    )
    assert out.name == f"download_areas_{first}.parquet" and out.with_suffix(".csv").is_file()
    row = pd.read_parquet(out).set_index("id").loc["all"]
    assert row["quarter"] == first
    assert row["n_tiles"] == tiles.loc[tiles["quarter"] == first, "quadkey"].nunique()


def test_help_has_a_sentence_options_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["summarize", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--areas FILE" in text and "--id-column COL" in text and "--samples S" in text
    assert "examples:" in text and "geodbk summarize --run" in text


@pytest.mark.parametrize("policy", ["hold", "trend"])
def test_a_quarter_outside_the_trained_ones_is_flagged_as_predict_flags_it(
    run: Path,
    tmp_path: Path,
    areas_file: tuple[Path, tuple[int, int]],
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    copy = shutil.copytree(
        run,
        tmp_path / "run",
        ignore=shutil.ignore_patterns("checkpoints", "exports", "report", "summaries", "service"),
    )
    model_json = copy / "models" / "download" / "model.json"
    bundle = json.loads(model_json.read_text(encoding="utf-8"))
    bundle["metadata"]["time_extrapolation"] = {"policy": policy}
    model_json.write_text(json.dumps(bundle), encoding="utf-8")
    ts = bundle["metadata"]["time_scaling"]
    last = ts["last"]
    beyond = format_quarter(quarter_index(last) + 2)
    with caplog.at_level(logging.WARNING, logger="geodbk"):
        out = run_summarize(
            copy,
            target="download",
            areas=areas_file[0],
            samples=50,
            max_cells=QUICK_CELLS,
            quarter=beyond,
        )
    status = f"extrapolation beyond {last}"  # what predict writes into the grid's attributes
    assert out.name == f"download_areas_{beyond}.parquet"
    rows = pd.read_parquet(out)
    assert (rows["quarter"] == beyond).all() and (rows["quarter_status"] == status).all()
    info = json.loads(pq.read_schema(out).metadata[SUMMARY_KEY])
    assert info["quarter"] == beyond and info["quarter_status"] == status
    assert info["trained_quarters"] == f"{ts['first']}:{last}"
    header = out.with_suffix(".csv").read_text(encoding="utf-8").splitlines()[0]
    assert f"{beyond} ({status})" in header
    table = pd.read_csv(out.with_suffix(".csv"), comment="#")
    assert (table["quarter_status"] == status).all()
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    held = "the map holds f at the nearest trained quarter (time extrapolation 'hold')"
    trend = "the map extrapolates the trend (time extrapolation 'trend')"
    assert f"download {beyond}: {status}" in warnings
    assert (held in warnings) == (policy == "hold") and (trend in warnings) == (policy == "trend")
    assert "no observed tiles enter the summary" in warnings


def test_an_observed_quarter_is_flagged_observed(summary: pd.DataFrame) -> None:
    assert (summary["quarter_status"] == "observed").all()  # the demo model is time-aware


def test_summary_file_names_carry_the_quarter_and_a_non_tile_quantity(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    names = {
        (q, k): summary_paths(rd, "download", "a/counties.zip!c.shp", quarter=q, quantity=k)
        for q in (None, "2024Q2")
        for k in ("tile", "area", "test")
    }
    assert names[None, "tile"][0].name == "download_counties.parquet"
    assert names[None, "area"][1].name == "download_counties_area.csv"
    assert names["2024Q2", "test"][0].name == "download_counties_2024Q2_test.parquet"
    assert len({p for pair in names.values() for p in pair}) == 12  # none replaces another


def test_an_area_quantity_summary_keeps_the_tile_one(
    run: Path, summary: pd.DataFrame, areas_file: tuple[Path, tuple[int, int]]
) -> None:
    tile = summary_paths(RunDir(run), "download", areas_file[0])[0]
    before = tile.read_bytes()
    out = run_summarize(
        run,
        target="download",
        areas=areas_file[0],
        samples=50,
        quantity="area",
        max_cells=QUICK_CELLS,
    )
    assert out.name == "download_areas_area.parquet" and out.with_suffix(".csv").is_file()
    assert (pd.read_parquet(out)["quantity"] == "area").all()
    assert tile.read_bytes() == before and (pd.read_parquet(tile)["quantity"] == "tile").all()


def test_a_summary_of_another_file_of_the_same_stem_is_replaced_with_a_warning(
    run: Path, grid: xr.Dataset, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x, y = float(grid.x.mean()), float(grid.y.mean())
    frame = gpd.GeoDataFrame(
        {"id": ["z"]}, geometry=[shapely.box(x - 0.05, y - 0.05, x + 0.05, y + 0.05)], crs=4326
    )
    frame.to_file(tmp_path / "stem.geojson")
    frame.to_file(tmp_path / "stem.gpkg")
    options = {"target": "upload", "samples": 20, "max_cells": QUICK_CELLS}
    with caplog.at_level(logging.WARNING, logger="geodbk"):
        run_summarize(run, areas=tmp_path / "stem.geojson", **options)
        run_summarize(run, areas=tmp_path / "stem.geojson", **options)
        assert "holds the summary of" not in caplog.text  # the same file again: no warning
        run_summarize(run, areas=tmp_path / "stem.gpkg", **options)
    assert "upload_stem.parquet holds the summary of stem.geojson" in caplog.text
    assert "replaced by that of stem.gpkg" in caplog.text


def test_csv_header_reads_ids_with_leading_zeros_back_as_text(
    run: Path, grid: xr.Dataset, tmp_path: Path
) -> None:
    """County codes such as ``007`` (or a GEOID of a state whose FIPS starts with 0): the
    CSV read as its own header says keeps them whole, as the parquet does."""
    x, y = float(grid.x.mean()), float(grid.y.mean())
    gpd.GeoDataFrame(
        {"code": ["007", "010"], "NAME": ["001", "Kauai"]},
        geometry=[
            shapely.box(x - 0.05, y - 0.05, x, y + 0.05),
            shapely.box(x, y - 0.05, x + 0.05, y + 0.05),
        ],
        crs=4326,
    ).to_file(tmp_path / "codes.geojson")
    out = run_summarize(
        run,
        target="upload",
        areas=tmp_path / "codes.geojson",
        id_column="code",
        samples=20,
        max_cells=QUICK_CELLS,
    )
    csv = out.with_suffix(".csv")
    first = csv.read_text(encoding="utf-8").splitlines()[0]
    assert 'dtype={"id": str, "name": str}' in first
    spec = first.split("dtype=", 1)[1].split(")", 1)[0]
    table = pd.read_csv(csv, comment="#", dtype=json.loads(spec.replace(": str", ': "str"')))
    assert table["id"].tolist() == ["007", "010"] == pd.read_parquet(out)["id"].tolist()
    assert table["name"].tolist() == ["001", "Kauai"]
