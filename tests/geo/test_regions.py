"""Regions and the [-1, 1]² scaling."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo import regions


@pytest.fixture
def states(tmp_path: Path) -> Path:
    gdf = gpd.GeoDataFrame(
        {
            "STATEFP": ["15", "06"],
            "GEOID": ["15", "06"],
            "STUSPS": ["HI", "CA"],
            "NAME": ["Hawaii", "California"],
        },
        geometry=[shapely.box(-160, 18, -154, 23), shapely.box(-124, 32, -114, 42)],
        crs="EPSG:4326",
    ).to_crs("EPSG:4269")
    path = tmp_path / "states.geojson"
    gdf.to_file(path)
    return path


@pytest.mark.parametrize("key", ["HI", "hi", "Hawaii", "15"])
def test_state_by_code_name_or_fips(states: Path, key: str) -> None:
    r = regions.state_region(states, key)
    assert r.name == "Hawaii" and r.kind == "state"
    np.testing.assert_allclose(r.bounds, (-160, 18, -154, 23), atol=1e-6)
    assert r.contains([-157.0, -120.0], [21.0, 35.0]).tolist() == [True, False]


def test_unknown_state_lists_choices(states: Path) -> None:
    with pytest.raises(DataError, match=r"no state 'ZZ'.*CA, HI"):
        regions.state_region(states, "ZZ")


def test_resolve_region_variants(states: Path, tmp_path: Path) -> None:
    assert regions.resolve_region() is None
    with pytest.raises(DataError, match="--states-file"):
        regions.resolve_region(state="HI")
    with pytest.raises(DataError, match="only one"):
        regions.resolve_region(state="HI", states_file=states, bbox=(0, 0, 1, 1))
    b = regions.resolve_region(bbox=(-158, 21, -157, 22))
    assert b is not None and b.kind == "bbox"
    assert b.contains([-157.5, -156.0], [21.5, 21.5]).tolist() == [True, False]
    with pytest.raises(DataError, match="WEST SOUTH EAST NORTH"):
        regions.bbox_region(1, 0, 0, 1)
    poly = regions.resolve_region(region=states)
    assert poly is not None and poly.kind == "polygon"


def test_scaling_round_trip() -> None:
    s = regions.Scaling.from_bounds((-160, 18, -154, 23))
    x1, x2 = s.scale([-160, -154, -157], [18, 23, 20.5])
    np.testing.assert_allclose(x1, [-1, 1, 0])
    np.testing.assert_allclose(x2, [-1, 1, 0])
    assert regions.Scaling.from_dict(s.to_dict()) == s


def test_region_geojson_round_trip(states: Path, tmp_path: Path) -> None:
    r = regions.state_region(states, "CA")
    out = tmp_path / "run" / "region.geojson"
    regions.write_region_geojson(r, out)
    back = gpd.read_file(out)
    assert back["name"].tolist() == ["California"]
    geom = back.geometry.iloc[0]
    assert geom.equals_exact(r.geometry, 1e-9) or geom.equals(r.geometry)


def test_a_bbox_across_the_meridian_is_one_region_and_a_swapped_one_is_refused() -> None:
    region = regions.bbox_region(172.0, 51.0, -129.0, 72.0)
    assert region.extent == pytest.approx((172.0, 51.0, 231.0, 72.0))
    inside = region.contains([175.0, -150.0, 0.0, -128.0], [60.0, 60.0, 60.0, 60.0])
    assert inside.tolist() == [True, True, False, False]
    assert region.scaling().lon_max == pytest.approx(231.0)
    with pytest.raises(DataError, match=r"359° wide.*--bbox -100.0 39.0 -99.0 40.0\?"):
        regions.bbox_region(-99.0, 39.0, -100.0, 40.0)


@pytest.mark.realdata
def test_alaska_from_the_census_state_file_is_one_region_in_one_frame(hawaii_dir: Path) -> None:
    from geodbk.geo.grids import make_grid, region_mask

    alaska = regions.state_region(hawaii_dir / "census" / "cb_2018_us_state_500k.zip", "AK")
    w, _, e, _ = alaska.extent
    assert 172.0 < w < 173.0 and 229.5 < e < 230.5  # Attu to the Yukon border, not the globe
    assert alaska.bounds[2] - alaska.bounds[0] > 358.0  # as the file holds it
    towns = {"Attu": (173.18, 52.85), "Shemya": (174.11, 52.71), "Adak": (-176.65, 51.88)}
    lon, lat = np.array(list(towns.values())).T
    assert alaska.contains(lon, lat).all()
    x1, _ = alaska.scaling().scale(lon, lat)
    assert ((-1.0 < x1) & (x1 < 1.0)).all() and (np.diff(x1) > 0).all()  # west to east
    grid = make_grid(alaska.extent, resolution=0.25)
    mask = region_mask(alaska.geometry, grid)
    assert mask[:, grid.x < 180.0].any() and mask[:, grid.x > 180.0].any()


def test_a_geopackage_of_several_layers_needs_the_layer_named(tmp_path: Path) -> None:
    path = tmp_path / "layers.gpkg"
    for layer, box in (("counties", (0, 0, 5, 5)), ("tracts", (0, 0, 1, 1))):
        gdf = gpd.GeoDataFrame({"GEOID": ["1"]}, geometry=[shapely.box(*box)], crs="EPSG:4326")
        gdf.to_file(path, layer=layer)
    with pytest.raises(DataError, match=r"2 layers \(counties, tracts\).*layers\.gpkg!LAYER"):
        regions.read_vector(path, what="census-tract")
    got = regions.read_vector(f"{path}!tracts", bbox=(-1, -1, 2, 2), what="census-tract")
    assert got.total_bounds.tolist() == [0, 0, 1, 1]
    with pytest.raises(DataError, match="no layer 'blocks' in the file; it holds counties, tracts"):
        regions.read_vector(f"{path}!blocks")
