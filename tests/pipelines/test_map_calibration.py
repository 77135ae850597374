"""The map's own calibration (pipelines.map_calibration) and its place in the report."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.map_calibration import map_calibration
from pipelines.report import run_report


def test_levels_weights_and_filter_by_hand() -> None:
    # tile a: two rows (10 + 30 tests), level (10*1 + 30*2)/40 = 1.75; prediction 1.80 +- 1.96*0.1
    # tile b: 20 tests only -> left out; tile c: one rural row, 50 tests, off by 0.5 (> log10 2)
    cal = map_calibration(
        tiles=["a", "a", "b", "c"],
        y=[1.0, 2.0, 0.0, 3.0],
        tests=[10, 30, 20, 50],
        urban=[True, True, True, False],
        mean=[1.8, 1.8, 0.0, 3.5],
        var=[0.01, 0.01, 0.01, 0.04],
        noise=[0.0, 0.0, 0.0, 0.0],
    )
    assert cal["tiles"] == 2 and cal["min_tests"] == 30
    assert cal["urban"]["tiles"] == 1 and cal["rural"]["tiles"] == 1
    assert cal["urban"]["coverage95"] == 1.0 and cal["rural"]["coverage95"] == 0.0
    assert cal["urban"]["median_abs_error"] == pytest.approx(0.05)
    assert cal["all"]["median_abs_error"] == pytest.approx((0.05 + 0.5) / 2)
    assert cal["all"]["off_by_2x"] == pytest.approx(0.5)
    # one tile of one covered: the exact binomial interval [0.025, 1]
    assert cal["urban"]["coverage95_interval"] == pytest.approx([0.025, 1.0])
    assert cal["all"]["coverage95_interval"][0] < 0.5 < cal["all"]["coverage95_interval"][1]


def test_the_levels_own_noise_widens_the_interval() -> None:
    kw = {"tiles": ["a"], "y": [0.0], "tests": [40], "urban": [False], "mean": [0.3]}
    tight = map_calibration(var=[0.01], noise=[0.0], **kw)
    noisy = map_calibration(var=[0.01], noise=[40 * 0.03], **kw)  # level noise 40²·n/40² = n
    assert tight["all"]["coverage95"] == 0.0
    assert 0.3 <= 1.96 * math.sqrt(0.01 + 40 * 0.03)
    assert noisy["all"]["coverage95"] == 1.0


def test_the_testers_persistent_part_is_shared_by_a_tiles_rows() -> None:
    """Four rows of 10 tests, each with persistent variance p: the level carries p itself (the
    rows share it), not p / 4 as independent noise would give."""
    kw = {"tiles": ["a"] * 4, "y": [0.0] * 4, "tests": [10] * 4, "urban": [True] * 4}
    kw |= {"mean": [0.5] * 4, "var": [0.01] * 4}
    p = 0.06
    independent = map_calibration(noise=[p] * 4, **kw)  # sd sqrt(0.01 + p / 4) = 0.158
    shared = map_calibration(noise=[p] * 4, persistent=[p] * 4, **kw)  # sd sqrt(0.01 + p)
    assert 1.96 * math.sqrt(0.01 + p / 4) < 0.5 <= 1.96 * math.sqrt(0.01 + p)
    assert independent["all"]["coverage95"] == 0.0
    assert shared["all"]["coverage95"] == 1.0


def test_less_measured_tiles_are_those_below_the_cut() -> None:
    """``max_tests`` keeps the tiles with ``min_tests`` to ``max_tests - 1`` tests: a (40)
    and d (3) are left out, b (20) and c (29, one row of 9 and one of 20) are scored."""
    cal = map_calibration(
        tiles=["a", "b", "c", "c", "d"],
        y=[0.0, 0.0, 0.0, 0.0, 0.0],
        tests=[40, 20, 9, 20, 3],
        urban=[True, True, False, False, True],
        mean=[0.0, 0.1, 2.0, 2.0, 0.0],
        var=[0.01] * 5,
        noise=[0.0] * 5,
        min_tests=5,
        max_tests=30,
    )
    assert cal["tiles"] == 2 and cal["min_tests"] == 5 and cal["max_tests"] == 30
    assert cal["urban"]["tiles"] == 1 and cal["urban"]["coverage95"] == 1.0  # b: 0.1 < 0.196
    assert cal["rural"]["tiles"] == 1 and cal["rural"]["coverage95"] == 0.0  # c: off by 2
    assert "max_tests" not in map_calibration(**{**_ONE_TILE, "min_tests": 5})


_ONE_TILE = {"tiles": ["a"], "y": [1.0], "tests": [10], "urban": [True]} | {
    "mean": [1.0],
    "var": [0.1],
    "noise": [0.0],
}


def test_no_eligible_tile_gives_no_groups() -> None:
    cal = map_calibration(
        tiles=["a"], y=[1.0], tests=[3], urban=[True], mean=[1.0], var=[0.1], noise=[0.0]
    )
    assert cal == {"tiles": 0, "min_tests": 30}


def test_report_writes_map_calibration(tiny_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    run_report(run, target="download", thresholds=None)
    metrics = json.loads((run / "report" / "download" / "metrics.json").read_text())
    cal = metrics["map_calibration"]
    for quantity in ("tile", "area"):
        r = cal[quantity]["all"]
        assert r["tiles"] > 10
        assert all(np.isfinite(r[k]) for k in ("coverage95", "median_abs_error", "off_by_2x"))
    # the tile quantity knows each tile's history: closer to the levels than f alone
    assert cal["tile"]["all"]["median_abs_error"] < cal["area"]["all"]["median_abs_error"]
    text = (run / "report" / "download" / "report.md").read_text()
    assert "## Map calibration" in text and "## Local layer" in text
    # the table's columns: quantity, group, its tile count
    header = "| quantity | group | tiles | 95% coverage |"
    assert header in text
    first = text.split(header, 1)[1].splitlines()[2]
    assert first.startswith(f"| tile | all | {cal['tile']['all']['tiles']} |")
    low, high = cal["tile"]["all"]["coverage95_interval"]
    assert low <= cal["tile"]["all"]["coverage95"] <= high
    assert "its confidence interval" in text
    assert "tile quantity" in text
    # counted by place too: the demo run's tiles lie in fewer zoom-12 parents than tiles
    places = cal["tile"]["all"]["places"]
    assert 2 <= places < cal["tile"]["all"]["tiles"]
    low, high = cal["tile"]["all"]["coverage95_interval_by_place"]
    assert low <= cal["tile"]["all"]["coverage95"] <= high
    assert f"tiles in {places} places the tile quantity covers" in text
    # the less measured test tiles (5-29 tests): exactly those of the test split, in the
    # table and read in their own paragraph
    less = cal["tile_less_measured"]
    assert (less["min_tests"], less["max_tests"]) == (5, 30)
    tiles = pd.read_parquet(run / "tiles.parquet", columns=["quadkey", "split", "tests"])
    per_tile = tiles[tiles["split"] == "test"].groupby("quadkey")["tests"].sum()
    assert less["tiles"] == int(((per_tile >= 5) & (per_tile < 30)).sum()) > 0
    assert f"| tile, 5–29 tests | all | {less['tiles']} |" in text
    assert f"The {less['tiles']} test tiles with 5–29 tests are less well measured" in text
    # the demo region is geodbk's synthetic data: no third-party licence, and it says so
    assert "## Data and licence" in text and "no third-party licence" in text
    summary = json.loads((run / "report" / "download" / "summary.json").read_text())
    assert summary["data_licence"]["license"].startswith("no third-party licence")
    row = summary["service_coverage"][0]
    assert row["quantity"] == "tile" and row["area_quantity"] == "tile"
    # the training it scored, as a grid names it (the dashboard pairs the two by it)
    model = json.loads((run / "models" / "download" / "model.json").read_text())
    assert summary["model_created"] == model["metadata"]["created"] != ""


def test_the_report_says_how_many_blocks_the_check_rests_on() -> None:
    """On a block split the map check's paragraph names the held-out blocks its tiles lie in;
    elsewhere it does not."""
    from pipelines.report import _map_calibration_section
    from pipelines.report_doc import Doc

    group = {
        "tiles": 82,
        "coverage95": 0.976,
        "coverage95_interval": [0.915, 0.997],
        "median_abs_error": 0.23,
        "off_by_2x": 0.4,
    }
    cal = {"min_tests": 30, "tile": {"all": group}, "area": {"all": group}}
    for blocks, want in ((15, True), (None, False)):
        doc = Doc("r")
        _map_calibration_section(doc, {**cal, "held_out_blocks": blocks} if blocks else cal)
        text = doc.markdown()
        assert ("lie in 15 held-out blocks" in text) == want
        assert ("nearer 15 independent places than 82" in text) == want


def test_the_report_reads_the_less_measured_tiles_only_when_there_are_some() -> None:
    """A run whose test split has no tile with 5-29 tests (or a file written before them)
    gets no such rows or paragraph; one with them gets both, read by place."""
    from pipelines.report import _map_calibration_section
    from pipelines.report_doc import Doc

    group = {"tiles": 82, "coverage95": 0.976, "coverage95_interval": [0.915, 0.997]}
    group |= {"median_abs_error": 0.23, "off_by_2x": 0.4}
    cal = {"min_tests": 30, "tile": {"all": group}, "area": {"all": group}}
    none = {"tiles": 0, "min_tests": 5, "max_tests": 30}
    some = none | {"tiles": 60, "all": group | {"tiles": 60, "coverage95": 0.9}}
    some["all"] |= {"places": 20, "coverage95_interval_by_place": [0.78, 0.97]}
    for less, want in ((None, False), (none, False), (some, True)):
        doc = Doc("r")
        _map_calibration_section(doc, cal if less is None else {**cal, "tile_less_measured": less})
        text = doc.markdown()
        assert ("| tile, 5–29 tests | all | 60 |" in text) == want
        assert ("The 60 test tiles with 5–29 tests" in text) == want
        assert ("78.0–97.0% counted by place, holds 95%" in text) == want


def _clustered_levels(places: list[str] | None) -> dict:
    """Twelve tiles of 40 tests each, in four places of three: the first place's tiles all
    missed (error 0.5 against an sd of 0.1), the others' covered."""
    tiles = [f"t{i}" for i in range(12)]
    return map_calibration(
        tiles=tiles,
        y=[0.0] * 12,
        tests=[40] * 12,
        urban=[True] * 12,
        mean=[0.5] * 3 + [0.05] * 9,
        var=[0.01] * 12,
        noise=[0.0] * 12,
        places=places,
    )


def test_tiles_of_one_place_count_together_in_the_interval_by_place() -> None:
    from geodbk.metrics import share_interval, share_interval_by_place

    apart = _clustered_levels(None)["all"]  # each tile its own place
    together = _clustered_levels([p for p in "aaabbbcccddd"])["all"]
    assert apart["coverage95"] == together["coverage95"] == 0.75
    assert apart["places"] == 12 and together["places"] == 4
    assert together["coverage95_interval"] == apart["coverage95_interval"]
    assert together["coverage95_interval"] == pytest.approx(list(share_interval(9, 12)))
    hits = np.array([False] * 3 + [True] * 9)
    assert together["coverage95_interval_by_place"] == pytest.approx(
        list(share_interval_by_place(hits, np.repeat(np.arange(4), 3)))
    )
    low, high = together["coverage95_interval_by_place"]
    assert (
        low < apart["coverage95_interval_by_place"][0]
        and high >= apart["coverage95_interval"][1] - 1e-9
    )
    # one place only: no spread to count, no interval by place
    alone = _clustered_levels(["a"] * 12)["all"]
    assert alone["places"] == 1 and alone["coverage95_interval_by_place"] is None


def test_the_report_reads_the_check_by_place_where_it_has_places() -> None:
    from pipelines.report import _map_calibration_section
    from pipelines.report_doc import Doc

    group = {
        "tiles": 40,
        "coverage95": 0.85,
        "coverage95_interval": [0.702, 0.943],
        "places": 21,
        "coverage95_interval_by_place": [0.55, 0.97],
        "median_abs_error": 0.15,
        "off_by_2x": 0.3,
    }
    doc = Doc("r")
    _map_calibration_section(doc, {"min_tests": 30, "tile": {"all": group}})
    text = doc.markdown()
    assert "On these 40 tiles in 21 places the tile quantity covers 85.0%." in text
    assert "over the tiles, 70.2–94.3%, leaves out 95% (too narrow)" in text
    assert "counted by place it is 55.0–97.0%, which holds 95%" in text
    assert "| 21 | 55.0–97.0% |" in text
    # where both read the same, one sentence says so
    agree = group | {"coverage95": 0.95, "coverage95_interval": [0.83, 0.99]}
    doc = Doc("r")
    _map_calibration_section(doc, {"min_tests": 30, "tile": {"all": agree}})
    text = doc.markdown()
    assert "its confidence interval, 83.0–99.0% over the tiles and 55.0–97.0% counted by " in text
    assert "as far as these places can tell" in text
    # on a block split the places are its held-out blocks, and the report names them so
    doc = Doc("r")
    _map_calibration_section(doc, {"min_tests": 30, "held_out_blocks": 21, "tile": {"all": agree}})
    assert "On these 40 tiles in 21 held-out blocks the tile quantity covers" in doc.markdown()
