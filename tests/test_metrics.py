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
