"""Scores of the report: the tile-clustered bootstrap interval of a coverage rate, and the
per-quarter scores from codes equal to those from strings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.scoring import by_quarter_scores, clustered_coverage_interval


def test_one_row_per_tile_matches_the_binomial_interval() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    hit = rng.uniform(size=n) < 0.95
    lo, hi = clustered_coverage_interval(hit, np.arange(n))
    p = hit.mean()
    half = 1.96 * np.sqrt(p * (1 - p) / n)
    assert lo < p < hi
    assert lo == pytest.approx(p - half, abs=0.002) and hi == pytest.approx(p + half, abs=0.002)


def test_misses_clustered_in_few_tiles_widen_the_interval() -> None:
    # 100 tiles x 10 quarters; all 50 misses sit in 5 tiles (95% coverage either way)
    tile = np.repeat(np.arange(100), 10)
    clustered = ~np.isin(tile, [3, 17, 42, 60, 88])
    spread = np.ones(1000, dtype=bool)
    spread[np.arange(0, 1000, 20)] = False  # one miss in every other tile
    assert clustered.mean() == spread.mean() == 0.95
    lo_c, hi_c = clustered_coverage_interval(clustered, tile)
    lo_s, hi_s = clustered_coverage_interval(spread, tile)
    assert hi_c - lo_c > 2.0 * (hi_s - lo_s)
    assert lo_c < 0.92 and hi_c > 0.98  # 5 of 100 tiles: a rate known to about +-4 points
    # a fixed seed gives a reproducible interval
    assert clustered_coverage_interval(clustered, tile) == (lo_c, hi_c)


def test_by_quarter_codes_equal_strings() -> None:
    rng = np.random.default_rng(2)
    distinct = ["2023Q4", "2023-Q1", "2022Q3"]
    codes = rng.integers(0, 3, 300)
    quarters = np.array(distinct, dtype=object)[codes]
    y, mu = rng.normal(size=300), rng.normal(size=300)
    sd, urban = rng.uniform(0.5, 1.5, 300), rng.random(300) < 0.4
    want = by_quarter_scores(y, mu, sd, urban, quarters)
    got = by_quarter_scores(y, mu, sd, urban, distinct, codes=codes)
    assert list(got) == list(want) == ["2022Q3", "2023Q1", "2023Q4"]
    assert json.dumps(got) == json.dumps(want)
