"""Report figures: the binned sd maps (batch by batch equal to one pass) and the PNG writers."""

from __future__ import annotations

import numpy as np

from pipelines import figures


def test_sd_binner_batches_equal_one_pass() -> None:
    rng = np.random.default_rng(1)
    lon, lat = rng.uniform(0, 2, 500), rng.uniform(0, 1, 500)
    resid, sd = rng.normal(size=500), rng.uniform(0.1, 1, 500)
    bounds = (0.0, 0.0, 2.0, 1.0)
    emp, pred, extent = figures.binned_sd(lon, lat, resid, sd, bounds, cells=8)
    binner = figures.SdBinner(bounds, cells=8)
    for i in range(0, 500, 37):
        binner.add(lon[i : i + 37], lat[i : i + 37], resid[i : i + 37], sd[i : i + 37])
    emp2, pred2, extent2 = binner.result()
    assert extent2 == extent and emp.shape == (4, 8)
    assert np.isfinite(emp).sum() > 20
    assert np.allclose(emp, emp2, equal_nan=True) and np.allclose(pred, pred2, equal_nan=True)
