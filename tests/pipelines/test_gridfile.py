"""The streaming NetCDF grid writer: round trip, CRS, refusal of an incomplete grid, raw chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from geo_helpers import SQUARE, TRIANGLE

from geodbk.errors import DataError
from geodbk.geo.grids import make_grid, region_mask
from pipelines.gridfile import GridWriter, grid_attrs
from pipelines.predict import crs_attributes


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


def test_grid_attrs_equal_xarrays_for_a_written_grid_a_netcdf3_file_and_a_broken_one(
    tmp_path: Path,
) -> None:
    g = make_grid(SQUARE.bounds, resolution=0.5)
    path = tmp_path / "g.nc"
    attrs = {"quantity": "tile", "tests": 4.0, "resolution_deg": [0.5, 0.5], "note": "Mānoa"}
    w = GridWriter(path, x=g.x, y=g.y, variables={"a": (np.float32, {})}, attrs=attrs, crs_attrs={})
    w.write_rows(slice(0, g.shape[0]), {"a": np.zeros(g.shape, np.float32)})
    w.close()
    got = grid_attrs(path, fix="geodbk predict")
    with xr.open_dataset(path) as ds:
        want = dict(ds.attrs)
    assert got.keys() == want.keys() and got["quantity"] == "tile" and got["note"] == "Mānoa"
    assert all(np.array_equal(got[k], want[k]) for k in want)
    # a NetCDF-3 file, which h5netcdf cannot open, is read through xarray
    classic = tmp_path / "classic.nc"
    xr.Dataset({"a": ("x", np.zeros(3))}, attrs={"quantity": "area"}).to_netcdf(
        classic, engine="scipy"
    )
    assert grid_attrs(classic, fix="x")["quantity"] == "area"
    broken = tmp_path / "broken.nc"
    broken.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataError, match=r"broken\.nc is not a readable grid.*geodbk predict"):
        grid_attrs(broken, fix="geodbk predict")


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
    """Blocks that fill whole chunks are encoded here (shuffle + deflate) and written raw: xarray,
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


def test_grid_writer_tiles_chunks_and_skips_fill_only_tiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are tiles (3 rows x 4 columns here): blocks of 2 rows are gathered into whole
    rows of chunks, a tile holding only NaN is not stored, and the edge tiles are padded. Every
    value reads back; a block out of order is refused."""
    import h5py

    import pipelines.gridfile as gridfile

    nx, ny = 10, 11
    monkeypatch.setattr(gridfile, "CHUNK_COLS", 4)
    monkeypatch.setattr(gridfile, "CHUNK_CELLS", 12)
    rng = np.random.default_rng(1)
    a = np.full((ny, nx), np.nan, dtype=np.float32)
    a[0:2, 0:3] = rng.normal(size=(2, 3))  # tile (0, 0)
    a[4, 9] = 1.5  # tile (1, 2): the padded edge column
    a[10, 5] = -2.0  # tile (3, 1): the padded last row of chunks
    path = tmp_path / "g.nc"
    w = _one_variable_writer(path, nx=nx, ny=ny)
    with pytest.raises(ValueError, match="out of order"):
        w.write_rows(slice(2, 4), {"a": a[2:4]})
    for start in range(0, ny, 2):
        rows = slice(start, min(start + 2, ny))
        w.write_rows(rows, {"a": a[rows]})
    w.close()
    with xr.open_dataset(path) as ds:
        np.testing.assert_array_equal(ds["a"].values, a)
    with h5py.File(path, "r") as h5:
        assert h5["a"].chunks == (3, 4)
        assert h5["a"].id.get_num_chunks() == 3  # of 12 tiles: the 9 NaN-only ones unstored


def test_a_data_mask_stores_the_same_chunks_as_testing_the_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``data_mask`` (blocks of 2 rows gathered into chunks of 3) the writer stores the
    chunks holding a masked cell, the same ones testing every variable's values finds, and
    every value reads back; a mask given with some blocks only is refused."""
    import h5py

    import pipelines.gridfile as gridfile

    nx, ny = 10, 11
    monkeypatch.setattr(gridfile, "CHUNK_COLS", 4)
    monkeypatch.setattr(gridfile, "CHUNK_CELLS", 12)
    mask = np.zeros((ny, nx), dtype=bool)
    mask[0:2, 0:3] = True
    mask[4, 9] = True
    mask[10, 5] = True
    a = np.where(mask, np.random.default_rng(2).normal(size=(ny, nx)), np.nan).astype(np.float32)
    counts = {}
    for with_mask in (False, True):
        path = tmp_path / f"g{with_mask}.nc"
        w = _one_variable_writer(path, nx=nx, ny=ny)
        for start in range(0, ny, 2):
            rows = slice(start, min(start + 2, ny))
            w.write_rows(rows, {"a": a[rows]}, data_mask=mask[rows] if with_mask else None)
        w.close()
        with xr.open_dataset(path) as ds:
            np.testing.assert_array_equal(ds["a"].values, a)
        with h5py.File(path, "r") as h5:
            counts[with_mask] = h5["a"].id.get_num_chunks()
    assert counts == {False: 3, True: 3}
    w = _one_variable_writer(tmp_path / "mixed.nc", nx=nx, ny=ny)
    w.write_rows(slice(0, 2), {"a": a[0:2]}, data_mask=mask[0:2])  # pending: 2 of 3 rows
    with pytest.raises(ValueError, match="every block or with none"):
        w.write_rows(slice(2, 4), {"a": a[2:4]})
    w.abort()


def test_grid_writer_keeps_pending_rows_when_the_caller_reuses_its_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 2 rows into chunks of 3: the rows left pending are the writer's own copy, so a
    caller may refill one block array for every block (as ``geodbk predict`` does)."""
    import pipelines.gridfile as gridfile

    nx, ny = 5, 9
    monkeypatch.setattr(gridfile, "CHUNK_COLS", 5)
    monkeypatch.setattr(gridfile, "CHUNK_CELLS", 15)
    a = np.arange(nx * ny, dtype=np.float32).reshape(ny, nx)
    path = tmp_path / "g.nc"
    w = _one_variable_writer(path, nx=nx, ny=ny)
    buffer = np.empty((2, nx), dtype=np.float32)
    for start in range(0, ny, 2):
        rows = slice(start, min(start + 2, ny))
        block = buffer[: rows.stop - rows.start]
        block[:] = a[rows]
        w.write_rows(rows, {"a": block})
    w.close()
    with xr.open_dataset(path) as ds:
        np.testing.assert_array_equal(ds["a"].values, a)


def _one_variable_writer(path: Path, *, nx: int, ny: int) -> GridWriter:
    """A writer of one float32 variable ``a`` on an (ny, nx) grid over the unit square."""
    return GridWriter(
        path,
        x=np.linspace(0.0, 1.0, nx),
        y=np.linspace(1.0, 0.0, ny),
        variables={"a": (np.float32, {})},
        attrs={},
        crs_attrs=crs_attributes(),
    )


def test_variables_given_one_array_are_encoded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two float32 variables given the very same block array share its encoded chunks (the
    area map's mean and area_mean), and both read back whole; the same values in another
    array, or the same array as float64, are encoded on their own."""
    import pipelines.gridfile as gridfile

    encoded: list[int] = []
    encode = gridfile.encode_chunk
    monkeypatch.setattr(
        gridfile, "encode_chunk", lambda values: encoded.append(values.size) or encode(values)
    )
    nx, ny = 6, 4
    a = np.random.default_rng(3).normal(size=(ny, nx)).astype(np.float32)
    names = ("a", "same", "copy", "wide")
    path = tmp_path / "g.nc"
    w = GridWriter(
        path,
        x=np.linspace(0.0, 1.0, nx),
        y=np.linspace(1.0, 0.0, ny),
        variables={
            "a": (np.float32, {"long_name": "a"}),
            "same": (np.float32, {"long_name": "another name"}),
            "copy": (np.float32, {}),
            "wide": (np.float64, {}),
        },
        attrs={},
        crs_attrs=crs_attributes(),
        chunk_rows=ny,
    )
    w.write_rows(slice(0, ny), {"a": a, "same": a, "copy": a.copy(), "wide": a})
    w.close()
    assert len(encoded) == 3  # one chunk each for a (and same), copy and wide
    with xr.open_dataset(path) as ds:
        for name in names:
            np.testing.assert_array_equal(ds[name].values, a)
        assert ds["same"].attrs["long_name"] == "another name"


def test_chunks_are_zlib_streams_with_or_without_isal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk is the shuffled bytes in a zlib stream, from ISA-L or, where isal is missing,
    from the standard library's zlib, at the same level."""
    import zlib

    import pipelines.gridfile as gridfile

    values = np.linspace(0.0, 1.0, 600, dtype=np.float32).reshape(20, 30)
    shuffled = values.reshape(-1).view(np.uint8).reshape(-1, 4).T.tobytes()
    assert zlib.decompress(gridfile.encode_chunk(values)) == shuffled
    monkeypatch.setattr(gridfile, "deflate", zlib)
    assert zlib.decompress(gridfile.encode_chunk(values)) == shuffled
    assert gridfile.encode_chunk(values) == zlib.compress(shuffled, gridfile.COMPRESSION_LEVEL)
