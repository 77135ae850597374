"""The service classes' held-out check (``pipelines.service_check``): the scores against hand
computations and simulated calibrated and miscalibrated maps, and ``geodbk service`` on the
quick demo run (each tile's class recomputed from the tile table; the headline, the grid, the
rasters, ``--at`` and the report carry the check)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import rasterio
import xarray as xr
from pipeline_helpers import copy_service_inputs

from pipelines import cli
from pipelines.map_calibration import LESS_MEASURED_TESTS, MIN_TESTS
from pipelines.report import run_report
from pipelines.rundir import RunDir
from pipelines.service_check import held_out_check_sentence, service_check
from pipelines.service_classes import load_service

CLASSES = ("unserved", "underserved", "served")


def test_scores_equal_a_hand_computation() -> None:
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6]])
    observed = np.array([0, 2, 1, 2])
    out = service_check(
        class_p=p,
        observed=observed,
        urban=np.array([True, True, False, False]),
        places=np.array(["a", "b", "c", "d"]),
        classes=CLASSES,
    )
    whole = out["all"]
    assert whole["tiles"] == 4 and whole["places"] == 4
    for c, name in enumerate(CLASSES):
        assert whole["classes"][name]["expected_share"] == pytest.approx(p[:, c].mean())
        assert whole["classes"][name]["observed_share"] == pytest.approx((observed == c).mean())
    # most probable classes 0, 1, 0, 2: right at tiles 0 and 3
    assert whole["most_probable_agrees"] == pytest.approx(0.5)
    assert whole["map_class"]["unserved"] == {"tiles": 2, "observed_same": 0.5}
    assert whole["map_class"]["underserved"] == {"tiles": 1, "observed_same": 0.0}
    assert whole["map_class"]["served"] == {"tiles": 1, "observed_same": 1.0}
    assert whole["p_observed_class"] == pytest.approx((0.7 + 0.3 + 0.4 + 0.6) / 4)
    brier = [
        0.3**2 + 0.2**2 + 0.1**2,
        0.1**2 + 0.6**2 + 0.7**2,
        0.5**2 + 0.6**2 + 0.1**2,
        0.2**2 + 0.2**2 + 0.4**2,
    ]
    assert whole["brier"] == pytest.approx(np.mean(brier))
    assert out["urban"]["tiles"] == 2 and out["rural"]["tiles"] == 2
    assert out["urban"]["p_observed_class"] == pytest.approx(0.5)


def test_a_calibrated_map_is_consistent_and_a_biased_one_is_not() -> None:
    rng = np.random.default_rng(3)
    n = 3000
    p = rng.dirichlet([2.0, 3.0, 1.0], size=n)
    drawn = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
    common = {"urban": np.ones(n, bool), "places": np.arange(n) // 10, "classes": CLASSES}
    calibrated = service_check(class_p=p, observed=drawn, **common)["all"]["classes"]
    assert all(calibrated[c]["consistent"] for c in CLASSES)
    # the same tiles, one class lower than drawn wherever possible: the map expects too many
    # served tiles
    lower = service_check(class_p=p, observed=np.maximum(drawn - 1, 0), **common)
    assert not lower["all"]["classes"]["served"]["consistent"]
    assert "rural" not in lower


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the quick demo run with the default service outputs written by the CLI."""
    r = copy_service_inputs(tiny_run, tmp_path_factory.mktemp("check") / "run")
    assert cli.main(["service", "--run", str(r), "--headline-samples", "50"]) == 0
    return r


def _level_classes_from_the_table(run: Path) -> pd.DataFrame:
    """Each test tile's tests per target and the class of its tests-weighted levels, from
    ``tiles.parquet`` directly (BEAD tiers, 100 ms)."""
    t = pq.read_table(run / "tiles.parquet").to_pandas()
    t = t[t["split"] == "test"]
    per_target = []
    for name in ("download", "upload", "latency"):
        rows = t[np.isfinite(t[f"log10_{name}"])]
        w = rows["tests"].astype(float)
        g = (rows[f"log10_{name}"] * w).groupby(rows["quadkey"]).sum()
        tests = w.groupby(rows["quadkey"]).sum()
        per_target.append(pd.DataFrame({f"L_{name}": g / tests, f"n_{name}": tests}))
    tiles = pd.concat(per_target, axis=1, join="inner")
    down = tiles["L_download"] >= np.log10(25e3)
    up = tiles["L_upload"] >= np.log10(3e3)
    fast = (tiles["L_download"] >= np.log10(100e3)) & (tiles["L_upload"] >= np.log10(20e3))
    quick = tiles["L_latency"] <= 2.0
    tiles["cls"] = np.where(down & up & quick, np.where(fast, 2, 1), 0)
    tiles["tests"] = tiles[["n_download", "n_upload", "n_latency"]].min(axis=1)
    return tiles


def test_headline_check_counts_the_test_tiles_and_their_classes(run: Path) -> None:
    headline = json.loads((run / "service" / "headline.json").read_text())
    check = headline["held_out_check"]
    assert check["quantity"] == "tile" and check["classes"] == list(CLASSES)
    tiles = _level_classes_from_the_table(run)
    groups = {
        "well_measured": tiles[tiles["tests"] >= MIN_TESTS],
        "less_measured": tiles[
            (tiles["tests"] >= LESS_MEASURED_TESTS) & (tiles["tests"] < MIN_TESTS)
        ],
    }
    for name, expect in groups.items():
        part = check[name]
        assert part["tiles"] == len(expect) > 0, name
        assert part["min_tests"] == (MIN_TESTS if name == "well_measured" else LESS_MEASURED_TESTS)
        whole = part["all"]
        for c, cls in enumerate(CLASSES):
            assert whole["classes"][cls]["observed_share"] == pytest.approx(
                (expect["cls"] == c).mean()
            ), (name, cls)
        expected = sum(whole["classes"][c]["expected_share"] for c in CLASSES)
        assert expected == pytest.approx(1.0)
        assert sum(v["tiles"] for v in whole["map_class"].values()) == len(expect)


def test_grid_rasters_and_places_carry_the_check(run: Path, tmp_path: Path) -> None:
    headline = json.loads((run / "service" / "headline.json").read_text())
    sentence = held_out_check_sentence(headline["held_out_check"])
    assert sentence.startswith("Held-out check: of ") and "30+ tests" in sentence
    with xr.open_dataset(run / "service" / "classes.nc") as ds:
        assert ds.attrs["held_out_check"] == sentence
    with rasterio.open(run / "service" / "service_class.tif") as src:
        assert src.tags()["geodbk_held_out_check"] == sentence
    places = tmp_path / "places.csv"
    t = pq.read_table(run / "tiles.parquet", columns=["lon", "lat"]).to_pandas().head(5)
    t.to_csv(places, index=False)
    assert cli.main(["service", "--run", str(run), "--at", str(places)]) == 0
    meta = pq.read_schema(run / "service" / "classes_places.parquet").metadata
    service_meta = json.loads(next(v for k, v in meta.items() if b"service" in k))
    assert service_meta["held_out_check"] == headline["held_out_check"]


def test_report_shows_the_check(run: Path) -> None:
    out = run_report(run, target="download")
    text = (out / "report.md").read_text()
    assert "Held-out check of the classes" in text
    assert text.count("| class | expected share | observed share (95% CI by place)") == 2


def test_area_quantity_is_checked_and_test_quantity_is_not(run: Path) -> None:
    from pipelines.service_check import service_held_out_check

    rd = RunDir(run)
    area = service_held_out_check(rd, load_service(rd, quantity="area"))
    tile = json.loads((run / "service" / "headline.json").read_text())["held_out_check"]
    assert area is not None and area["quantity"] == "area"
    assert area["well_measured"]["tiles"] == tile["well_measured"]["tiles"]
    shares = [area["well_measured"]["all"]["classes"][c]["expected_share"] for c in CLASSES]
    assert shares != [tile["well_measured"]["all"]["classes"][c]["expected_share"] for c in CLASSES]
    assert service_held_out_check(rd, load_service(rd, quantity="test")) is None
