"""The Service tab on a run with ``geodbk service`` outputs: the classed map, the expected
shares, and cells outside the region left transparent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apptest_helpers import AppFactory, open_tab, texts
from apptest_helpers import tab as tab_of


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
    headline = json.loads((policy_root / "policy" / "service" / "headline.json").read_text())
    quarter = headline["quarter"]  # the quarter the classes are of, in the heading
    assert any(m.startswith(f"**Service classes, {quarter}**:") for m in texts(tab, "markdown"))
    captions = texts(tab, "caption")
    assert any("key above" in c and "joint posterior samples" in c for c in captions)
    key = next(m for m in texts(tab, "markdown") if "background:rgb" in m)
    assert "unserved: meets no tier: below 25/3 Mbps, or latency above 100 ms" in key
    assert "served: meets 100/20 Mbps with latency at most 100 ms" in key
    assert sum(c.startswith("90%: ") and "of tiles" in c for c in captions) == 3
    chart = json.loads(tab.get("deck_gl_json_chart")[0].proto.json)
    assert chart["layers"][0]["id"] == "classes"


def test_cells_outside_the_region_stay_transparent(policy_root: Path) -> None:
    from app.tabs.service_tab import class_rgba, load_classes

    path = policy_root / "policy" / "service" / "classes.nc"
    data = load_classes(str(path), (0.0, 0))
    inside = data["probs"]["p_served"] == data["probs"]["p_served"]  # finite
    assert 0 < inside.sum() < inside.size
    rgba = class_rgba(data["codes"], 3)
    assert (rgba[~inside, 3] == 0).all() and (rgba[inside, 3] > 0).all()


def test_the_classes_quarter_comes_from_the_grid_else_the_headline() -> None:
    from app.tabs.service_tab import classes_quarter

    assert classes_quarter({"quarter": "pooled 2022Q1:2023Q4"}, {"quarter": "x"}) == (
        "pooled 2022Q1:2023Q4"
    )
    assert classes_quarter({}, {"quarter": "2023Q4"}) == "2023Q4"
    assert classes_quarter({}, None) == ""


def test_the_key_names_each_class_of_any_tiers_in_the_raster_s_colours() -> None:
    from app.tabs.service_tab import class_legend_html
    from geodbk.service import class_colours, class_names

    names = list(class_names(3))
    key = class_legend_html(names, "10/1,25/3,100/20", 50)
    for code, name in enumerate(names):
        r, g, b, _ = class_colours(3 + 1)[code]
        assert f"background:rgb({r},{g},{b})" in key and f">{name}:" in key
    assert "underserved_1: meets 10/1 but not 25/3 Mbps" in key
    assert "underserved_2: meets 25/3 but not 100/20 Mbps" in key
    assert "latency above 50 ms" in key
    # tiers that cannot be read: the names and colours alone
    assert ">unserved<" in class_legend_html(["unserved", "served"], "", None)


def test_the_missing_classes_hint_trains_the_targets_it_needs(
    tiny_run: Path, tmp_path: Path
) -> None:
    import shutil

    from app.runs import inventory

    run = Path(shutil.copytree(tiny_run, tmp_path / "one"))
    shutil.rmtree(run / "models" / "latency")
    steps = inventory(run).command("service").splitlines()
    assert steps[0].endswith("--target latency") and steps[-1].startswith("geodbk service")
    assert len(steps) == 2


def test_each_classes_grid_of_the_run_can_be_shown(
    make_app: AppFactory, policy_root: Path, tmp_path: Path
) -> None:
    import shutil

    import xarray as xr

    from geodbk.geo.contract import QUANTITY_LABELS

    root = tmp_path / "runs"
    service = Path(shutil.copytree(policy_root / "policy", root / "policy")) / "service"
    # what `geodbk service --quantity area` writes beside the tile quantity's grid
    with xr.open_dataset(service / "classes.nc") as ds:
        area = ds.load()
    area.attrs.update(quantity="area", quantity_label=QUANTITY_LABELS["area"])
    area.to_netcdf(service / "classes_area.nc")
    headline = json.loads((service / "headline.json").read_text())
    headline["quantity"] = "area"
    (service / "headline_area.json").write_text(json.dumps(headline))
    at = make_app(root, "policy")
    at.run()
    tab = open_tab(at, "Service")
    choice = tab.selectbox(key="service_grid")
    # the quarter each grid records, not just "latest quarter"
    assert list(choice.options) == ["tile, 2023Q4 (latest)", "area, 2023Q4 (latest)"]
    assert any(m.startswith("**Service classes") and ": tile:" in m for m in texts(tab, "markdown"))
    choice.set_value(str(service / "classes_area.nc")).run()
    tab = tab_of(at, "Service")
    assert any(m.startswith("**Service classes") and ": area:" in m for m in texts(tab, "markdown"))
    # the area grid's own headline gives the intervals; without it, none are shown
    assert sum(c.startswith("90%: ") for c in texts(tab, "caption")) == 3
    assert any("`service/headline_area.json`" in c for c in texts(tab, "caption"))
    (service / "headline_area.json").unlink()
    at.run()
    assert not any(c.startswith("90%: ") for c in texts(tab_of(at, "Service"), "caption"))


def test_a_grid_s_label_and_headline_follow_its_file_name() -> None:
    from app.tabs.service_tab import grid_label
    from geodbk.geo.contract import service_headline

    assert grid_label(Path("classes.nc")) == "tile, latest quarter"
    assert grid_label(Path("classes_2022Q4_area.nc")) == "area, 2022Q4"
    assert grid_label(Path("classes_test.nc")) == "test, latest quarter"
    assert grid_label(Path("classes.nc"), "2023Q4") == "tile, 2023Q4 (latest)"
    assert grid_label(Path("classes_2022Q4_area.nc"), "2022Q4") == "area, 2022Q4"
    assert service_headline("classes_2022Q4_area.nc") == "headline_2022Q4_area.json"
    assert service_headline("classes.nc") == "headline.json"


def test_the_tab_shows_the_classes_held_out_check(make_app: AppFactory, policy_root: Path) -> None:
    at = make_app(policy_root, "policy")
    at.run()
    tab = open_tab(at, "Service")
    headline = json.loads((policy_root / "policy" / "service" / "headline.json").read_text())
    check = headline["held_out_check"]
    assert any(m == "**Held-out check: the classes of test tiles**" for m in texts(tab, "markdown"))
    captions = texts(tab, "caption")
    for part in ("well_measured", "less_measured"):
        tiles = check[part]["all"]["tiles"]
        assert sum(c.startswith(f"{tiles} test tiles with ") for c in captions) == 1, part
    tables = tab.table
    assert len(tables) == 2
    first = tables[0].value
    assert list(first["class"]) == ["unserved", "underserved", "served"]
    served = check["well_measured"]["all"]["classes"]["served"]
    assert (
        first["observed share (95% CI by place)"]
        .iloc[2]
        .startswith(f"{100 * served['observed_share']:.1f}%")
    )


def test_a_headline_without_the_check_has_no_tables() -> None:
    from app.tabs.service_tab import held_out_tables

    assert held_out_tables({"area": {}}) == []
    assert held_out_tables({"area": {}, "held_out_check": None}) == []
    assert held_out_tables(None) == []
