"""Baselines on the core's DBKRegressor path take the tests-aware noise (issue 9)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from geodbk.baselines.svgp import SVRBFRegressor, pp_dkl, sv_dkl, vbll


def _data(n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    tests = rng.integers(1, 30, n).astype(float)
    y = np.sin(2 * x[:, 0]) + rng.normal(size=n) * np.sqrt(0.02 + 0.3 / tests)
    return x, y, tests


@pytest.mark.parametrize("make", [SVRBFRegressor, sv_dkl, pp_dkl, vbll])
def test_dbk_path_baselines_accept_tests_noise(make, tmp_path: Path) -> None:
    x, y, tests = _data()
    model = make(rank=8, hidden=8, epochs=2, batch_size=64, device="cpu", noise="tests")
    model.fit(x, y, x[:40], y[:40], tests=tests, tests_val=tests[:40])
    assert model.noise_parameters()["noise"] == "tests"
    one = model.predict(x[:5])
    many = model.predict(x[:5], tests=20)
    latent = model.predict(x[:5], quantity="latent")
    assert np.all(latent.var < many.var) and np.all(many.var < one.var)
    model.save(tmp_path / "m")
    back = type(model).load(tmp_path / "m", device="cpu")
    np.testing.assert_allclose(back.predict(x[:5], tests=3).var, model.predict(x[:5], tests=3).var)
