"""Areas files (geodbk.geo.areas): reading, ids, errors, and rasterising onto a map grid."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo.areas import Areas, cell_area_km2, disjoint_layers, read_areas
from geodbk.geo.grids import Grid

#: A 10 x 8 grid of 0.1° cells, west edge -100, north edge 40.
GRID = Grid(x=-100 + 0.1 * (np.arange(10) + 0.5), y=40 - 0.1 * (np.arange(8) + 0.5), dx=0.1, dy=0.1)
ALL_ROWS = slice(0, 8)


def _write(tmp_path: Path, gdf: gpd.GeoDataFrame, name: str = "areas.geojson") -> Path:
    path = tmp_path / name
    if path.suffix == ".parquet":
        gdf.to_parquet(path)
    else:
        gdf.to_file(path)
    return path


def _cell(row: int, col: int, shrink: float = 0.0) -> shapely.Polygon:
    """The polygon of grid cell (row, col), shrunk by ``shrink`` degrees on each side."""
    w = -100 + 0.1 * col
    n = 40 - 0.1 * row
    return shapely.box(w + shrink, n - 0.1 + shrink, w + 0.1 - shrink, n - shrink)


def test_reads_any_crs_and_detects_the_geoid_column(tmp_path: Path) -> None:
    gdf = gpd.GeoDataFrame(
        {"NAME20": ["a", "b"], "GEOID20": ["01001", "01003"], "other": [1, 2]},
        geometry=[_cell(0, 0), _cell(1, 1)],
        crs="EPSG:4326",
    ).to_crs("EPSG:3857")
    areas = read_areas(_write(tmp_path, gdf))
    assert areas.id_column == "GEOID20" and areas.ids.tolist() == ["01001", "01003"]
    assert areas.name_column == "NAME20" and areas.names is not None
    assert areas.names.tolist() == ["a", "b"]
    assert areas.frame.crs == "EPSG:4326" and areas.source == "areas.geojson"
    np.testing.assert_allclose(areas.polygons[0].bounds, (-100, 39.9, -99.9, 40), atol=1e-9)
    km2 = areas.polygon_area_km2()
    expected = cell_area_km2(np.array([39.95]), 0.1, 0.1)[0]
    np.testing.assert_allclose(km2[0], expected, rtol=2e-3)


def test_a_repeated_id_column_is_skipped_and_without_any_the_row_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gdf = gpd.GeoDataFrame(
        {"GEOID": ["x", "x"], "FIPS": [1001.0, 1003.0]},
        geometry=[_cell(0, 0), _cell(1, 1)],
        crs="EPSG:4326",
    )
    with caplog.at_level("WARNING", logger="geodbk"):
        areas = read_areas(_write(tmp_path, gdf))
    assert areas.id_column == "FIPS" and areas.ids.tolist() == ["1001", "1003"]
    # the skipped GEOID is told, with its repeated value, not only logged as the id chosen
    assert "id column 'GEOID' repeats x" in caplog.text and "by 'FIPS' instead" in caplog.text
    plain = gpd.GeoDataFrame({"v": [1, 2]}, geometry=[_cell(0, 0), _cell(1, 1)], crs=4326)
    areas = read_areas(_write(tmp_path, plain, "plain.geojson"))
    assert areas.id_column is None and areas.ids.tolist() == ["0", "1"]
    assert areas.names is None


@pytest.mark.parametrize("name", ["areas.gpkg", "areas.parquet", "areas.zip"])
def test_geopackage_geoparquet_and_zipped_shapefile(tmp_path: Path, name: str) -> None:
    gdf = gpd.GeoDataFrame({"GEOID": ["1", "2"]}, geometry=[_cell(0, 0), _cell(2, 2)], crs=4326)
    if name.endswith(".zip"):
        folder = tmp_path / "shp"
        folder.mkdir()
        gdf.to_file(folder / "tracts.shp")
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as zf:
            for part in folder.iterdir():
                zf.write(part, f"tracts/{part.name}")
    else:
        path = _write(tmp_path, gdf, name)
    areas = read_areas(path)
    assert areas.ids.tolist() == ["1", "2"] and areas.source == name


def test_a_missing_id_column_names_the_file_and_column_and_lists_the_columns(
    tmp_path: Path,
) -> None:
    gdf = gpd.GeoDataFrame({"GEOID": ["1"], "county": ["A"]}, geometry=[_cell(0, 0)], crs=4326)
    path = _write(tmp_path, gdf, "counties.geojson")
    with pytest.raises(DataError) as err:
        read_areas(path, id_column="geoid_x")
    text = str(err.value)
    assert "counties.geojson" in text and "'geoid_x'" in text and "--id-column" in text
    assert "GEOID" in text and "county" in text  # the available columns
    with pytest.raises(DataError, match="did you mean 'GEOID'"):
        read_areas(path, id_column="geoid")


def test_an_id_column_with_empty_values_is_refused(tmp_path: Path) -> None:
    gdf = gpd.GeoDataFrame(
        {"code": ["1", None]}, geometry=[_cell(0, 0), _cell(1, 1)], crs="EPSG:4326"
    )
    with pytest.raises(DataError, match=r"areas\.geojson: column 'code' \(--id-column\) is empty"):
        read_areas(_write(tmp_path, gdf), id_column="code")


def test_invalid_files_give_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.geojson"
    bad.write_text("{ not json", encoding="utf-8")
    with pytest.raises(DataError, match=r"broken\.geojson: cannot read this areas file"):
        read_areas(bad)
    plain = tmp_path / "table.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(plain)
    with pytest.raises(DataError, match=r"table\.parquet: a parquet file without GeoParquet"):
        read_areas(plain)
    with pytest.raises(DataError, match="no such areas file"):
        read_areas(tmp_path / "missing.geojson")
    points = gpd.GeoDataFrame({"id": [1]}, geometry=[shapely.Point(-99.95, 39.95)], crs=4326)
    with pytest.raises(DataError, match=r"points\.geojson: none of its 1 rows holds a polygon"):
        read_areas(_write(tmp_path, points, "points.geojson"))


def test_invalid_polygons_are_repaired_and_null_rows_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bowtie = shapely.Polygon([(-100, 40), (-99.8, 39.8), (-99.8, 40), (-100, 39.8)])
    assert not bowtie.is_valid
    gdf = gpd.GeoDataFrame({"id": ["bow", "null"]}, geometry=[bowtie, None], crs="EPSG:4326")
    with caplog.at_level(logging.WARNING, logger="geodbk"):
        areas = read_areas(_write(tmp_path, gdf))
    assert areas.repaired == 1 and areas.unusable == 1
    assert areas.polygons[0].is_valid and areas.polygons[0].area > 0
    assert areas.layers.tolist() == [0, -1]
    assert "repaired 1 invalid polygon" in caplog.text and "hold no polygon" in caplog.text


def _areas(tmp_path: Path, geoms: list[shapely.Polygon]) -> Areas:
    gdf = gpd.GeoDataFrame({"id": [str(i) for i in range(len(geoms))]}, geometry=geoms, crs=4326)
    return read_areas(_write(tmp_path, gdf))


def test_a_one_cell_polygon_rasterises_to_exactly_that_cell(tmp_path: Path) -> None:
    areas = _areas(tmp_path, [_cell(3, 4, shrink=0.02), _cell(5, 5)])
    (raster,) = areas.rasterise(GRID, ALL_ROWS)
    assert raster.dtype == np.int32 and raster.shape == (8, 10)
    assert list(zip(*np.nonzero(raster == 0), strict=True)) == [(3, 4)]
    assert list(zip(*np.nonzero(raster == 1), strict=True)) == [(5, 5)]
    assert (raster >= 0).sum() == 2
    # row blocks give the same cells as the whole grid
    top, bottom = areas.rasterise(GRID, slice(0, 4))[0], areas.rasterise(GRID, slice(4, 8))[0]
    np.testing.assert_array_equal(np.vstack([top, bottom]), raster)


def test_overlapping_polygons_go_to_separate_layers_and_keep_every_cell(tmp_path: Path) -> None:
    big = shapely.box(-100, 39.6, -99.6, 40)  # rows 0-3, cols 0-3
    inner = shapely.box(-99.9, 39.7, -99.7, 39.9)  # rows 1-2, cols 1-2, inside big
    neighbour = shapely.box(-99.6, 39.6, -99.2, 40)  # touches big along lon -99.6
    areas = _areas(tmp_path, [big, inner, neighbour])
    assert areas.layers.tolist() == [0, 1, 0] and areas.n_layers == 2
    first, second = areas.rasterise(GRID, ALL_ROWS)
    assert (first == 0).sum() == 16 and (second == 1).sum() == 4 and (first == 2).sum() == 16
    assert ((second == 1) <= (first == 0)).all()  # every inner cell is also in big


def test_disjoint_layers_of_a_tiling_is_one_layer() -> None:
    tiles = [_cell(r, c) for r in range(3) for c in range(3)]
    assert disjoint_layers(np.array(tiles, dtype=object)).tolist() == [0] * 9
    crossed = [shapely.box(0, 0, 2, 2), shapely.box(1, 1, 3, 3), shapely.box(1.5, 0, 2.5, 1.2)]
    layers = disjoint_layers(np.array([*crossed, None], dtype=object))
    assert layers.tolist() == [0, 1, 2, -1]


def test_outside_and_tiny_polygons(tmp_path: Path) -> None:
    outside = shapely.box(10, 10, 11, 11)
    tiny = shapely.Point(-99.53, 39.74).buffer(0.005)  # inside cell (2, 4), off its centre
    areas = _areas(tmp_path, [outside, tiny])
    (raster,) = areas.rasterise(GRID, ALL_ROWS)
    assert (raster < 0).all()  # neither holds a cell centre
    row, col = areas.representative_cells(GRID, np.array([0, 1]))
    assert row.tolist() == [-1, 2] and col.tolist() == [-1, 4]


def test_points_are_matched_to_every_polygon_holding_them(tmp_path: Path) -> None:
    areas = _areas(tmp_path, [shapely.box(0, 0, 2, 2), shapely.box(1, 1, 3, 3)])
    points, which = areas.areas_of_points(np.array([0.5, 1.5, 5.0]), np.array([0.5, 1.5, 5.0]))
    pairs = sorted(zip(points.tolist(), which.tolist(), strict=True))
    assert pairs == [(0, 0), (1, 0), (1, 1)]
