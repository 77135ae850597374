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
