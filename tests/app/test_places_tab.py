"""The Places tab on the demo run's ``predict --at`` and ``service --at`` outputs: points on
the map with their quantity, unit and interval; the table with the places file's own ids;
places outside the region counted, not drawn; a run without places names the command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from apptest_helpers import AppFactory, legend_titles, open_tab, texts


def test_the_places_tab_maps_a_predictions_file_with_quantity_and_units(
    make_app: AppFactory, tiny_run: Path, tmp_path: Path
) -> None:
    run = shutil.copytree(tiny_run, tmp_path / "runs" / "places")
    from pipelines.predict_at import run_predict_at

    far = tmp_path / "mixed.csv"
    inside = pd.read_parquet(run / "tiles.parquet", columns=["lon", "lat"]).iloc[[0, -1]]
    pd.DataFrame(
        {"site": ["a", "b", "far"], "lon": [*inside["lon"], 10.0], "lat": [*inside["lat"], 10.0]}
    ).to_csv(far, index=False)
    run_predict_at(run, far, target="download")
    at = make_app(tmp_path / "runs", "places")
    at.run()
    tab = open_tab(at, "Places")
    labels = list(tab.selectbox(key="places_file").options)
    assert any(lb.startswith("mixed.csv: tile quantity") for lb in labels), labels
    assert any("service classes" in lb for lb in labels), labels
    at.selectbox(key="places_file").set_value(
        next(p for p in at.selectbox(key="places_file").options if "mixed.csv" in str(p))
    )
    at.run()
    tab = open_tab(at, "Places")
    (legend,) = legend_titles(tab)
    assert "Median of the tile: " in legend and "Mbps" in legend
    chart = json.loads(tab.get("deck_gl_json_chart")[0].proto.json)
    places = next(layer for layer in chart["layers"] if layer["id"] == "places")
    assert len(places["data"]) == 2  # the place outside the region is not drawn
    assert "95%" in places["data"][0]["label"]
    frame = tab.dataframe[0].value
    assert list(frame["site"]) == ["a", "b", "far"]
    assert list(frame["outside_region"]) == [False, False, True]
    config = json.loads(tab.dataframe[0].proto.columns)
    assert config["median"]["label"] == "median (Mbps)"
    assert config["lower_natural"]["label"] == "95% lower (Mbps)"
    caption = " ".join(texts(tab, "caption"))
    assert "3 places: 2 mapped, 1 outside the region (no values)" in caption
    assert "tile: " in caption  # the quantity named
    (button,) = tab.get("download_button")
    assert button.proto.label == "Download the table (CSV)"


def test_the_places_tab_shows_service_classes_at_places(
    make_app: AppFactory, tiny_run: Path
) -> None:
    at = make_app(tiny_run.parent, tiny_run.name)
    at.run()
    open_tab(at, "Places")
    box = at.selectbox(key="places_file")
    box.set_value(next(p for p in box.options if "service classes" in str(p)))
    at.run()
    tab = open_tab(at, "Places")
    frame = tab.dataframe[0].value
    assert "service_class" in frame and "location_id" in frame
    config = json.loads(tab.dataframe[0].proto.columns)
    assert config["p_unserved"]["type_config"]["format"] == "percent"
    chart = json.loads(tab.get("deck_gl_json_chart")[0].proto.json)
    places = next(layer for layer in chart["layers"] if layer["id"] == "places")
    assert len(places["data"]) == 40
    assert "probability" in places["data"][0]["label"]


def test_a_run_without_places_names_the_command(
    make_app: AppFactory, tiny_run: Path, tmp_path: Path
) -> None:
    run = shutil.copytree(tiny_run, tmp_path / "bare")
    shutil.rmtree(run / "predictions")
    for path in (run / "service").glob("classes_*.parquet"):
        path.unlink()
    at = make_app(tmp_path, "bare")
    at.run()
    info = " ".join(i.value for i in open_tab(at, "Places").info)
    assert "no predictions at places" in info and "geodbk predict --run" in info
    assert "--at LOCATIONS.csv" in info


def test_a_file_with_no_place_in_the_region_says_so_and_keeps_its_table(
    make_app: AppFactory, tiny_run: Path, tmp_path: Path
) -> None:
    from pipelines.predict_at import run_predict_at

    run = shutil.copytree(tiny_run, tmp_path / "runs" / "far")
    shutil.rmtree(run / "predictions")
    for path in (run / "service").glob("classes_*.parquet"):
        path.unlink()
    far = tmp_path / "far.csv"
    pd.DataFrame({"site": ["x", "y"], "lon": [10.0, 11.0], "lat": [10.0, 11.0]}).to_csv(
        far, index=False
    )
    run_predict_at(run, far, target="download")
    at = make_app(tmp_path / "runs", "far")
    at.run()
    tab = open_tab(at, "Places")
    assert any("nothing to map" in i for i in texts(tab, "info"))
    assert not tab.get("deck_gl_json_chart")
    assert list(tab.dataframe[0].value["site"]) == ["x", "y"]
    assert "2 places: 0 mapped, 2 outside the region (no values)" in " ".join(texts(tab, "caption"))


def test_the_places_files_own_columns_are_those_before_quadkey() -> None:
    """An input column named like a probability (``p_code``) or renamed on a clash
    (``input_quadkey``) is the file's own; the outputs after ``quadkey`` are not."""
    from app.tabs.places_tab import id_columns

    frame = pd.DataFrame(
        columns=["p_code", "input_quadkey", "quadkey", "lon", "lat", "p_unserved", "quarter"]
    )
    assert id_columns(frame) == ["p_code", "input_quadkey"]
    assert id_columns(pd.DataFrame(columns=["site", "median", "p_served"])) == ["site"]


def test_a_large_places_file_draws_a_sample_and_says_so(
    make_app: AppFactory, tiny_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond ``MAX_DRAWN_PLACES`` the map draws a seeded random sample, beyond
    ``MAX_TABLE_ROWS`` the table shows the first rows, and the caption says both (here with
    the limits lowered under the demo's 40 places)."""
    from app.tabs import places_tab

    monkeypatch.setattr(places_tab, "MAX_DRAWN_PLACES", 15)
    monkeypatch.setattr(places_tab, "MAX_TABLE_ROWS", 25)
    at = make_app(tiny_run.parent, tiny_run.name)
    at.run()
    tab = open_tab(at, "Places")
    chart = json.loads(tab.get("deck_gl_json_chart")[0].proto.json)
    drawn = next(layer for layer in chart["layers"] if layer["id"] == "places")["data"]
    assert len(drawn) == 15
    assert len(tab.dataframe[0].value) == 25
    caption = " ".join(texts(tab, "caption"))
    assert "the map draws a random 15 of them" in caption
    assert "the table shows the first 25 rows" in caption
    frame = pd.read_parquet(tiny_run / "predictions" / "download_demo_locations.parquet")
    again = places_tab.drawn_places(frame, 15)
    assert again.index.is_monotonic_increasing and len(again) == 15
    assert again.index.equals(places_tab.drawn_places(frame, 15).index)  # the same each rerun


def test_places_view_leaves_a_margin_around_the_outermost_places() -> None:
    """The places map's bounds grow by a share of their span, so edge points are drawn whole;
    one place gets the minimum margin."""
    from app.tabs.places_tab import padded_bounds

    w, s, e, n = padded_bounds((-158.0, 19.0, -155.0, 21.0), share=0.1)
    assert (w, s, e, n) == pytest.approx((-158.3, 18.8, -154.7, 21.2))
    assert padded_bounds((10.0, 5.0, 10.0, 5.0), margin_deg=0.02) == pytest.approx(
        (9.98, 4.98, 10.02, 5.02)
    )
