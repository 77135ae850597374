"""P(q >= t) and P(q <= t) for q ~ N(mean, sd²): one definition for maps, report, areas, app."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from geodbk.exceedance import exceedance_probability


def test_matches_the_normal_distribution_on_both_sides() -> None:
    rng = np.random.default_rng(1)
    mean, sd = rng.normal(4.0, 0.5, 200), rng.uniform(0.05, 0.6, 200)
    t = np.log10(25e3)
    above = exceedance_probability(mean, sd, t, above=True)
    below = exceedance_probability(mean, sd, t, above=False)
    np.testing.assert_allclose(above, norm.sf(t, loc=mean, scale=sd), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(below, norm.cdf(t, loc=mean, scale=sd), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(above + below, 1.0, atol=1e-12)


def test_point_mass_nan_and_broadcasting() -> None:
    got = exceedance_probability(np.array([1.0, 2.0, 3.0, np.nan]), 0.0, 2.0, above=True)
    np.testing.assert_array_equal(got[:3], [0.0, 1.0, 1.0])
    assert np.isnan(got[3])
    grid = exceedance_probability(np.zeros((2, 3)), np.array([1.0, 2.0, 0.0]), 0.0, above=False)
    assert grid.shape == (2, 3)
    np.testing.assert_allclose(grid, 0.5 * np.ones((2, 3)) + [[0, 0, 0.5]] * np.ones((2, 1)))
