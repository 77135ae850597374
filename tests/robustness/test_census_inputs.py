"""Probes of broken census inputs that would otherwise label every tile urban or every tile
rural without a word (the worst class: a silently wrong result)."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo import census
from pipelines.ingest import urban_checks

BOX = shapely.box(-158.0, 21.2, -157.7, 21.5)


def _layer(path: Path, columns: dict, geometry: list) -> Path:
    gpd.GeoDataFrame(columns, geometry=geometry, crs=4326).to_file(path, driver="GeoJSON")
    return path


def _rural_list(path: Path, ids: list[str]) -> Path:
    path.write_text("FCC rural tracts\n\nFIPS\n" + "\n".join(ids) + "\n")
    return path


def test_tracts_whose_geometries_are_all_null_are_refused(tmp_path: Path) -> None:
    tracts = _layer(tmp_path / "tracts.geojson", {"GEOID10": ["15003000100"]}, [None])
    rural = _rural_list(tmp_path / "rural.csv", ["15003000200"])
    with pytest.raises(DataError, match="every one of the 1 census-tract geometries") as info:
        census.read_tract_urban(tracts, rural)
    assert str(tracts) in str(info.value)


def test_a_states_file_passed_as_tracts_is_refused(tmp_path: Path) -> None:
    states = _layer(tmp_path / "states.geojson", {"GEOID": ["15"], "STUSPS": ["HI"]}, [BOX])
    rural = _rural_list(tmp_path / "rural.csv", ["15003000200"])
    with pytest.raises(DataError, match=r"2-digit codes .*not 11-digit census-tract GEOIDs"):
        census.read_tract_urban(states, rural)


def test_a_rural_list_without_the_states_tracts_is_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Loud, not fatal: a state may have no rural tract at all (the District of Columbia)."""
    tracts = _layer(tmp_path / "tracts.geojson", {"GEOID10": ["15003000100"]}, [BOX])
    rural = _rural_list(tmp_path / "rural.csv", ["06001400100", "06001400200"])  # California
    with caplog.at_level("WARNING", logger="geodbk"):
        layer = census.read_tract_urban(tracts, rural)
    assert layer.info["rural_list_covers_state"] is False
    assert any("no tract of state(s) 15" in r.getMessage() for r in caplog.records)


def test_urban_areas_with_null_geometries_are_refused(tmp_path: Path) -> None:
    ua = _layer(tmp_path / "ua.geojson", {"UACE20": ["89770", "12345"]}, [None, None])
    with pytest.raises(DataError, match="urban-area geometries is null"):
        census.read_urban_areas(ua)


def test_a_partly_damaged_layer_is_kept_and_counted(tmp_path: Path) -> None:
    ua = _layer(tmp_path / "ua.geojson", {"UACE20": ["89770", "12345"]}, [BOX, None])
    layer = census.read_urban_areas(ua)
    assert layer.info["null_geometries"] == 1


@pytest.mark.parametrize(
    ("n_urban", "n", "warned"),
    [(0, 500, True), (500, 500, True), (499, 500, True), (200, 500, False), (0, 0, False)],
)
def test_one_class_labels_are_flagged(n_urban: int, n: int, warned: bool) -> None:
    checks = urban_checks(n_urban, n)
    assert (checks["warning"] is not None) == warned
    if warned:
        assert "check the census input" in checks["warning"]


def test_ingest_records_the_urban_checks(tmp_path: Path) -> None:
    import json

    from pipelines.ingest import demo_ingest_kwargs, run_ingest

    run_ingest(run=tmp_path / "run", **demo_ingest_kwargs())
    report = json.loads((tmp_path / "run" / "ingest_report.json").read_text())
    checks = report["urban_source"]["checks"]
    assert 0.2 < checks["urban_share"] < 0.6 and checks["warning"] is None
    assert report["urban_source"]["null_geometries"] == 0


def test_the_uncovered_state_warning_says_what_is_labelled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A list whose GEOIDs match no tract of the state labels every tract urban, while a tile
    outside every tract stays rural: the warning may not say that every tile is urban."""
    tracts = _layer(tmp_path / "tracts.geojson", {"GEOID10": ["15003000100"]}, [BOX])
    rural = _rural_list(tmp_path / "rural.csv", ["1500300010"])  # a digit lost: read as state 01
    with caplog.at_level("WARNING", logger="geodbk"):
        layer = census.read_tract_urban(tracts, rural)
    inside, outside = layer.label([-157.9, -150.0], [21.3, 21.3]).tolist()
    assert inside and not outside
    (message,) = [r.getMessage() for r in caplog.records if "no tract of state" in r.getMessage()]
    assert "every tile is labelled urban" not in message
    assert "every tract is labelled urban" in message and "outside" in message


def test_a_layer_without_a_tract_geoid_names_its_columns_and_the_fix(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "blocks.geojson", {"BLOCKCE": ["1001"], "NAME": ["a"]}, [BOX])
    rural = _rural_list(tmp_path / "rural.csv", ["15003000200"])
    with pytest.raises(DataError, match="not a census-tract layer") as info:
        census.read_tract_urban(layer, rural)
    message = str(info.value)
    assert str(layer) in message and "GEOID20" in message
    assert "BLOCKCE" in message and "NAME" in message  # the columns it has
    assert "--tracts" in message and "tl_2010_15_tract10.zip" in message
