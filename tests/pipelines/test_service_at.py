"""``geodbk service --at FILE``: class probabilities at listed places, with the input's ids."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely
from pipeline_helpers import fake_service

from geodbk.geo.locations import Locations
from pipelines.run_inputs import tile_ids
from pipelines.rundir import PARQUET_LICENCE_KEY, RunDir
from pipelines.service_at import SERVICE_KEY, output_columns, write_classes_at


def _run(root: Path) -> RunDir:
    rd = RunDir(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpd.GeoDataFrame(geometry=[shapely.box(-158, 21, -157, 22)], crs=4326).to_file(
            rd.region, driver="GeoJSON"
        )
    meta = {b"geodbk": json.dumps({"schema_version": 1}).encode()}
    pq.write_table(pa.table({"x1": [0.0]}).replace_schema_metadata(meta), rd.tiles)
    return rd


def test_places_get_classes_and_places_outside_the_region_are_marked(tmp_path: Path) -> None:
    rd, service = _run(tmp_path), fake_service()
    lon, lat = np.array([-157.5, -157.2, 10.0]), np.array([21.5, 21.1, 50.0])
    ids = pd.DataFrame({"site": ["a", "b", "far"], "quantity": [1, 2, 3]})
    path = write_classes_at(rd, service, Locations(ids, lon, lat, "lon/lat"), stem="sites")
    assert path == rd.root / "service" / "classes_sites.parquet"
    got = pd.read_parquet(path)
    # the input's columns first, a clash with an output name renamed
    assert list(got.columns) == ["site", "input_quantity", *output_columns(service)]
    assert got["outside_region"].tolist() == [False, False, True]
    want = service.predict(lon[:2], lat[:2])
    np.testing.assert_allclose(got["p_served"][:2], want["p_served"])
    np.testing.assert_allclose(got["p_tier_2"][:2], want["p_tier_2"])
    assert got["service_class"].tolist()[:2] == ["underserved", "underserved"]
    assert got["p_unserved"].isna().tolist() == [False, False, True]
    assert pd.isna(got["service_class"][2])
    assert got["quadkey"].tolist() == tile_ids(lon, lat).astype(str).tolist()
    assert (got["quantity"] == "tile").all() and (got["quarter"] == "2023Q4").all()
    meta = pq.read_schema(path).metadata
    assert json.loads(meta[SERVICE_KEY])["tiers"] == "25/3,100/20"
    assert "license" in json.loads(meta[PARQUET_LICENCE_KEY])


def test_each_quantity_writes_its_own_file(tmp_path: Path) -> None:
    rd, service = _run(tmp_path), fake_service()
    places = Locations(
        pd.DataFrame({"site": ["a"]}), np.array([-157.5]), np.array([21.5]), "lon/lat"
    )
    tile = write_classes_at(rd, service, places, stem="sites")
    area = write_classes_at(rd, replace(service, quantity="area"), places, stem="sites")
    # the area classes sit beside the tile classes rather than replace them
    assert area == rd.root / "service" / "classes_sites_area.parquet"
    assert tile.is_file() and pd.read_parquet(tile)["quantity"].tolist() == ["tile"]
    assert pd.read_parquet(area)["quantity"].tolist() == ["area"]


def test_the_quarter_status_of_the_service_is_in_every_row(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    service = replace(fake_service(), quarter_status="extrapolation beyond 2023Q4")
    places = Locations(
        pd.DataFrame({"site": ["a"]}), np.array([-157.5]), np.array([21.5]), "lon/lat"
    )
    got = pd.read_parquet(write_classes_at(rd, service, places, stem="sites"))
    assert list(got.columns) == ["site", *output_columns(service)]
    assert got["quarter_status"].tolist() == ["extrapolation beyond 2023Q4"]
    assert (
        json.loads(pq.read_schema(rd.classes_at("sites")).metadata[SERVICE_KEY])["quarter_status"]
        == "extrapolation beyond 2023Q4"
    )
