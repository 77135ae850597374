"""The Areas tab on a run with ``geodbk summarize`` outputs: the choropleth, the table; and the
commands named on a run without the policy outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from apptest_helpers import AppFactory, open_tab, texts


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
    config = json.loads(tab.dataframe[0].proto.columns)  # headers with units, rounded numbers
    assert config["mean_natural"]["label"] == "mean (Mbps)"
    assert config["mean_natural"]["type_config"]["format"] == "%.1f"
    assert config["area_km2"]["label"] == "area (km²)"
    assert config["share_ge_25mbps"]["label"] == "share ≥ 25 Mbps"
    assert config["share_ge_25mbps"]["type_config"]["format"] == "percent"
    (button,) = tab.get("download_button")
    assert button.proto.label == "Download the table (CSV)"
    # read when clicked (not on every rerun) and without rerunning the page, as the report's
    assert button.proto.ignore_rerun and button.proto.deferred_file_id


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


def _summarized_policy_run(
    policy_root: Path, tmp_path: Path, target: str, *options: str
) -> tuple[Path, Path]:
    """A copy of the policy run under ``tmp_path/runs`` with ``geodbk summarize`` of
    ``target`` over its districts (20 samples, ``options``); returns the runs folder and
    the run."""
    from pipelines import cli

    root = tmp_path / "runs"
    run = shutil.copytree(policy_root / "policy", root / "policy")
    areas = policy_root / "districts.geojson"
    argv = ["summarize", "--run", str(run), "--target", target, "--areas", str(areas)]
    assert cli.main([*argv, "--samples", "20", *options]) == 0
    return root, run


def test_summaries_of_two_quantities_are_both_listed_by_quantity_and_quarter(
    make_app: AppFactory, policy_root: Path, tmp_path: Path
) -> None:
    root, run = _summarized_policy_run(policy_root, tmp_path, "download", "--quantity", "area")
    assert (run / "summaries" / "download_districts.parquet").is_file()  # the tile one kept
    at = make_app(root, "policy")
    at.run()
    tab = open_tab(at, "Areas")
    labels = list(tab.selectbox(key="areas_file").options)  # as shown: the formatted labels
    tile = [lb for lb in labels if lb.startswith("districts.geojson: tile quantity, ")]
    area = [lb for lb in labels if lb.startswith("districts.geojson: area quantity, ")]
    assert len(tile) == len(area) == 1, labels
    assert tile[0].endswith("(download_districts.parquet)")
    assert area[0].endswith("(download_districts_area.parquet)")


def test_share_columns_read_as_tiers_with_units() -> None:
    from app.tabs.areas_tab import share_label, table_config

    assert share_label("share_ge_25mbps") == "share ≥ 25 Mbps"
    assert share_label("share_le_100ms_upper") == "share ≤ 100 ms, 90% upper"
    assert share_label("share_ge_2p5mbps_lower") == "share ≥ 2.5 Mbps, 90% lower"
    assert share_label("share_unserved") == "share unserved"
    config = table_config(["id", "lower_natural", "n_tests", "share_le_100ms", "extra"], "ms")
    assert set(config) == {"id", "lower_natural", "n_tests", "share_le_100ms"}
    assert config["lower_natural"]["label"] == "90% lower (ms)"
    assert config["n_tests"]["type_config"]["format"] == "%d"


def test_latency_summaries_read_as_latency_not_speed(
    make_app: AppFactory, policy_root: Path, tmp_path: Path
) -> None:
    root, _run = _summarized_policy_run(policy_root, tmp_path, "latency")
    at = make_app(root, "policy")
    at.run()
    at.sidebar.selectbox(key="target").set_value("latency")
    tab = open_tab(at, "Areas")
    colour_by = at.selectbox(key="areas_colour")
    labels = list(colour_by.options)  # as shown (formatted)
    assert labels[0] == "typical latency (area mean)", labels
    assert not any("speed" in x for x in labels), labels
    assert any(x.startswith("share ≤") and x.endswith("ms") for x in labels), labels
    config = json.loads(tab.dataframe[0].proto.columns)
    assert config["mean_natural"]["label"] == "mean (ms)"
