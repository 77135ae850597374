"""A region across the 180° meridian (Alaska's Aleutians) from ingest to maps, exports and places.

The tiles lie either side of 180° (zoom-16 columns 0..19 and 65516..65535) around Amchitka's
latitude, with a download level that varies smoothly across the meridian. The region file holds
the two halves, split at 180° as Census files hold Alaska.
"""

from __future__ import annotations

import json
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import rasterio
import shapely
import xarray as xr

from geodbk.geo import quadkey as qk
from geodbk.geo.frame import tile_polygons
from geodbk.geo.table import read_tile_table
from pipelines import cli

ZOOM = 16
COLUMNS = 20
ROWS = 12
LAT = 51.6


def _raw_tiles(quarter_seed: int) -> pd.DataFrame:
    """Ookla-schema tiles in 20 columns either side of 180° (same rows), download falling by
    a decade per 0.1° east of 179.9°E, continuous across the meridian."""
    rng = np.random.default_rng(quarter_seed)
    n = 1 << ZOOM
    cols = np.r_[np.arange(n - COLUMNS, n), np.arange(COLUMNS)]
    _, y0 = qk.lonlat_to_tile([180.0], [LAT], ZOOM)
    x, y = np.meshgrid(cols, y0[0] + np.arange(ROWS))
    x, y = x.ravel(), y.ravel()
    w, s, e, nn = qk.tile_bounds(x, y, ZOOM)
    east_of_1799 = np.where(w < 0, w + 360.0, w) - 179.9  # degrees east of 179.9°E
    log_kbps = 4.5 - 1.0 * east_of_1799 / 0.1 + 0.05 * rng.standard_normal(x.size)
    return pd.DataFrame(
        {
            "quadkey": qk.tile_to_quadkey(x, y, np.full(x.size, ZOOM)).astype(str),
            "tile": shapely.to_wkt(tile_polygons(w, s, e, nn)),
            "avg_d_kbps": np.round(10**log_kbps).astype(np.int64),
            "avg_u_kbps": np.round(10 ** (log_kbps - 0.7)).astype(np.int64),
            "avg_lat_ms": rng.integers(20, 60, x.size),
            "tests": rng.integers(3, 30, x.size),
            "devices": rng.integers(1, 5, x.size),
        }
    )


@pytest.fixture(scope="module")
def aleutian_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aleutians")
    tiles = []
    for q in (1, 2):
        path = root / "ookla" / f"2023-{3 * q - 2:02d}-01_performance_mobile_tiles.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        _raw_tiles(q).to_parquet(path, index=False)
        tiles.append(str(path))
    halves = [shapely.box(179.85, 51.5, 180.0, 51.75), shapely.box(-180.0, 51.5, -179.85, 51.75)]
    gpd.GeoDataFrame({"NAME": ["Rat Islands"]}, geometry=[shapely.MultiPolygon(halves)]).set_crs(
        "EPSG:4326"
    ).to_file(root / "region.geojson", driver="GeoJSON")
    run = root / "run"
    ingest = ["ingest", "--tiles", *tiles, "--run", str(run), "--type", "mobile",
              "--region", str(root / "region.geojson"), "--quarters", "2023Q1:2023Q2"]  # fmt: skip
    assert cli.main(ingest) == 0
    (root / "cfg.yaml").write_text("rank: 16\nhidden: 16\nepochs: 40\nbatch_size: 128\n")
    train = ["train", "--run", str(run), "--target", "download", "--config", str(root / "cfg.yaml")]
    assert cli.main(train) == 0
    return run


def test_ingest_scales_the_region_in_one_continuous_frame(aleutian_run: Path) -> None:
    table, meta = read_tile_table(aleutian_run)
    sc = meta["scaling"]
    assert 179.8 < sc["lon_min"] < 180.0 < sc["lon_max"] < 180.2
    assert meta["region"]["extent"][2] > 180.0
    assert table["lon"].between(-180, 180).all()  # the table keeps [-180, 180]
    west = table["lon"] > 0
    assert table.loc[west, "x1"].between(-1, 0).all() and table.loc[~west, "x1"].between(0, 1).all()
    # the tiles either side of the meridian meet in the middle of the scaled box
    assert abs(table.loc[west, "x1"].max() - table.loc[~west, "x1"].min()) < 0.1


def test_the_map_spans_the_meridian_and_is_continuous_across_it(
    aleutian_run: Path, tmp_path: Path
) -> None:
    predict = ["predict", "--run", str(aleutian_run), "--target", "download",
               "--resolution", "0.01", "--quantity", "area"]  # fmt: skip
    assert cli.main(predict) == 0
    with xr.open_dataset(aleutian_run / "grids" / "download.nc") as ds:
        x = ds["x"].to_numpy()
        inside = ds["in_region"].to_numpy().astype(bool)
        mean = ds["mean"].to_numpy()
    assert x.min() < 180.0 < x.max() < 180.25
    cols_west, cols_east = x < 180.0, x > 180.0
    assert inside[:, cols_west].any() and inside[:, cols_east].any()
    assert np.isfinite(mean[inside]).all()
    # the fitted level falls eastward across the meridian, without a jump at 180°
    by_col = np.nanmean(np.where(inside, mean, np.nan), axis=0)
    last_west = np.flatnonzero(cols_west)[-1]
    steps = np.abs(np.diff(by_col))
    assert steps[last_west] <= 1.5 * max(steps[last_west - 1], steps[last_west + 1])
    assert np.nanmean(by_col[cols_west]) > np.nanmean(by_col[cols_east]) + 0.3

    assert cli.main(["export", "--run", str(aleutian_run), "--target", "download"]) == 0
    (tif,) = (aleutian_run / "exports").glob("download*.tif")
    with rasterio.open(tif) as src:
        left, _, right, _ = src.bounds
    assert left < 180.0 < right


def test_places_either_side_of_the_meridian_are_inside_and_agree(
    aleutian_run: Path, tmp_path: Path
) -> None:
    places = tmp_path / "places.csv"
    pd.DataFrame(
        {"id": ["w", "e", "far"], "lon": [179.999, -179.999, 10.0], "lat": [51.62, 51.62, 51.62]}
    ).to_csv(places, index=False)
    argv = ["predict", "--run", str(aleutian_run), "--target", "download", "--at", str(places),
            "--quantity", "area"]  # fmt: skip
    assert cli.main(argv) == 0
    out = pd.read_parquet(aleutian_run / "predictions" / "download_places_area.parquet").set_index(
        "id"
    )
    assert not out.loc["w", "outside_region"] and not out.loc["e", "outside_region"]
    assert out.loc["far", "outside_region"]
    assert abs(out.loc["w", "mean"] - out.loc["e", "mean"]) < 0.1


def test_tile_maps_report_and_summaries_cover_both_sides(aleutian_run: Path) -> None:
    predict = ["predict", "--run", str(aleutian_run), "--target", "download",
               "--resolution", "0.01"]  # fmt: skip
    assert cli.main(predict) == 0
    with xr.open_dataset(aleutian_run / "grids" / "download.nc") as ds:
        x = ds["x"].to_numpy()
        inside = ds["in_region"].to_numpy().astype(bool)
        sd = ds["std"].to_numpy()
        assert ds.attrs["quantity"] == "tile"
    assert inside[:, x > 180.0].any() and np.isfinite(sd[inside]).all()
    layer = json.loads((aleutian_run / "models" / "download" / "local_layer.json").read_text())
    assert layer["lon0"] == pytest.approx(180.0, abs=0.02)  # neighbours across the meridian
    assert cli.main(["report", "--run", str(aleutian_run), "--target", "download"]) == 0
    metrics = (aleutian_run / "report").rglob("metrics.json")
    assert any(metrics)
    areas = aleutian_run.parent / "areas.geojson"
    halves = [shapely.box(179.85, 51.5, 180.0, 51.75), shapely.box(-180.0, 51.5, -179.85, 51.75)]
    gpd.GeoDataFrame({"GEOID": ["west", "east"]}, geometry=halves, crs="EPSG:4326").to_file(
        areas, driver="GeoJSON"
    )
    summarize = ["summarize", "--run", str(aleutian_run), "--target", "download",
                 "--areas", str(areas), "--resolution", "0.01"]  # fmt: skip
    assert cli.main(summarize) == 0
    table = pd.read_parquet(aleutian_run / "summaries" / "download_areas.parquet").set_index("id")
    assert (table["n_cells"] > 100).all() and (table["n_tiles"] == COLUMNS * ROWS).all()
    assert table.loc["west", "mean_log10"] > table.loc["east", "mean_log10"]


def test_service_classes_across_the_meridian(aleutian_run: Path, tmp_path: Path) -> None:
    cfg = aleutian_run.parent / "cfg.yaml"
    for target in ("upload", "latency"):
        train = ["train", "--run", str(aleutian_run), "--target", target, "--config", str(cfg)]
        assert cli.main(train) == 0
    service = ["service", "--run", str(aleutian_run), "--resolution", "0.01"]
    assert cli.main(service) == 0
    with xr.open_dataset(aleutian_run / "service" / "classes.nc") as ds:
        x = ds["x"].to_numpy()
        inside = ds["in_region"].to_numpy().astype(bool)
        unserved = ds["p_unserved"].to_numpy()
    assert x.min() < 180.0 < x.max()
    for side in (x < 180.0, x > 180.0):
        assert inside[:, side].any() and np.isfinite(unserved[:, side][inside[:, side]]).all()
    places = tmp_path / "pl.csv"
    pd.DataFrame({"id": ["w", "e"], "lon": [179.999, -179.999], "lat": [51.62, 51.62]}).to_csv(
        places, index=False
    )
    assert cli.main(["service", "--run", str(aleutian_run), "--at", str(places)]) == 0
    out = pd.read_parquet(aleutian_run / "service" / "classes_pl.parquet")
    assert not out["outside_region"].any()


def test_without_a_region_the_tiles_extent_spans_the_meridian_and_not_the_globe(
    aleutian_run: Path, tmp_path: Path
) -> None:
    tiles = sorted(str(p) for p in (aleutian_run.parent / "ookla").glob("*.parquet"))
    run = tmp_path / "run"
    argv = ["ingest", "--tiles", *tiles, "--run", str(run), "--type", "mobile",
            "--quarters", "2023Q1:2023Q2", "--scale-by", "tiles"]  # fmt: skip
    assert cli.main(argv) == 0
    table, meta = read_tile_table(run)
    assert meta["region"]["kind"] == "tiles" and meta["region"]["extent"][2] > 180.0
    assert 179.8 < meta["scaling"]["lon_min"] < 180.0 < meta["scaling"]["lon_max"] < 180.2
    assert table["x1"].min() == pytest.approx(-1.0) and table["x1"].max() == pytest.approx(1.0)
    assert len(table) == 2 * 2 * COLUMNS * ROWS  # every tile kept: the box holds both halves
