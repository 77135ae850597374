"""Dask-backed predictive grids and chunk-by-chunk GeoTIFF / COG writing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import shapely

from geodbk import DBKRegressor
from geodbk.geo.grids import make_grid
from pipelines.lazygrid import grid_dataset, write_grid_geotiff
from pipelines.predict import predict_block
from pipelines.rundir import scale_lonlat, target_spec

SCALING = {"lon_min": -158.0, "lon_max": -155.0, "lat_min": 19.0, "lat_max": 22.0}


@pytest.fixture(scope="module")
def model() -> DBKRegressor:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(200, 2))
    y = 4.5 + 0.3 * np.sin(3 * X[:, 0]) + 0.05 * rng.standard_normal(200)
    return DBKRegressor(rank=8, hidden=8, epochs=2, batch_size=64, device="cpu").fit(X, y)


def test_lazy_grid_matches_eager_and_writes_windowed(tmp_path: Path, model: DBKRegressor) -> None:
    spec = target_spec("download")
    grid = make_grid((-158.0, 19.0, -155.0, 22.0), resolution=0.01)  # 300 x 300
    region = shapely.box(-157.5, 19.5, -155.2, 21.7)
    ds = grid_dataset(
        model,
        spec,
        grid,
        scaling=SCALING,
        thresholds=(25, 100),
        geometry=region,
        chunks=(256, 128),
    )
    assert ds["mean"].chunks is not None  # lazy
    names = list(ds.data_vars)
    assert names[:2] == ["mean", "std"] and "p_below_25mbps" in names
    lon2, lat2 = np.meshgrid(grid.x, grid.y)
    inside = np.asarray(shapely.intersects_xy(region, lon2, lat2))
    eager = predict_block(
        model,
        spec,
        scale_lonlat(lon2[inside], lat2[inside], SCALING),
        (25.0, 100.0),
        chunk_size=4096,
    )
    computed = ds.compute()
    for name in names:
        assert np.isnan(computed[name].values[~inside]).all()
        np.testing.assert_allclose(computed[name].values[inside], eager[name], rtol=1e-5)
    for fmt in ("gtiff", "cog"):
        path = write_grid_geotiff(ds, tmp_path / f"g_{fmt}.tif", fmt=fmt, tags={"k": "v"})
        with rasterio.open(path) as src:
            assert src.descriptions == tuple(names)
            assert src.tags()["k"] == "v"
            assert (src.block_shapes[0]) == (256, 256)
            back = src.read(1, masked=True)
            if fmt == "cog":
                assert src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"
        np.testing.assert_allclose(back.filled(np.nan), computed["mean"].values, rtol=1e-6)
        np.testing.assert_array_equal(back.mask, ~inside)
