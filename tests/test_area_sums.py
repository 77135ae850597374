"""Per-area sums of joint draws (geodbk.area_sums) against direct numpy on the whole sample."""

from __future__ import annotations

import numpy as np

from geodbk.area_sums import AreaSums, pairs_of_layers
from geodbk.exceedance import exceedance_probability


def test_chunked_sums_equal_the_direct_weighted_means_and_shares() -> None:
    rng = np.random.default_rng(0)
    n, S = 50, 400
    draws = rng.normal(1.0, 0.5, size=(n, S)) + rng.normal(size=S)  # correlated places
    mean = np.full(n, 1.0)
    var = np.full(n, 1.25)
    weight = rng.uniform(0.5, 1.0, n)
    layer0 = np.where(np.arange(n) < 30, 0, 1)  # areas 0 and 1 tile the places
    layer1 = np.where(np.arange(n) % 5 == 0, 2, -1)  # area 2 overlaps both
    layer0[45:] = -1  # the last places lie in no area of layer 0
    sums = AreaSums(4, S, thresholds=(1.2,), higher_is_better=True)
    for part in (slice(0, 17), slice(17, 50)):  # two chunks
        places, areas = pairs_of_layers([layer0[part], layer1[part]])
        sub = draws[part]
        sums.add(places, areas, weight=weight[part], draws=sub, mean=mean[part], var=var[part])
    got = sums.summary(level=0.9)
    for area, members in enumerate(
        [layer0 == 0, layer0 == 1, layer1 == 2, np.zeros(n, dtype=bool)]
    ):
        if not members.any():
            assert got.count[area] == 0 and np.isnan(got.mean[area])
            assert np.isnan(got.share_mean[0, area]) and np.isnan(got.lower[area])
            continue
        w = weight[members]
        level = (w[:, None] * draws[members]).sum(0) / w.sum()
        assert got.count[area] == members.sum()
        np.testing.assert_allclose(got.mean[area], 1.0)
        np.testing.assert_allclose(
            [got.lower[area], got.upper[area]], np.quantile(level, [0.05, 0.95])
        )
        half = 1.6448536 * np.sqrt((w**2 * 1.25).sum()) / w.sum()
        np.testing.assert_allclose(got.independent_upper[area] - got.mean[area], half, rtol=1e-6)
        share = (w[:, None] * (draws[members] >= 1.2)).sum(0) / w.sum()
        np.testing.assert_allclose(got.share_lower[0, area], np.quantile(share, 0.05))
        exact = exceedance_probability(np.array([1.0]), np.array([np.sqrt(1.25)]), 1.2, above=True)
        np.testing.assert_allclose(got.share_mean[0, area], exact[0])


def test_served_probability_directions() -> None:
    m, s = np.array([2.0, 2.0, 2.0]), np.array([1.0, 0.0, 0.0])
    up = exceedance_probability(m, s, 2.0, above=True)
    down = exceedance_probability(m + np.array([0, 1, -1]), s, 2.0, above=False)
    np.testing.assert_allclose(up, [0.5, 1.0, 1.0])
    np.testing.assert_allclose(down, [0.5, 0.0, 1.0])


def test_the_point_share_is_the_expected_share_and_lies_in_its_interval() -> None:
    """Dense float64 reference: correlated Gaussian draws at 6 places (``m + C eps``, ``CC'`` a
    squared-exponential covariance); area 0 is one place served with probability 0.986, whose
    sampled share is 1 in about 98.6% of samples, so both 5/95% quantiles are 1."""
    rng = np.random.default_rng(3)
    n, S, t = 6, 20_000, 0.0
    x = np.linspace(0.0, 1.0, n)
    cov = 0.5 * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 0.3**2) + 1e-9 * np.eye(n)
    sd = np.sqrt(np.diag(cov))
    mean = np.array([2.2, 2.5, 3.0, 1.5, 0.2, -0.3]) * sd  # place 0: P(served) = Phi(2.2)
    draws = mean[:, None] + np.linalg.cholesky(cov) @ rng.standard_normal((n, S))
    weight = rng.uniform(0.5, 1.0, n)
    members = [np.array([0]), np.arange(3), np.arange(n)]
    places = np.concatenate(members)
    areas = np.concatenate([np.full(m.size, k) for k, m in enumerate(members)])
    sums = AreaSums(len(members), S, thresholds=(t,), higher_is_better=True)
    sums.add(places, areas, weight=weight, draws=draws, mean=mean, var=sd**2)
    got = sums.summary(level=0.9)
    served = exceedance_probability(mean, sd, t, above=True)
    for k, m in enumerate(members):
        w = weight[m]
        share = (w[:, None] * (draws[m] >= t)).sum(0) / w.sum()
        expected = (w * served[m]).sum() / w.sum()
        point, lo, hi = got.share_mean[0, k], got.share_lower[0, k], got.share_upper[0, k]
        np.testing.assert_allclose(point, expected, rtol=1e-12)
        # the point is the mean of the sampled shares, within Monte Carlo error
        assert abs(share.mean() - point) < 4 * share.std() / np.sqrt(S) + 1e-12
        q_lo, q_hi = np.quantile(share, [0.05, 0.95])
        np.testing.assert_allclose([lo, hi], [min(q_lo, point), max(q_hi, point)], rtol=1e-12)
        assert 0.0 <= lo <= point <= hi <= 1.0
        assert ((share >= lo) & (share <= hi)).mean() >= 0.9
        assert got.lower[k] <= got.mean[k] <= got.upper[k]
    assert np.quantile((draws[0] >= t).astype(float), 0.05) == 1.0 > got.share_mean[0, 0]


def test_shares_stay_within_0_and_1_when_their_float_sums_pass_1() -> None:
    """Every place served for sure: the sums ``sum w 1[served]`` and ``sum w`` are added in
    different orders and their ratio can pass 1 by a few ulps; the shares are clipped."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        n, S = 2000, 20
        weight = np.cos(np.radians(rng.uniform(18.0, 23.0, n)))
        sums = AreaSums(3, S, thresholds=(0.0,), higher_is_better=True)
        sums.add(
            np.arange(n),
            rng.integers(0, 3, n),
            weight=weight,
            draws=np.ones((n, S)),
            mean=np.ones(n),
            var=np.full(n, 1e-6),
        )
        got = sums.summary(level=0.9)
        for values in (got.share_mean, got.share_lower, got.share_upper):
            assert ((values >= 0.0) & (values <= 1.0)).all()
            np.testing.assert_allclose(values, 1.0, rtol=1e-12)
