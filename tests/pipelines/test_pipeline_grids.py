"""Regular grids, region masks and the streaming NetCDF writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import shapely
import xarray as xr

from geodbk.geo.grids import block_rows_for, make_grid, region_mask, tile_size_deg
from pipelines.gridfile import GridWriter
from pipelines.predict import crs_attributes

SQUARE = shapely.box(10.0, 20.0, 11.0, 21.0)
TRIANGLE = shapely.Polygon([(10.0, 20.0), (11.0, 20.0), (10.0, 21.0)])


def test_grid_covers_bounds_north_up() -> None:
    g = make_grid(SQUARE.bounds, resolution=0.1)
    assert g.shape == (10, 10)
    assert np.allclose(g.x[[0, -1]], [10.05, 10.95])
    assert np.allclose(g.y[[0, -1]], [20.95, 20.05])
    assert np.all(np.diff(g.y) < 0) and np.all(np.diff(g.x) > 0)


def test_default_resolution_is_zoom16_capped() -> None:
    small = make_grid((10.0, 20.0, 10.05, 20.05))
    dx, dy = tile_size_deg(16, 20.025)
    assert small.dx == pytest.approx(dx) and small.dy == pytest.approx(dy)
    big = make_grid((0.0, 0.0, 10.0, 10.0), max_cells=10_000)
    assert big.size <= 10_000 * 1.05
    assert big.dx / big.dy == pytest.approx(dx / tile_size_deg(16, 5.0)[1] * dy / dy, rel=0.05)


def test_tile_zoom_and_resolution_exclusive() -> None:
    g = make_grid(SQUARE.bounds, tile_zoom=10)
    assert g.dx == pytest.approx(360 / 1024)
    with pytest.raises(ValueError):
        make_grid(SQUARE.bounds, resolution=0.1, tile_zoom=10)


def test_rasterised_mask_equals_testing_each_centre() -> None:
    """The rasterised mask marks exactly the cells whose centre lies in the polygons (a
    multipolygon with a hole and an island), whole and by row blocks."""
    outer = shapely.Polygon(
        [(0, 0), (4, 0.3), (3.7, 3), (0.4, 2.6)], holes=[[(1, 1), (2, 1.2), (1.6, 2)]]
    )
    island = shapely.Polygon([(5, 1), (5.9, 1.4), (5.3, 2.2)])
    geom = shapely.MultiPolygon([outer, island])
    g = make_grid((0.0, 0.0, 6.0, 3.0), resolution=0.0731)
    lon, lat = np.meshgrid(g.x, g.y)
    expected = shapely.intersects_xy(geom, lon, lat)
    assert 0 < expected.sum() < expected.size
    assert np.array_equal(region_mask(geom, g), expected)
    rows = slice(7, 19)
    assert np.array_equal(region_mask(geom, g, rows), expected[rows])


def test_region_mask_blockwise_equals_whole() -> None:
    g = make_grid(TRIANGLE.bounds, resolution=0.05)
    whole = region_mask(TRIANGLE, g)
    blocks = np.vstack([region_mask(TRIANGLE, g, r) for r in g.row_blocks(3)])
    assert np.array_equal(whole, blocks)
    # cell centres below the diagonal x + y < 31 are inside; centres exactly on it (this
    # grid puts some there) may fall either way, as in any rasteriser
    lon, lat = np.meshgrid(g.x, g.y)
    side = (lon - 10) + (lat - 20) - 1
    off = np.abs(side) > 1e-9
    assert np.array_equal(whole[off], side[off] < 0)
    assert 0.4 < whole.mean() < 0.6


def test_block_rows_bound_cells() -> None:
    assert block_rows_for(1000, max_block_cells=10_000) == 10
    assert block_rows_for(10**6, max_block_cells=10) == 1


def test_grid_writer_roundtrip_and_crs(tmp_path: Path) -> None:
    g = make_grid(TRIANGLE.bounds, resolution=0.1)
    path = tmp_path / "g.nc"
    w = GridWriter(
        path,
        x=g.x,
        y=g.y,
        variables={"a": (np.float32, {"units": "m"}), "in_region": (bool, {})},
        attrs={"target": "t", "thresholds": [1.0, 2.0]},
        crs_attrs=crs_attributes(),
    )
    full = np.arange(g.size, dtype=np.float32).reshape(g.shape)
    mask = region_mask(TRIANGLE, g)
    for rows in g.row_blocks(4):
        w.write_rows(rows, {"a": np.where(mask[rows], full[rows], np.nan), "in_region": mask[rows]})
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.nc"]  # no spool left
    with xr.open_dataset(path) as ds:
        assert ds["in_region"].dtype == bool
        assert np.array_equal(ds["in_region"].values, mask)
        assert np.array_equal(np.isnan(ds["a"].values), ~mask)
        assert np.allclose(ds["a"].values[mask], full[mask])
        assert ds.rio.crs.to_epsg() == 4326
        assert "spatial_ref" in ds.coords
        assert ds.attrs["target"] == "t" and ds["a"].attrs["units"] == "m"


def test_grid_writer_refuses_incomplete(tmp_path: Path) -> None:
    g = make_grid(SQUARE.bounds, resolution=0.5)
    w = GridWriter(
        tmp_path / "g.nc", x=g.x, y=g.y, variables={"a": (np.float32, {})}, attrs={}, crs_attrs={}
    )
    w.write_rows(slice(0, 1), {"a": np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError, match="never written"):
        w.close()
    assert not (tmp_path / "g.nc").exists()


def test_grid_writer_raw_chunks_read_back_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks that fill whole chunks are encoded here (shuffle + zlib) and written raw: xarray,
    h5py and GDAL read back every value; a chunk of fill values only is not stored."""
    import h5py
    import rasterio

    import pipelines.gridfile as gridfile

    nx, ny = 7, 11
    monkeypatch.setattr(gridfile, "CHUNK_CELLS", 3 * nx)  # chunks of 3 rows, the last one short
    x = np.linspace(-1.0, 1.0, nx)
    y = np.linspace(2.0, 1.0, ny)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(ny, nx)).astype(np.float32)
    a[3:6] = np.nan  # chunk 1: fill only
    b = rng.normal(size=(ny, nx))
    c = rng.integers(-5, 5, size=(ny, nx)).astype(np.int16)
    c[0, :] = -1
    m = a > 0
    path = tmp_path / "g.nc"
    w = GridWriter(
        path,
        x=x,
        y=y,
        variables={
            "a": (np.float32, {}),
            "b": (np.float64, {}),
            "c": (np.int16, {"_FillValue": -1}),
            "m": (bool, {}),
        },
        attrs={},
        crs_attrs=crs_attributes(),
    )
    for start in range(0, ny, 3):
        rows = slice(start, min(start + 3, ny))
        w.write_rows(rows, {"a": a[rows], "b": b[rows], "c": c[rows], "m": m[rows]})
    w.close()
    with xr.open_dataset(path) as ds:
        np.testing.assert_array_equal(ds["a"].values, a)
        np.testing.assert_array_equal(ds["b"].values, b)
        np.testing.assert_array_equal(ds["m"].values, m)
        got_c = ds["c"].values  # -1 is the fill value: decoded to NaN
        np.testing.assert_array_equal(np.isnan(got_c), c == -1)
        np.testing.assert_array_equal(got_c[c != -1], c[c != -1])
    with h5py.File(path, "r") as h5:
        assert h5["a"].id.get_num_chunks() == 3  # of 4: the all-NaN chunk is not stored
        assert h5["b"].id.get_num_chunks() == 4
        assert h5["a"].compression == "gzip" and h5["a"].shuffle
    with rasterio.open(f"netcdf:{path}:b") as src:
        np.testing.assert_allclose(src.read(1), b)
