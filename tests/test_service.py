"""Service-class math (``geodbk.service``): the joint tier probability against dense and
Monte Carlo references, the copula estimate, tier parsing and the classes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr
from scipy.stats import multivariate_normal

from geodbk.service import (
    BEAD_TIERS,
    DEFAULT_LATENCY_MS,
    HELD_OUT_CLASS_HEADER,
    Tier,
    bivariate_normal_cdf,
    check_correlation,
    class_colours,
    class_definitions,
    class_names,
    class_probabilities,
    gaussian_copula_correlation,
    held_out_class_rows,
    level_classes,
    most_probable_class,
    orthant_probability,
    parse_tiers,
    tier_probabilities,
)

#: A plausible copula of (download, upload, latency) residuals: speeds together, latency against.
R_TYPICAL = np.array([[1.0, 0.6, -0.35], [0.6, 1.0, -0.3], [-0.35, -0.3, 1.0]])
#: log10 thresholds (kbps, kbps, ms) of the BEAD tiers with 100 ms.
BEAD_LOG10 = np.array(
    [[np.log10(25e3), np.log10(3e3), 2.0], [np.log10(100e3), np.log10(20e3), 2.0]]
)


def _places(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Means and sds (log10 kbps, kbps, ms) spread across the tiers' thresholds."""
    rng = np.random.default_rng(seed)
    mean = np.column_stack(
        [rng.uniform(4.0, 5.3, n), rng.uniform(3.2, 4.6, n), rng.uniform(1.4, 2.3, n)]
    )
    sd = rng.uniform(0.05, 0.5, (n, 3))
    return mean, sd


@pytest.mark.parametrize(
    "corr",
    [
        R_TYPICAL,
        np.array([[1.0, 0.9, 0.9], [0.9, 1.0, 0.9], [0.9, 0.9, 1.0]]),
        np.array([[1.0, 0.95, -0.9], [0.95, 1.0, -0.9], [-0.9, -0.9, 1.0]]),
        np.array([[1.0, -0.45, -0.45], [-0.45, 1.0, -0.45], [-0.45, -0.45, 1.0]]),
        np.array([[1.0, 0.0, 0.7], [0.0, 1.0, 0.7], [0.7, 0.7, 1.0]]),  # nearly singular
    ],
)
def test_orthant_probability_matches_scipy(corr: np.ndarray) -> None:
    rng = np.random.default_rng(1)
    b = rng.normal(0.0, 1.5, (16, 3))
    b[0] = [9.0, 9.0, 9.0]  # ~1
    b[1] = [-9.0, 0.0, 0.0]  # ~0
    got = orthant_probability(b, corr)
    # scipy's randomised lattice rule is itself off by up to ~4e-5 on the nearly singular case
    mvn = multivariate_normal(mean=np.zeros(3), cov=corr, abseps=1e-6, releps=1e-6, seed=0)
    ref = np.array([mvn.cdf(x) for x in b])
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert got[0] == pytest.approx(1.0, abs=1e-12) and got[1] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("rho", [-0.99, -0.93, -0.6, -0.1, 0.0, 0.4, 0.7, 0.85, 0.92, 0.95, 0.999])
def test_bivariate_normal_cdf_matches_scipy(rho: float) -> None:
    rng = np.random.default_rng(2)
    h, k = rng.normal(0.0, 2.0, (2, 30))
    got = bivariate_normal_cdf(h, k, rho)
    mvn = multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]])
    ref = np.array([mvn.cdf([a, c]) for a, c in zip(h, k, strict=True)])
    np.testing.assert_allclose(got, ref, atol=1e-8)


def test_tier_probability_is_the_dense_trivariate_cdf() -> None:
    """P(D >= d, U >= u, L <= l) of N(mean, diag(sd) R diag(sd)) against scipy's CDF of the
    sign-flipped vector (-D, -U, L) <= (-d, -u, l)."""
    mean, sd = _places(12, seed=3)
    got = tier_probabilities(mean, sd, BEAD_LOG10, R_TYPICAL)
    flip = np.array([-1.0, -1.0, 1.0])
    for i in range(len(mean)):
        cov = np.outer(sd[i] * flip, sd[i] * flip) * R_TYPICAL
        mvn = multivariate_normal(mean=mean[i] * flip, cov=cov, abseps=1e-6, releps=1e-6, seed=0)
        for j, thr in enumerate(BEAD_LOG10):
            assert got[i, j] == pytest.approx(mvn.cdf(thr * flip), abs=1e-4)


def test_joint_classes_match_monte_carlo_on_1000_cells() -> None:
    """The three-target class probabilities against a Monte Carlo estimate from the copula
    (100,000 draws per cell, sd of each estimate <= 0.0016): within 0.01 on 1,000 cells."""
    mean, sd = _places(1000, seed=4)
    classes = class_probabilities(tier_probabilities(mean, sd, BEAD_LOG10, R_TYPICAL))
    rng = np.random.default_rng(5)
    draws = rng.standard_normal((100_000, 3)) @ np.linalg.cholesky(R_TYPICAL).T
    mc = np.empty_like(classes)
    for i in range(len(mean)):
        x = mean[i] + sd[i] * draws
        tiers = [(x[:, 0] >= t[0]) & (x[:, 1] >= t[1]) & (x[:, 2] <= t[2]) for t in BEAD_LOG10]
        p1, p2 = tiers[0].mean(), tiers[1].mean()
        mc[i] = [1.0 - p1, p1 - p2, p2]
    err = np.abs(classes - mc).max()
    print(f"max |class probability - Monte Carlo| on 1,000 cells: {err:.4f}")
    assert err < 0.01, err
    # the test can fail: ignoring the correlation (independent targets) misses by more
    indep = class_probabilities(tier_probabilities(mean, sd, BEAD_LOG10, np.eye(3)))
    assert np.abs(indep - mc).max() > 0.02


def test_independent_targets_give_the_product() -> None:
    mean, sd = _places(200, seed=6)
    got = tier_probabilities(mean, sd, BEAD_LOG10, np.eye(3))
    for j, (d, u, lat) in enumerate(BEAD_LOG10):
        product = (
            ndtr((mean[:, 0] - d) / sd[:, 0])
            * ndtr((mean[:, 1] - u) / sd[:, 1])
            * ndtr((lat - mean[:, 2]) / sd[:, 2])
        )
        np.testing.assert_allclose(got[:, j], product, atol=1e-9)


def test_classes_are_probabilities_summing_to_one() -> None:
    mean, sd = _places(500, seed=7)
    tiers = tier_probabilities(mean, sd, BEAD_LOG10, R_TYPICAL)
    assert (np.diff(tiers, axis=1) <= 0).all()  # nested events
    classes = class_probabilities(tiers)
    assert classes.shape == (500, 3)
    assert ((classes >= 0) & (classes <= 1)).all()
    np.testing.assert_allclose(classes.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(classes[:, 0], 1.0 - tiers[:, 0])
    np.testing.assert_allclose(classes[:, 2], tiers[:, 1])
    # rounding that breaks nesting is repaired, and the result still sums to 1
    fixed = class_probabilities(np.array([[0.5, 0.6], [1.2, -0.1]]))
    np.testing.assert_allclose(fixed, [[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]])
    assert most_probable_class(classes).dtype == np.int8
    assert most_probable_class(np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])).tolist() == [1, 0]


def test_a_fast_place_is_served_and_a_slow_one_unserved() -> None:
    mean = np.array([[np.log10(300e3), np.log10(50e3), 1.3], [np.log10(5e3), np.log10(5e2), 1.3]])
    sd = np.full((2, 3), 0.05)
    classes = class_probabilities(tier_probabilities(mean, sd, BEAD_LOG10, R_TYPICAL))
    assert classes[0, 2] > 0.999 and classes[1, 0] > 0.999
    # high latency makes even a fast place unserved
    mean[0, 2] = np.log10(400.0)
    assert class_probabilities(tier_probabilities(mean, sd, BEAD_LOG10, R_TYPICAL))[0, 0] > 0.999


def test_copula_recovers_a_known_correlation_under_any_marginals() -> None:
    rng = np.random.default_rng(8)
    z = rng.standard_normal((20_000, 3)) @ np.linalg.cholesky(R_TYPICAL).T
    # monotone transforms of each column change the marginals, not the copula
    residuals = np.column_stack([np.exp(z[:, 0]), z[:, 1] ** 3, np.tanh(z[:, 2])])
    R = gaussian_copula_correlation(residuals)
    np.testing.assert_allclose(R, R_TYPICAL, atol=0.03)
    np.testing.assert_allclose(np.diag(R), 1.0)
    np.testing.assert_allclose(R, R.T)
    # the raw (Pearson) correlation of the transformed columns is off: ranks matter
    assert np.abs(np.corrcoef(residuals.T) - R_TYPICAL).max() > 0.05


def test_copula_refuses_too_few_rows_constant_columns_and_non_finite() -> None:
    rng = np.random.default_rng(9)
    with pytest.raises(ValueError, match="at least 30 rows"):
        gaussian_copula_correlation(rng.standard_normal((10, 3)))
    const = rng.standard_normal((100, 3))
    const[:, 1] = 2.0
    with pytest.raises(ValueError, match="constant"):
        gaussian_copula_correlation(const)
    bad = rng.standard_normal((100, 3))
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        gaussian_copula_correlation(bad)


def test_check_correlation_refuses_non_positive_definite() -> None:
    with pytest.raises(ValueError, match="positive definite"):
        check_correlation(np.array([[1.0, 0.9, -0.9], [0.9, 1.0, 0.9], [-0.9, 0.9, 1.0]]))
    with pytest.raises(ValueError, match="unit diagonal"):
        check_correlation(np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    with pytest.raises(ValueError, match="singular"):
        check_correlation(np.ones((3, 3)) * (1 - 1e-12) + np.eye(3) * 1e-12)


def test_parse_tiers() -> None:
    assert parse_tiers("25/3,100/20") == BEAD_TIERS
    assert parse_tiers(" 10 / 1 , 25/3 ,100/20") == (Tier(10, 1), Tier(25, 3), Tier(100, 20))
    assert parse_tiers("100/20,1000/20") == (Tier(100, 20), Tier(1000, 20))  # down stricter
    assert parse_tiers("25/3")[0].label == "25/3"
    assert DEFAULT_LATENCY_MS == 100


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "at least one tier"),
        ("25", "not DOWN/UP"),
        ("25/3/1", "not DOWN/UP"),
        ("25/x", "not DOWN/UP"),
        ("25/3,,100/20", "not DOWN/UP"),
        ("0/3", "positive finite"),
        ("-25/3", "positive finite"),
        ("inf/3", "positive finite"),
        ("100/20,25/3", "nested"),
        ("25/3,100/2", "nested"),
        ("25/3,25/3", "nested"),
    ],
)
def test_parse_tiers_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_tiers(text)


def test_class_names() -> None:
    assert class_names(2) == ("unserved", "underserved", "served")
    assert class_names(1) == ("unserved", "served")
    assert class_names(3) == ("unserved", "underserved_1", "underserved_2", "served")
    with pytest.raises(ValueError):
        class_names(0)


def test_bad_inputs_are_refused() -> None:
    mean, sd = _places(3, seed=10)
    with pytest.raises(ValueError, match="sds positive"):
        tier_probabilities(mean, np.zeros_like(sd), BEAD_LOG10, R_TYPICAL)
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        tier_probabilities(mean[:, :2], sd[:, :2], BEAD_LOG10, R_TYPICAL)
    with pytest.raises(ValueError, match="3 x 3"):
        orthant_probability(np.zeros((2, 3)), np.eye(2))


def test_class_colours_run_red_yellow_green_for_any_class_count() -> None:
    three = class_colours(3, alpha=235)
    assert three == {0: (215, 48, 39, 235), 1: (254, 224, 139, 235), 2: (26, 152, 80, 235)}
    four = class_colours(4)
    assert four[0][:3] == three[0][:3] and four[3][:3] == three[2][:3]
    assert len(set(four.values())) == 4 and all(c[3] == 255 for c in four.values())


def test_each_class_is_defined_by_its_tiers_and_the_latency() -> None:
    assert class_definitions(BEAD_TIERS, DEFAULT_LATENCY_MS) == (
        "meets no tier: below 25/3 Mbps, or latency above 100 ms",
        "meets 25/3 but not 100/20 Mbps (latency at most 100 ms)",
        "meets 100/20 Mbps with latency at most 100 ms",
    )
    one = class_definitions([Tier(25.0, 3.0)], 50.0)
    assert len(one) == len(class_names(1)) == 2


def test_level_classes_count_the_leading_tiers_met() -> None:
    thr = np.log10([[25e3, 3e3, 100.0], [100e3, 20e3, 100.0]])  # kbps, kbps, ms
    levels = np.log10(
        [
            [25e3, 3e3, 100.0],  # exactly at tier 1 and the latency limit: meets tier 1
            [24.9e3, 50e3, 20.0],  # download short of tier 1: unserved, whatever the rest
            [200e3, 50e3, 101.0],  # latency above the limit: no tier
            [200e3, 19e3, 30.0],  # upload short of tier 2 only
            [100e3, 20e3, 30.0],  # tier 2 exactly
        ]
    )
    np.testing.assert_array_equal(level_classes(levels, thr), [1, 0, 0, 1, 2])
    assert level_classes(levels, thr).dtype == np.int8
    with pytest.raises(ValueError, match=r"\(n, 3\)"):
        level_classes(levels[:, :2], thr)


def test_held_out_class_rows_follow_the_classes_and_mark_misses() -> None:
    group = {
        "classes": {
            "served": {
                "expected_share": 0.1,
                "observed_share": 0.3,
                "observed_interval": [0.2, 0.4],
                "consistent": False,
            },
            "unserved": {
                "expected_share": 0.9,
                "observed_share": 0.7,
                "observed_interval": [0.6, 0.95],
                "consistent": True,
            },
        },
        "map_class": {
            "served": {"tiles": 0, "observed_same": None},
            "unserved": {"tiles": 10, "observed_same": 0.7},
        },
    }
    rows = held_out_class_rows(group, ["unserved", "served"])
    assert [r[0] for r in rows] == ["unserved", "served"]
    assert rows[0][1:] == ["90.0%", "70.0% (60.0–95.0%)", "10", "70.0%"]
    assert rows[1][2].endswith("(outside)") and rows[1][4] == "–"
    assert len(rows[0]) == len(HELD_OUT_CLASS_HEADER)
