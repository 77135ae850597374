"""A run's region and urban polygons, the tile of a point and the quarters of its table."""

from __future__ import annotations

import warnings
from pathlib import Path

import geopandas as gpd
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo.quadkey import quadkey_centroid
from geodbk.tile_effect import tile_id_strings
from pipelines.run_inputs import (
    observed_quarters,
    pooled_label,
    read_region,
    read_urban,
    region_area_caveat,
    tile_codes,
    tile_ids,
)
from pipelines.rundir import RunDir


def _write(path: Path, geoms: list[object], crs: int = 4326) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpd.GeoDataFrame(geometry=geoms, crs=4326).to_crs(crs).to_file(path, driver="GeoJSON")


def test_region_is_the_union_in_lon_lat_and_a_missing_urban_layer_is_named(
    tmp_path: Path,
) -> None:
    rd = RunDir(tmp_path)
    a, b = shapely.box(0, 0, 1, 1), shapely.box(1, 0, 2, 1)
    _write(rd.region, [a, b], crs=3857)  # stored projected: read back in EPSG:4326
    region = read_region(rd)
    assert region.area == pytest.approx(2.0, rel=1e-6)
    assert region.contains(shapely.Point(1.0, 0.5))
    with pytest.raises(DataError, match=r"urban_areas.geojson is missing.*--noise tests\+devices"):
        read_urban(rd, target="download")
    _write(rd.urban_areas, [a])
    assert read_urban(rd, target="download").contains(shapely.Point(0.5, 0.5))
    rd.region.write_text("not json")
    with pytest.raises(DataError, match=r"cannot read region .*geodbk ingest"):
        read_region(rd)


def test_tile_ids_are_the_zoom_16_tiles_of_the_points() -> None:
    keys = tile_ids(np.array([-157.85, 10.0]), np.array([21.3, -5.0]))
    assert all(len(k) == 16 for k in keys)
    lon, lat = quadkey_centroid(keys)
    np.testing.assert_allclose(lon, [-157.85, 10.0], atol=360 / 2**16)
    np.testing.assert_allclose(lat, [21.3, -5.0], atol=360 / 2**16)


def test_observed_quarters_from_the_metadata_or_the_table(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert observed_quarters(rd, {"quarters": ["2023Q2", "2022-Q4"]}) == ["2022Q4", "2023Q2"]
    assert observed_quarters(rd, {"tiles_metadata": {"quarters": ["2021Q1"]}}) == ["2021Q1"]
    pq.write_table(pa.table({"quarter": ["2023Q3", "2023Q1", None, "2023Q3"]}), rd.tiles)
    assert observed_quarters(rd, {}) == ["2023Q1", "2023Q3"]
    pq.write_table(pa.table({"x1": [0.0]}), rd.tiles)
    assert observed_quarters(rd, {}) == []


def test_tile_codes_name_the_same_tiles_as_tile_ids() -> None:
    rng = np.random.default_rng(4)
    # points of a few hundred zoom-16 tiles, many points per tile, two far apart groups
    lon = np.concatenate([rng.uniform(-157.9, -157.8, 5000), rng.uniform(170.0, 170.05, 500)])
    lat = np.concatenate([rng.uniform(21.3, 21.35, 5000), rng.uniform(-45.0, -44.97, 500)])
    codes = tile_codes(lon, lat)
    names = tile_ids(lon, lat)
    np.testing.assert_array_equal(tile_id_strings(codes), names)
    assert len(codes.categories) == np.unique(names).size < names.size
    # the categories are integer tile keys, sorted, one per distinct tile
    keys = np.asarray(codes.categories)
    assert keys.dtype == np.int64 and (np.diff(keys) > 0).all()


def test_a_pooled_maps_label_names_its_quarters() -> None:
    assert pooled_label(["2019Q1", "2023Q4"]) == "pooled 2019Q1:2023Q4"
    assert pooled_label(["2020Q4"]) == "pooled 2020Q4"  # one quarter, not 2020Q4:2020Q4
    assert pooled_label([]) == "pooled"


@pytest.mark.parametrize(("kind", "caveat"), [("bbox", True), ("tiles", True), ("state", False)])
def test_area_shares_of_a_rectangular_region_carry_a_caveat(
    tmp_path: Path, kind: str, caveat: bool
) -> None:
    rd = RunDir(tmp_path)
    gpd.GeoDataFrame(
        {"name": ["r"], "kind": [kind]}, geometry=[shapely.box(0, 0, 1, 1)], crs=4326
    ).to_file(rd.region, driver="GeoJSON")
    got = region_area_caveat(rd)
    assert (got is not None) == caveat
    if caveat:
        assert "water" in str(got) and "--state or --region" in str(got)
    assert region_area_caveat(RunDir(tmp_path / "none")) is None  # no region file: no claim
