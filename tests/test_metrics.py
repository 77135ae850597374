"""Metrics against direct numerical definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import binomtest, norm

from geodbk import metrics
from geodbk.metrics import coverage_verdict, share_interval


def test_crps_closed_form_matches_integral() -> None:
    y, mu, sd = 0.7, -0.2, 1.3

    def integrand(t: float) -> float:
        return float((norm.cdf(t, mu, sd) - (t >= y)) ** 2)

    lo, hi = mu - 12 * sd, mu + 12 * sd
    num = integrate.quad(integrand, lo, y)[0] + integrate.quad(integrand, y, hi)[0]
    assert metrics.crps_gaussian(np.array([y]), np.array([mu]), np.array([sd])) == pytest.approx(
        num, abs=1e-7
    )


def test_nll_mae_rmse() -> None:
    rng = np.random.default_rng(0)
    y, mu, var = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.1, 2, size=50)
    assert metrics.gaussian_nll(y, mu, var) == pytest.approx(
        -np.mean(norm.logpdf(y, mu, np.sqrt(var)))
    )
    assert metrics.mae(y, mu) == pytest.approx(np.mean(np.abs(y - mu)))
    assert metrics.rmse(y, mu) == pytest.approx(np.sqrt(np.mean((y - mu) ** 2)))


def test_coverage_width_and_reliability_on_calibrated_samples() -> None:
    rng = np.random.default_rng(1)
    n = 200_000
    mu = rng.normal(size=n)
    sd = rng.uniform(0.5, 2.0, size=n)
    y = mu + sd * rng.normal(size=n)
    assert metrics.coverage(y, mu, sd**2) == pytest.approx(0.95, abs=0.005)
    assert metrics.interval_width(sd**2) == pytest.approx(2 * 1.959964 * sd.mean(), rel=1e-6)
    levels, obs = metrics.reliability_curve(y, mu, sd**2)
    assert levels[0] == 0.5 and levels[-1] == 0.99
    assert np.allclose(obs, levels, atol=0.006)
    s = metrics.summary(y, mu, sd**2)
    assert tuple(s) == metrics.SUMMARY_KEYS
    assert set(s) == {"mae", "rmse", "nll", "crps", "coverage95", "width95"}


def test_length_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="equal length"):
        metrics.mae(np.zeros(3), np.zeros(4))


def test_canonical_keys_renames_legacy_metrics_only() -> None:
    old = {
        "all": {"n": 3, "coverage": 0.9, "pi_width": 0.5, "coverage_std": 0.9, "nll": 1.0},
        "by_quarter": {"2024Q1": {"coverage": None, "urban": {"pi_width": 0.4}}},
        "reliability": {"all": {"levels": [0.5, 0.9], "coverage": [0.5, 0.88]}},
        "runs": [{"by_tests": {"1": {"coverage": 0.7}}}],
    }
    new = metrics.canonical_keys(old)
    assert new["all"] == {
        "n": 3,
        "coverage95": 0.9,
        "width95": 0.5,
        "coverage95_std": 0.9,
        "nll": 1.0,
    }
    assert new["by_quarter"]["2024Q1"] == {"coverage95": None, "urban": {"width95": 0.4}}
    assert new["reliability"] == old["reliability"]  # a curve, not a metric
    assert new["runs"][0]["by_tests"]["1"] == {"coverage95": 0.7}
    assert old["all"]["coverage"] == 0.9  # the input is left alone
    assert metrics.canonical_keys(new) == new
    both = metrics.canonical_keys({"coverage": 0.1, "coverage95": 0.2})
    assert both == {"coverage95": 0.2}


def test_legacy_keys_map_onto_canonical_names() -> None:
    canonical = {*metrics.SUMMARY_KEYS, *(k + metrics.STD_SUFFIX for k in metrics.SUMMARY_KEYS)}
    assert set(metrics.LEGACY_KEYS.values()) <= canonical
    assert not set(metrics.LEGACY_KEYS) & canonical


@pytest.mark.parametrize(("hits", "n"), [(0, 12), (1, 12), (11, 12), (12, 12), (110, 116)])
def test_share_interval_is_the_exact_binomial_interval(hits: int, n: int) -> None:
    ref = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="exact")
    low, high = share_interval(hits, n)
    assert low == pytest.approx(ref.low, abs=1e-12) and high == pytest.approx(ref.high, abs=1e-12)
    assert low <= hits / n <= high
    assert (low == 0.0) == (hits == 0) and (high == 1.0) == (hits == n)


def test_share_interval_narrows_with_more_items_and_rejects_bad_counts() -> None:
    small = share_interval(95, 100)
    large = share_interval(950, 1000)
    assert large[1] - large[0] < small[1] - small[0]
    for hits, n in ((3, 2), (-1, 5), (0, 0)):
        with pytest.raises(ValueError, match="hits"):
            share_interval(hits, n)


def test_coverage_verdict_reads_where_the_nominal_level_falls() -> None:
    assert coverage_verdict(share_interval(114, 116)) == "consistent"  # 98.3% of 116 tiles
    assert coverage_verdict(share_interval(99, 116)) == "too narrow"  # 85.3%
    assert coverage_verdict(share_interval(1000, 1000)) == "too wide"


def test_the_clustered_checks_caveat_names_the_blocks_only_when_fewer() -> None:
    from geodbk.metrics import clustered_checks_caveat

    text = clustered_checks_caveat(82, 15)
    assert "82 tiles lie in 15 held-out blocks" in text and "too narrow" in text
    assert clustered_checks_caveat(82, 82) == clustered_checks_caveat(82, None) == ""
    assert clustered_checks_caveat(None, 15) == ""


def _by_place_reference(hits: np.ndarray, places: np.ndarray) -> tuple[float, float]:
    """The Korn-Graubard interval written out place by place (float64 loops)."""
    from scipy.stats import beta, t

    n, labels = hits.size, sorted(set(places.tolist()))
    p = hits.mean()
    spread = 0.0
    for g in labels:
        inside = places == g
        spread += (hits[inside].sum() - p * inside.sum()) ** 2
    c = len(labels)
    var = c / (c - 1) * spread / n**2
    size = min(n, p * (1 - p) / var * (t.ppf(0.975, n - 1) / t.ppf(0.975, c - 1)) ** 2)
    return beta.ppf(0.025, p * size, (1 - p) * size + 1), beta.ppf(
        0.975, p * size + 1, (1 - p) * size
    )


def test_the_interval_by_place_is_korn_graubards_effective_size_interval() -> None:
    from geodbk.metrics import share_interval_by_place

    rng = np.random.default_rng(3)
    places = rng.integers(0, 25, size=90)
    hits = rng.random(90) < np.where(places < 5, 0.4, 0.97)  # five places miss often
    low, high = share_interval_by_place(hits, places)
    ref = _by_place_reference(hits, places)
    assert low == pytest.approx(ref[0], abs=1e-9) and high == pytest.approx(ref[1], abs=1e-9)
    by_tile = share_interval(int(hits.sum()), hits.size)
    assert low < by_tile[0] and high > by_tile[1]  # places that share misses: fewer checks
    # places whose items all agree, eight items each: about as few checks as places
    agree = np.repeat(rng.random(30) < 0.8, 8)
    low, high = share_interval_by_place(agree, np.repeat(np.arange(30), 8))
    k = int(agree.sum() // 8)
    per_place = share_interval(k, 30)
    assert abs(low - per_place[0]) < 0.05 and abs(high - per_place[1]) < 0.05
    assert high - low > 2 * (
        share_interval(int(agree.sum()), 240)[1] - share_interval(int(agree.sum()), 240)[0]
    )


def test_the_interval_by_place_is_the_binomial_one_when_places_do_not_share() -> None:
    from geodbk.metrics import share_interval_by_place

    rng = np.random.default_rng(4)
    hits = rng.random(116) < 0.93
    one_each = share_interval_by_place(hits, np.arange(116))
    exact = share_interval(int(hits.sum()), 116)
    assert one_each == pytest.approx(exact, abs=0.005)  # n* = n - 1 here
    every = np.ones(40, dtype=bool)  # all covered: no spread to measure, the exact interval
    assert share_interval_by_place(every, np.arange(40) // 4) == share_interval(40, 40)
    assert share_interval_by_place(hits[:10], np.zeros(10)) is None  # one place
    with pytest.raises(ValueError, match="length"):
        share_interval_by_place(hits, np.arange(5))


def test_the_interval_by_place_covers_a_clustered_rate_where_the_tiles_one_does_not() -> None:
    """Items of a place share a random rate (mean 0.9): over many draws the interval by place
    holds the mean rate about 95% of the time, the interval over the items much less often."""
    from geodbk.metrics import share_interval_by_place

    rng = np.random.default_rng(5)
    places = np.repeat(np.arange(40), 4)
    held = {"place": 0, "tile": 0}
    draws = 400
    for _ in range(draws):
        rate = rng.beta(1.8, 0.2, size=40)[places]  # mean 0.9, strongly shared in a place
        hits = rng.random(places.size) < rate
        low, high = share_interval_by_place(hits, places) or (0.0, 1.0)
        held["place"] += low <= 0.9 <= high
        low, high = share_interval(int(hits.sum()), hits.size)
        held["tile"] += low <= 0.9 <= high
    assert 0.92 < held["place"] / draws < 0.99  # 95.2% in these draws
    assert held["tile"] / draws < 0.9  # 85.5%


def test_tests_range_names_a_calibration_blocks_tests() -> None:
    from geodbk.metrics import tests_range

    assert tests_range({"min_tests": 30}) == "30+"
    assert tests_range({"min_tests": 5, "max_tests": 30}) == "5–29"
    assert tests_range({"min_tests": 5, "max_tests": 30}, dash="-") == "5-29"


def test_threshold_check_rows_name_each_group_and_mark_misses() -> None:
    from geodbk.metrics import THRESHOLD_CHECK_HEADER, threshold_check_rows

    part = {
        "tiles": 40,
        "expected_share": 0.7,
        "observed_share": 0.85,
        "observed_interval": [0.75, 0.92],
        "consistent": False,
        "sure_served": {"tiles": 15, "stated": 0.95, "held": 1.0},
        "sure_not_served": {"tiles": 0, "stated": None, "held": None},
    }
    block = {
        "min_tests": 30,
        "less_min_tests": 5,
        "rows": [{"label": "≥ 25 Mbps", "well_measured": part, "less_measured": None}],
    }
    (row,) = threshold_check_rows(block)
    assert len(row) == len(THRESHOLD_CHECK_HEADER)
    assert row[:4] == ["≥ 25 Mbps", "30+", "40", "70.0%"]
    assert row[4] == "85.0% (75.0–92.0%) (outside)"
    assert row[5:] == ["15, 100.0%", "0"]
    less = {**block, "rows": [{"label": "≥ 25 Mbps", "less_measured": part}]}
    assert threshold_check_rows(less)[0][1] == "5–29"
    assert threshold_check_rows({}) == []
