"""Builders of small tile files for the geo, ingest and robustness tests (in tests/, so that
every test folder can import them, alone or in the full suite), and a small parquet table for
the streaming tests and two regions for the grid tests."""

from __future__ import annotations

import warnings
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from geodbk.geo import quadkey as qk
from geodbk.geo.frame import tile_polygons


def make_tiles(
    n: int = 50, *, seed: int = 0, lon: float = -157.9, lat: float = 21.4
) -> pd.DataFrame:
    """``n`` distinct zoom-16 tiles near (lon, lat) in the Ookla schema (with ``tile`` WKT)."""
    rng = np.random.default_rng(seed)
    x0, y0 = qk.lonlat_to_tile([lon], [lat], 16)
    cells = rng.choice(400, size=n, replace=False)
    x = x0[0] + cells % 20
    y = y0[0] + cells // 20
    keys = qk.tile_to_quadkey(x, y, np.full(n, 16))
    polys = tile_polygons(*qk.tile_bounds(x, y, 16))
    return pd.DataFrame(
        {
            "quadkey": keys.astype(str),
            "tile": shapely.to_wkt(polys),
            "avg_d_kbps": rng.integers(1000, 100000, n),
            "avg_u_kbps": rng.integers(100, 20000, n),
            "avg_lat_ms": rng.integers(5, 200, n),
            "tests": rng.integers(1, 30, n),
            "devices": rng.integers(1, 5, n),
        }
    )


def write_hive(root: Path, df: pd.DataFrame, *, kind: str, year: int, q: int) -> Path:
    path = (
        root
        / f"type={kind}/year={year}/quarter={q}/{year}-{3 * q - 2:02d}-01_performance_{kind}_tiles.parquet"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def write_geo(path: Path, df: pd.DataFrame, *, null_every: int = 0, crs: str = "EPSG:4326") -> Path:
    geoms = shapely.from_wkt(df["tile"].to_numpy())
    if null_every:
        geoms = np.where(np.arange(len(df)) % null_every == 0, None, geoms)
    gdf = gpd.GeoDataFrame(df.drop(columns="tile"), geometry=list(geoms), crs="EPSG:4326")
    if crs != "EPSG:4326":
        gdf = gdf.to_crs(crs)
    driver = "GeoJSON" if path.suffix == ".geojson" else "ESRI Shapefile"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gdf.to_file(path, driver=driver)
    return path


def write_xy_table(path: Path, n: int = 1000) -> Path:
    """A parquet file of ``n`` rows ``x1, x2`` (uniform on [-1, 1]), ``y = 4 + 0.5 sin(3 x1)``
    plus noise of sd 0.05 and ``split`` (every tenth row ``val``, else ``train``), in row
    groups of 200 rows (the streaming and parquet-batch tests)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(n, 2))
    y = 4.0 + 0.5 * np.sin(3 * x[:, 0]) + 0.05 * rng.standard_normal(n)
    split = np.where(np.arange(n) % 10 == 0, "val", "train")
    pq.write_table(
        pa.table({"x1": x[:, 0], "x2": x[:, 1], "y": y, "split": split}),
        path,
        row_group_size=200,
    )
    return path


#: Regions for the grid and grid-writer tests: a 1° square and the triangle of its lower-left half.
SQUARE = shapely.box(10.0, 20.0, 11.0, 21.0)
TRIANGLE = shapely.Polygon([(10.0, 20.0), (11.0, 20.0), (10.0, 21.0)])
