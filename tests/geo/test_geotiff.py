"""GeoTIFF / COG writing: bands, descriptions, nodata, overviews, read back with rioxarray."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray
import xarray as xr

from geodbk.geo.geotiff import DEFAULT_NODATA, write_geotiff


def _dataset(ny: int, nx: int) -> xr.Dataset:
    rng = np.random.default_rng(0)
    a = rng.random((ny, nx)).astype(np.float32)
    a[: ny // 3] = np.nan
    ds = xr.Dataset(
        {"mean": (("y", "x"), a), "std": (("y", "x"), 2 * a)},
        coords={"y": 21.0 - 0.01 * (np.arange(ny) + 0.5), "x": -158 + 0.01 * (np.arange(nx) + 0.5)},
    )
    return ds.rio.write_crs("EPSG:4326")


@pytest.mark.parametrize("fmt", ["gtiff", "cog"])
def test_bands_nodata_roundtrip(tmp_path: Path, fmt: str) -> None:
    ds = _dataset(40, 30)
    path = write_geotiff(
        ds,
        tmp_path / "t.tif",
        variables=["mean", "std"],
        fmt=fmt,
        tags={"geodbk_target": "download"},
    )
    with rasterio.open(path) as src:
        assert src.descriptions == ("mean", "std")
    back = rioxarray.open_rasterio(path, masked=True)
    assert isinstance(back, xr.DataArray)
    assert back.rio.crs.to_epsg() == 4326
    assert back.rio.nodata is None or np.isnan(back.rio.nodata)
    assert back.rio.encoded_nodata == DEFAULT_NODATA
    assert np.array_equal(np.isnan(back.values[0]), np.isnan(ds["mean"].values))
    assert np.allclose(back.values[1], ds["std"].values, equal_nan=True)
    with rasterio.open(path) as src:
        assert src.tags()["geodbk_target"] == "download"
        assert src.profile["compress"] == "deflate"


def test_cog_has_overviews(tmp_path: Path) -> None:
    path = write_geotiff(_dataset(1200, 900), tmp_path / "big.tif", variables=["mean"], fmt="cog")
    with rasterio.open(path) as src:
        assert src.overviews(1)
        assert src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"


def test_bad_arguments(tmp_path: Path) -> None:
    ds = _dataset(4, 4)
    with pytest.raises(ValueError, match="format"):
        write_geotiff(ds, tmp_path / "x.tif", variables=["mean"], fmt="png")
    with pytest.raises(ValueError, match="not in dataset"):
        write_geotiff(ds, tmp_path / "x.tif", variables=["nope"])


@pytest.mark.parametrize("fmt", ["gtiff", "cog"])
@pytest.mark.parametrize("lazy", [False, True])
def test_band_units_and_tags_are_written(tmp_path: Path, fmt: str, lazy: bool) -> None:
    ds = _dataset(300, 280)
    if lazy:
        ds = ds.chunk({"y": 100})
    path = write_geotiff(
        ds,
        tmp_path / "u.tif",
        variables=["mean", "std"],
        fmt=fmt,
        units=["log10 avg_d_kbps", "Mbps"],
        band_tags=[{"geodbk_quantity": "tile"}, {}],
    )
    with rasterio.open(path) as src:
        assert src.units == ("log10 avg_d_kbps", "Mbps")
        assert src.tags(1)["geodbk_quantity"] == "tile"
        assert "geodbk_quantity" not in src.tags(2)
        if fmt == "cog":
            assert src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"


def _class_raster(tmp_path: Path, fmt: str, **options: object) -> tuple[xr.Dataset, Path]:
    """A 12 x 10 band of codes 0-2 (its first row NaN) written as uint8, nodata 255."""
    codes = np.arange(12 * 10, dtype=np.float32).reshape(12, 10) % 3
    codes[0] = np.nan
    ds = _dataset(12, 10).assign(cls=(("y", "x"), codes))
    path = write_geotiff(
        ds, tmp_path / "c.tif", variables=["cls"], fmt=fmt, dtype="uint8", nodata=255, **options
    )
    return ds, path


@pytest.mark.parametrize("fmt", ["gtiff", "cog"])
def test_class_band_carries_its_colour_table(tmp_path: Path, fmt: str) -> None:
    colours = {0: (200, 30, 30, 255), 1: (240, 200, 40, 255), 2: (30, 150, 60, 255)}
    ds, path = _class_raster(tmp_path, fmt, colormap=colours)
    with rasterio.open(path) as src:
        table = src.colormap(1)
        assert {k: table[k] for k in colours} == colours
        assert src.read(1)[0, 0] == 255 and src.nodata == 255
    assert not Path(f"{path}.aux.xml").exists()  # no category names asked for
    with pytest.raises(ValueError, match="colour table"):
        write_geotiff(ds, tmp_path / "f.tif", variables=["mean"], colormap=colours)
    with pytest.raises(ValueError, match="units"):
        write_geotiff(ds, tmp_path / "f.tif", variables=["mean", "std"], units=["1"])


@pytest.mark.parametrize("fmt", ["gtiff", "cog"])
def test_class_band_names_its_codes_in_gdal_s_sidecar(tmp_path: Path, fmt: str) -> None:
    """Category names go to ``PATH.aux.xml`` (GDAL's PAM file), code 0 first; the raster
    beside it still opens; a float band or two bands refuse them."""
    import xml.etree.ElementTree as ET

    names = ["unserved", "underserved", "served"]
    ds, path = _class_raster(tmp_path, fmt, category_names=names)
    root = ET.parse(f"{path}.aux.xml").getroot()
    assert root.tag == "PAMDataset"
    band = root.find("PAMRasterBand")
    assert band is not None and band.get("band") == "1"
    assert [c.text for c in band.iter("Category")] == names
    with rasterio.open(path) as src:
        assert src.count == 1 and set(np.unique(src.read(1))) == {0, 1, 2, 255}
    with pytest.raises(ValueError, match="category names"):
        write_geotiff(ds, tmp_path / "f.tif", variables=["mean"], category_names=names)
    with pytest.raises(ValueError, match="category names"):
        write_geotiff(
            ds,
            tmp_path / "f.tif",
            variables=["cls", "cls"],
            dtype="uint8",
            nodata=255,
            category_names=names,
        )
