"""Builders of small tile files for the geo, ingest and robustness tests (in tests/, so that
every test folder can import them, alone or in the full suite)."""

from __future__ import annotations

import warnings
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from geodbk.geo import quadkey as qk


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
    polys = qk.tile_polygons(*qk.tile_bounds(x, y, 16))
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
