"""A selected point: the chart selection read, its lognormal summary, threshold probabilities
and the nearest tiles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app.points import PointSummary, nearest_tiles, point_from_selection, prob_threshold


def test_point_from_selection_reads_streamlit_selection_state() -> None:
    state = {
        "selection": {
            "indices": {"click-grid": [3]},
            "objects": {"click-grid": [{"lon": -157.1, "lat": 21.2}]},
        }
    }
    assert point_from_selection(state, ("tiles", "click-grid")) == (-157.1, 21.2)
    assert point_from_selection(state["selection"], ("click-grid",)) == (-157.1, 21.2)
    assert (
        point_from_selection({"selection": {"indices": {}, "objects": {}}}, ("click-grid",)) is None
    )
    assert point_from_selection(None, ("click-grid",)) is None
    bad = {"selection": {"objects": {"click-grid": [{"lon": "x"}]}}}
    assert point_from_selection(bad, ("click-grid",)) is None


def test_point_summary_lognormal() -> None:
    s = PointSummary.from_log10(1.0, 0.1)
    assert s.median == pytest.approx(10.0)
    assert s.lower == pytest.approx(10 ** (1 - 1.959964 * 0.1), rel=1e-5)
    assert s.upper == pytest.approx(10 ** (1 + 1.959964 * 0.1), rel=1e-5)
    rng = np.random.default_rng(0)
    draws = 10 ** rng.normal(1.0, 0.1, 400_000)
    assert s.mean == pytest.approx(draws.mean(), rel=5e-3)
    assert s.sd == pytest.approx(draws.std(), rel=2e-2)


def test_prob_threshold_is_gaussian_in_log10() -> None:
    m = np.array([np.log10(25.0), 2.0, np.nan])
    s = np.array([0.2, 0.1, 0.1])
    below = prob_threshold(m, s, 25.0, above=False)
    above = prob_threshold(m, s, 25.0, above=True)
    assert below[0] == pytest.approx(0.5) and above[1] > 0.999
    assert np.isnan(below[2])
    assert np.allclose(below[:2] + above[:2], 1.0)


def test_nearest_tiles_sorted_by_distance() -> None:
    tiles = pd.DataFrame(
        {"lon": [0.0, 1.0, 0.1, 5.0], "lat": [0.0, 0.0, 0.0, 0.0], "tests": [1, 2, 3, 4]}
    )
    near = nearest_tiles(tiles, 0.05, 0.0, k=2)
    assert list(near["tests"]) == [1, 3] or list(near["tests"]) == [3, 1]
    assert near["distance_km"].is_monotonic_increasing
    assert near["distance_km"].iloc[0] == pytest.approx(5.56, rel=0.01)


def test_nearest_tiles_show_a_tiles_latest_quarters_first() -> None:
    tiles = pd.DataFrame(
        {
            "lon": [0.0, 0.0, 0.0, 0.1],
            "lat": [0.0, 0.0, 0.0, 0.0],
            "quarter": ["2019Q1", "2023Q4", "2021Q2", "2023Q4"],
        }
    )
    near = nearest_tiles(tiles, 0.0, 0.0, k=3)
    assert near["quarter"].tolist() == ["2023Q4", "2021Q2", "2019Q1"]
