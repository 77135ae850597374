"""Probes of polygon files that lost their CRS (a shapefile without its ``.prj``): projected
coordinates must not pass as lon/lat in any of ingest's layers, and ``summarize --areas``
says the same about them."""

from __future__ import annotations

import warnings
from pathlib import Path

import geopandas as gpd
import pytest
import shapely
from geo_helpers import make_tiles, write_hive

from geodbk.errors import DataError
from geodbk.geo import regions
from geodbk.geo.areas import read_areas
from pipelines import cli

BOXES = [shapely.box(-158.0, 21.3, -157.7, 21.5), shapely.box(-156.1, 19.5, -155.8, 19.8)]
NO_CRS = "has no coordinate reference system and its coordinates are not lon/lat degrees"


def _shapefile_without_prj(path: Path, columns: dict, *, crs: str) -> Path:
    gdf = gpd.GeoDataFrame(columns, geometry=BOXES, crs="EPSG:4326").to_crs(crs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gdf.to_file(path)
    path.with_suffix(".prj").unlink()
    return path


@pytest.mark.parametrize("option", ["--tracts", "--urban-areas", "--region"])
def test_a_projected_layer_without_its_crs_is_refused_by_ingest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    tiles = tmp_path / "tiles"
    write_hive(tiles, make_tiles(40).drop(columns="tile"), kind="fixed", year=2023, q=4)
    columns = {"GEOID10": ["15003000100", "15001021300"], "UACE20": ["89770", "12345"]}
    layer = _shapefile_without_prj(tmp_path / "layer.shp", columns, crs="EPSG:26904")
    rural = tmp_path / "rural.csv"
    rural.write_text("FIPS\n15001021300\n")
    argv = ["ingest", "--tiles", str(tiles), "--run", str(tmp_path / "run"), option, str(layer)]
    if option == "--tracts":
        argv += ["--rural-tracts", str(rural)]
    if option != "--region":
        argv += ["--bbox", "-158.3", "21.2", "-157.6", "21.8"]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err
    assert f"{layer} {NO_CRS}" in err and ".prj" in err
    assert not (tmp_path / "run" / "tiles.parquet").exists()
    with pytest.raises(DataError, match=NO_CRS):  # summarize --areas: the same sentence
        read_areas(layer)


def test_a_lonlat_layer_without_its_crs_is_read_within_the_box(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layer = _shapefile_without_prj(tmp_path / "ua.shp", {"UACE20": ["1", "2"]}, crs="EPSG:4326")
    with caplog.at_level("WARNING", logger="geodbk"):
        gdf = regions.read_vector(layer, bbox=(-158.3, 21.2, -157.6, 21.8))
    assert gdf.crs == "EPSG:4326" and gdf["UACE20"].tolist() == ["1"]
    assert any("has no CRS" in r.getMessage() for r in caplog.records)
