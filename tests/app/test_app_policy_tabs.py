"""The Service and Areas tabs on a run with ``geodbk service`` and ``geodbk summarize``
outputs: the classed map, the expected shares, the choropleth, the table and the download."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import geopandas as gpd
import pytest
import shapely

from pipelines import cli
from tests.app.apptest_helpers import AppFactory, open_tab, texts


@pytest.fixture(scope="module")
def policy_root(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("policy_runs")
    run = shutil.copytree(tiny_run, root / "policy")
    w, s, e, n = gpd.read_file(run / "region.geojson").total_bounds
    xm, ym = (w + e) / 2, (s + n) / 2
    boxes = [shapely.box(w, s, xm, ym), shapely.box(xm, s, e, ym), shapely.box(w, ym, e, n)]
    areas = root / "districts.geojson"
    gpd.GeoDataFrame({"GEOID": ["01", "02", "03"]}, geometry=boxes, crs=4326).to_file(areas)
    assert (run / "service" / "headline.json").is_file()  # the demo ran geodbk service
    argv = ["summarize", "--run", str(run), "--target", "download", "--areas", str(areas)]
    assert cli.main([*argv, "--samples", "50"]) == 0
    return root


def test_the_service_tab_shows_classes_and_expected_shares(
    make_app: AppFactory, policy_root: Path
) -> None:
    at = make_app(policy_root, "policy")
    at.run()
    tab = open_tab(at, "Service")
    metrics = {m.label: m.value for m in tab.metric}
    assert set(metrics) == {
        f"Expected share of area {c}" for c in ("unserved", "underserved", "served")
    }
    total = sum(float(v.rstrip("%")) for v in metrics.values())
    assert total == pytest.approx(100.0, abs=0.2)
    captions = texts(tab, "caption")
    assert any("red unserved" in c and "joint posterior samples" in c for c in captions)
    assert sum(c.startswith("90%: ") and "of tiles" in c for c in captions) == 3
    chart = json.loads(tab.get("deck_gl_json_chart")[0].proto.json)
    assert chart["layers"][0]["id"] == "classes"


def test_the_areas_tab_maps_and_tabulates_the_summaries(
    make_app: AppFactory, policy_root: Path
) -> None:
    at = make_app(policy_root, "policy")
    at.run()
    tab = open_tab(at, "Areas")
    frame = tab.dataframe[0].value
    assert sorted(frame["id"]) == ["01", "02", "03"]
    assert {"mean_natural", "lower_natural", "upper_natural"} <= set(frame.columns)
    chart = json.loads(tab.get("deck_gl_json_chart")[0].proto.json)
    assert len(chart["layers"][0]["data"]["features"]) == 3
    assert any("joint posterior samples" in c for c in texts(tab, "caption"))


def test_cells_outside_the_region_stay_transparent(policy_root: Path) -> None:
    from app.tabs.service_tab import class_rgba, load_classes

    path = policy_root / "policy" / "service" / "classes.nc"
    data = load_classes(str(path), (0.0, 0))
    inside = data["probs"]["p_served"] == data["probs"]["p_served"]  # finite
    assert 0 < inside.sum() < inside.size
    rgba = class_rgba(data["codes"], 3)
    assert (rgba[~inside, 3] == 0).all() and (rgba[inside, 3] > 0).all()


def test_a_run_without_policy_outputs_names_the_commands(
    make_app: AppFactory, tiny_run: Path, tmp_path: Path
) -> None:
    run = shutil.copytree(tiny_run, tmp_path / "bare")
    shutil.rmtree(run / "service")
    shutil.rmtree(run / "summaries")
    at = make_app(tmp_path, "bare")
    at.run()
    service = " ".join(i.value for i in open_tab(at, "Service").info)
    assert "no service classes" in service and "geodbk service --run" in service
    areas = " ".join(i.value for i in open_tab(at, "Areas").info)
    assert "no area summaries" in areas and "geodbk summarize --run" in areas
