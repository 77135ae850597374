"""Lists of places read from CSV, parquet and GeoJSON: quadkeys, lon/lat columns, geometries."""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo.locations import read_locations
from geodbk.geo.quadkey import quadkey_centroid


def test_lon_lat_outside_the_quadkeys_tile_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = "0230123012301230"
    lon, lat = quadkey_centroid(np.array([key]))
    path = tmp_path / "both.csv"
    path.write_text(f"quadkey,lon,lat\n{key},{lon[0]},{lat[0]}\n{key},{lon[0] + 1},{lat[0]}\n")
    with caplog.at_level("WARNING", logger="geodbk"):
        got = read_locations(path)
    assert got.source == "quadkey" and "1 row(s) have lon/lat columns outside" in caplog.text
    assert "first at row 2" in caplog.text


def test_quadkeys_in_a_csv_keep_their_leading_zeros_and_ids(tmp_path: Path) -> None:
    keys = ["0230123012301230", "0230123012301231"]
    path = tmp_path / "sites.csv"
    path.write_text("site,quadkey,lon\nA,0230123012301230,1.0\nB,0230123012301231,2.0\n")
    got = read_locations(path)
    assert got.source == "quadkey"  # a quadkey wins over a lon column
    lon, lat = quadkey_centroid(np.array(keys))
    np.testing.assert_allclose(got.lon, lon)
    np.testing.assert_allclose(got.lat, lat)
    assert got.ids["site"].tolist() == ["A", "B"]
    assert got.ids["quadkey"].tolist() == keys


def test_lon_lat_columns_by_any_of_their_names(tmp_path: Path) -> None:
    path = tmp_path / "sites.parquet"
    pd.DataFrame(
        {"Longitude": [-157.8, -155.1], "LATITUDE": [21.3, 19.7], "id": [7, 8]}
    ).to_parquet(path)
    got = read_locations(path)
    assert got.source == "lon/lat"
    np.testing.assert_array_equal(got.lon, [-157.8, -155.1])
    np.testing.assert_array_equal(got.lat, [21.3, 19.7])
    assert got.ids["id"].tolist() == [7, 8]


def test_column_names_padded_with_spaces_are_found(tmp_path: Path) -> None:
    """A CSV written with ", " between its fields names its columns " Lon " and " Lat "."""
    path = tmp_path / "sites.csv"
    path.write_text("Site ID, Lon , Lat \nA, -157.8, 21.3\nB,-155.1,19.7\n")
    got = read_locations(path)
    assert got.source == "lon/lat"
    np.testing.assert_array_equal(got.lon, [-157.8, -155.1])
    np.testing.assert_array_equal(got.lat, [21.3, 19.7])
    assert list(got.ids.columns) == ["Site ID", " Lon ", " Lat "]  # the file's own names kept
    path.write_text("site, quadkey \nA,0222111112333310\n")
    assert read_locations(path).source == "quadkey"


@pytest.mark.parametrize(("name", "driver"), [("sites.geojson", "GeoJSON"), ("sites.gpkg", "GPKG")])
def test_geometries_are_reprojected_and_polygons_give_an_inner_point(
    tmp_path: Path, name: str, driver: str
) -> None:
    square = shapely.box(-157.9, 21.3, -157.8, 21.4)
    gdf = gpd.GeoDataFrame(
        {"name": ["p", "q"]}, geometry=[shapely.Point(-155.1, 19.7), square], crs=4326
    ).to_crs(3857)
    path = tmp_path / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gdf.to_file(path, driver=driver)
    got = read_locations(path)
    assert got.source == "geometry"
    np.testing.assert_allclose([got.lon[0], got.lat[0]], [-155.1, 19.7], atol=1e-9)
    assert square.contains(shapely.Point(got.lon[1], got.lat[1]))
    assert list(got.ids.columns) == ["name"]  # the geometry is not an id


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("sites.xml", "x", "unknown file type"),
        ("sites.csv", "lon,lat\n", "has no rows"),
        ("sites.csv", "quadkey\n0230\n02301\n", "2 lengths"),
        ("sites.csv", "quadkey\n2301230123012\n2301230123013\n", "13-digit quadkeys"),
        ("sites.csv", "lat,lon\n-99.5,39.6\n", "swapped"),
        ("sites.csv", "name\nA\n", "no place columns"),
        ("sites.csv", "id;lon;lat\nA;-155.1;19.7\n", "separate its columns by ';'"),
    ],
)
def test_unusable_files_are_refused_naming_the_file(
    tmp_path: Path, name: str, content: str, match: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=match) as info:
        read_locations(path)
    assert str(path) in str(info.value)
    with pytest.raises(DataError, match="no such file"):
        read_locations(tmp_path / "missing.csv")
    with pytest.raises(DataError, match="is a folder"):
        read_locations(tmp_path)


def test_longitudes_of_a_0_to_360_convention_are_taken_back(tmp_path: Path) -> None:
    path = tmp_path / "aleutians.csv"
    path.write_text("id,lon,lat\nadak,183.35,51.88\nshemya,174.11,52.71\n")
    got = read_locations(path)
    np.testing.assert_allclose(got.lon, [-176.65, 174.11])
    path.write_text("id,lon,lat\nx,361.0,51.0\n")
    with pytest.raises(DataError, match=r"outside lon \[-180, 180\] \(or 0-360\)"):
        read_locations(path)


def test_places_from_a_workbook_a_shapefile_zip_and_numeric_quadkeys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Agencies hand lists on as Excel workbooks and zipped shapefiles; a parquet column of
    quadkeys stored as numbers lost their leading zeros, which are put back."""
    keys = ["0230123012301230", "0230123012301231"]
    lon, lat = quadkey_centroid(np.array(keys))
    book = tmp_path / "sites.xlsx"
    pd.DataFrame({"site": ["007", "008"], "lon": lon, "lat": lat}).to_excel(book, index=False)
    got = read_locations(book)
    assert got.ids["site"].tolist() == ["007", "008"] and got.source == "lon/lat"
    np.testing.assert_allclose(got.lat, lat)
    points = gpd.GeoDataFrame({"site": ["A", "B"]}, geometry=gpd.points_from_xy(lon, lat), crs=4326)
    shp = tmp_path / "sites.shp"
    points.to_crs(3857).to_file(shp)
    zipped = tmp_path / "sites.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for part in tmp_path.glob("sites.*"):
            if part.suffix in (".shp", ".shx", ".dbf", ".prj", ".cpg"):
                zf.write(part, part.name)
    got = read_locations(zipped)
    assert got.source == "geometry"
    np.testing.assert_allclose(got.lon, lon, atol=1e-9)
    numeric = tmp_path / "sites.parquet"
    pd.DataFrame({"quadkey": [int(k) for k in keys]}).to_parquet(numeric)
    got = read_locations(numeric)
    np.testing.assert_allclose(got.lat, lat)
    assert "zero-padded back to 16 digits" in caplog.text


def test_a_csv_opened_by_hash_lines_is_read_below_them(tmp_path: Path) -> None:
    """geodbk's own CSVs (`predict --at`, `service --at`) open with ``# `` lines saying what
    they hold; fed back as places (another target or quantity) they are read below them,
    ids kept as text and a ``#`` inside a quoted cell kept."""
    path = tmp_path / "download_places.csv"
    path.write_text(
        "# geodbk predict --at places.csv: download, tile quantity, 2023Q4\n"
        "# Data: Speedtest(R) by Ookla(R). Licence: CC BY-NC-SA 4.0\n"
        '"site_id","name","lon","lat","mean"\n'
        '"007","Suite #4",-157.8583,21.3069,5.34\n'
        '"012","Waikiki",-157.8292,21.2793,5.33\n',
        encoding="utf-8",
    )
    got = read_locations(path)
    assert got.source == "lon/lat"
    assert got.ids["site_id"].tolist() == ["007", "012"]
    assert got.ids["name"].tolist() == ["Suite #4", "Waikiki"]
    np.testing.assert_allclose(got.lon, [-157.8583, -157.8292])


def test_a_header_starting_with_a_hash_is_still_the_header(tmp_path: Path) -> None:
    """A column named ``#id`` (no space after the ``#``) is a header, not a comment line."""
    path = tmp_path / "hash_header.csv"
    path.write_text("#id,lon,lat\n1,10.0,50.0\n", encoding="utf-8")
    got = read_locations(path)
    assert got.ids["#id"].tolist() == ["1"]
