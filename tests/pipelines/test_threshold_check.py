"""The map's thresholds on held-out tiles (``pipelines.threshold_check``): the scores against a
hand computation, latency's direction, a calibrated and a biased simulated map, and the
report's ``metrics.json`` on the quick demo run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from pipelines.threshold_check import SURE_PROB, threshold_check


def _levels(level: list[float], mean: list[float], sd: list[float]) -> pd.DataFrame:
    level_ = np.asarray(level)
    return pd.DataFrame(
        {
            "level": level_,
            "error": np.asarray(mean) - level_,
            "sd": sd,
            "place": [f"p{i}" for i in range(len(level))],
        }
    )


def test_scores_equal_a_hand_computation() -> None:
    levels = _levels([4.6, 4.2, 4.5, 3.9], [4.8, 4.1, 4.3, 4.4], [0.1, 0.1, 0.5, 0.2])
    out = threshold_check(levels, threshold=4.4, above=True)
    assert out is not None
    p = norm.cdf((np.array([4.8, 4.1, 4.3, 4.4]) - 4.4) / np.array([0.1, 0.1, 0.5, 0.2]))
    assert out["tiles"] == 4
    assert out["expected_share"] == pytest.approx(p.mean())
    assert out["observed_share"] == pytest.approx(0.5)  # 4.6 and 4.5 are at or above 4.4
    # sure served: tile 0 (p 0.99997), right; sure not served: tile 1 (p 0.0013), right
    assert out["sure_served"] == {"tiles": 1, "stated": pytest.approx(p[0]), "held": 1.0}
    assert out["sure_not_served"]["tiles"] == 1 and out["sure_not_served"]["held"] == 1.0
    assert out["sure_not_served"]["stated"] == pytest.approx(1 - p[1])


def test_latency_is_served_below_its_threshold() -> None:
    levels = _levels([1.5, 2.2], [1.5, 2.4], [0.05, 0.05])
    out = threshold_check(levels, threshold=2.0, above=False)
    assert out is not None
    assert out["observed_share"] == pytest.approx(0.5)
    assert out["sure_served"]["tiles"] == 1 and out["sure_served"]["held"] == 1.0
    assert out["sure_not_served"]["tiles"] == 1 and out["sure_not_served"]["held"] == 1.0
    assert threshold_check(levels.iloc[:0], threshold=2.0, above=False) is None


def test_a_calibrated_map_is_right_when_sure_and_a_biased_one_is_not() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    mean = rng.normal(4.4, 0.4, n)
    sd = rng.uniform(0.05, 0.3, n)
    level = mean + sd * rng.standard_normal(n)
    honest = threshold_check(_levels(list(level), list(mean), list(sd)), threshold=4.4, above=True)
    assert honest is not None and honest["consistent"]
    assert honest["sure_served"]["held"] >= SURE_PROB
    assert honest["sure_not_served"]["held"] >= SURE_PROB
    # the same map 0.3 log10 too optimistic: too many tiles said to be served
    biased = threshold_check(
        _levels(list(level), list(mean + 0.3), list(sd)), threshold=4.4, above=True
    )
    assert biased is not None and not biased["consistent"]
    assert biased["sure_served"]["held"] < SURE_PROB


def test_the_report_checks_each_service_threshold(tiny_run: Path) -> None:
    metrics = json.loads((tiny_run / "report" / "download" / "metrics.json").read_text())
    summary = json.loads((tiny_run / "report" / "download" / "summary.json").read_text())
    cal = metrics["map_calibration"]
    block = cal["thresholds"]
    assert block["sure"] == SURE_PROB
    assert [r["label"] for r in block["rows"]] == [r["label"] for r in summary["service_coverage"]]
    for row in block["rows"]:
        assert row["well_measured"]["tiles"] == cal["tile"]["tiles"]
        assert row["less_measured"]["tiles"] == cal["tile_less_measured"]["tiles"]
    text = (tiny_run / "report" / "download" / "report.md").read_text()
    assert "## Thresholds on held-out tiles" in text
