"""What an export records of the report's held-out check (pipelines.held_out_check)."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.held_out_check import held_out_check, held_out_tags
from pipelines.rundir import RunDir

GROUP = {"tiles": 80, "coverage95": 0.95, "coverage95_interval": [0.877, 0.986]}


def _report(run: Path, *, model_created: str, less: bool) -> RunDir:
    folder = run / "report" / "download"
    folder.mkdir(parents=True)
    cal: dict = {"min_tests": 30, "tile": {"all": GROUP}, "area": {"all": GROUP}}
    if less:
        cal["tile_less_measured"] = {"min_tests": 5, "max_tests": 30, "all": GROUP}
    (folder / "metrics.json").write_text(json.dumps({"map_calibration": cal}))
    (folder / "summary.json").write_text(json.dumps({"model_created": model_created}))
    return RunDir(run)


def test_the_check_of_a_report_written_before_the_less_measured_tiles(tmp_path: Path) -> None:
    rd = _report(tmp_path / "run", model_created="t0", less=False)
    check = held_out_check(rd, "download", quantity="tile", model_created="t0")
    assert check is not None and check["less_measured"] is None
    tags = held_out_tags(check)
    assert tags["geodbk_held_out_check"].endswith(
        "held the level of 95.0% of 80 test tiles with 30+ tests "
        "(its 95% confidence interval by tile 87.7-98.6%)"
    )
    assert not any("less_measured" in k for k in tags)
    assert held_out_tags(None) == {}


def test_no_check_for_another_quantity_training_or_without_a_report(tmp_path: Path) -> None:
    rd = _report(tmp_path / "run", model_created="t0", less=True)
    assert held_out_check(rd, "download", quantity="area", model_created="t0") is None
    assert held_out_check(rd, "download", quantity="tile", model_created="t1") is None
    assert held_out_check(rd, "upload", quantity="tile", model_created="t0") is None
    both = held_out_check(rd, "download", quantity="tile", model_created="t0")
    assert both is not None and both["less_measured"]["max_tests"] == 30


def test_the_threshold_check_goes_with_the_export(tmp_path: Path) -> None:
    rd = _report(tmp_path / "run", model_created="t0", less=True)
    path = rd.report_dir("download") / "metrics.json"
    metrics = json.loads(path.read_text())
    well = {
        "tiles": 80,
        "sure_served": {"tiles": 12, "stated": 0.95, "held": 1.0},
        "sure_not_served": {"tiles": 0, "stated": None, "held": None},
    }
    rows = [{"label": "≥ 25 Mbps", "threshold": 25.0, "well_measured": well}]
    metrics["map_calibration"]["thresholds"] = {"sure": 0.9, "rows": rows}
    path.write_text(json.dumps(metrics))
    check = held_out_check(rd, "download", quantity="tile", model_created="t0")
    assert check is not None and check["thresholds"]["rows"] == rows
    tags = held_out_tags(check)
    assert tags["geodbk_held_out_thresholds"] == (
        "geodbk report, well-measured test tiles, calls at least 90% sure: at ≥ 25 Mbps of 80 "
        "tiles: sure 12 served, right about 100.0%, sure of none not served"
    )
    # a report written before the threshold check: no such tag
    before = held_out_check(
        _report(tmp_path / "old", model_created="t0", less=True),
        "download",
        quantity="tile",
        model_created="t0",
    )
    assert before is not None and before["thresholds"] is None
    assert "geodbk_held_out_thresholds" not in held_out_tags(before)
