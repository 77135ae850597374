"""The torch baselines as scikit-learn estimators through ``TorchBaseline`` (issue 21).

scikit-learn's common checks on the exact RBF GP (fast, float64 by default), and for CaGP and
SoftKI: ``clone``, ``make_pipeline``, ``NotFittedError``, ``predict`` shapes against
``predict_dist``, ``score`` (R²), feature names, and bundles with unknown saved options.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.metrics import r2_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

from geodbk.baselines.base import TorchBaseline
from geodbk.baselines.cagp import CaGPRegressor
from geodbk.baselines.exact_rbf import ExactRBFRegressor
from geodbk.baselines.softki import SoftKIRegressor
from geodbk.errors import DataError
from geodbk.predictive import Prediction


@parametrize_with_checks(
    [ExactRBFRegressor(epochs=30)],
    # A 1-D X is read as one feature per row (geodbk.validation.as_feature_matrix), as everywhere
    # in geodbk; scikit-learn expects fit to refuse it.
    expected_failed_checks=lambda est: {"check_fit1d": "a 1-D X is one feature per row"},
    xfail_strict=True,
)
def test_sklearn_estimator_checks(estimator: TorchBaseline, check: Any) -> None:
    check(estimator)


#: Two baselines in a tiny float64 configuration (a full-batch and a mini-batch one).
MODELS = {
    "cagp": lambda: CaGPRegressor(epochs=20, n_actions=16, dtype="float64"),
    "softki": lambda: SoftKIRegressor(epochs=10, num_points=16, batch_size=32, dtype="float64"),
}


def _data(n: int = 80, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    y = 20.0 + 5.0 * np.sin(3 * x[:, 0]) + 2.0 * x[:, 1] + rng.normal(scale=0.5, size=n)
    return x, y


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameters_come_from_the_signature(name: str) -> None:
    model = MODELS[name]()
    assert is_regressor(model)
    names = [p for p in inspect.signature(type(model).__init__).parameters if p != "self"]
    assert sorted(model.get_params()) == sorted(names)
    assert {"epochs", "lr", "seed", "noise", "noise_power"} <= set(names)
    twin = clone(model)
    assert twin.get_params() == model.get_params() and twin is not model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_baseline_as_scikit_learn_regressor(name: str) -> None:
    x, y = _data()
    model = MODELS[name]()
    with pytest.raises(NotFittedError, match="not fitted yet; call fit"):
        model.predict(x)
    with pytest.raises(NotFittedError):
        model.predict_dist(x)
    with pytest.raises(NotFittedError):
        check_is_fitted(model)

    model.fit(x, y)
    check_is_fitted(model)
    assert model.n_features_in_ == 2
    mean = model.predict(x)
    assert np.asarray(mean).shape == (80,) and mean.dtype == np.float64
    dist = model.predict_dist(x)
    assert isinstance(dist, Prediction)
    np.testing.assert_array_equal(mean, dist.mean)
    m, s = model.predict(x, return_std=True)
    assert m.shape == s.shape == (80,)
    np.testing.assert_array_equal(s, dist.std)  # noise included
    assert np.all(s > model.predict_dist(x, quantity="latent").std)
    assert model.score(x, y) == pytest.approx(r2_score(y, mean))

    unfitted = clone(model)
    with pytest.raises(NotFittedError):
        unfitted.predict(x)

    raw = x * np.array([1.0, 50.0])
    pipe = make_pipeline(StandardScaler(), MODELS[name]()).fit(raw, y)
    assert pipe.predict(raw).shape == (80,)
    assert np.isfinite(pipe.score(raw, y))


def test_baseline_feature_names_and_old_bundles(tmp_path: Path) -> None:
    x, y = _data()
    frame = pd.DataFrame(x, columns=["lon", "lat"])
    model = MODELS["cagp"]().fit(frame, y)
    assert list(model.feature_names_in_) == ["lon", "lat"]
    with pytest.raises(ValueError, match="same order as they were in fit"):
        model.predict(frame[["lat", "lon"]])
    model.save(tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    doc["baseline"]["params"]["retired_option"] = 1  # an option a later version dropped
    del doc["input_dim"], doc["feature_names"]  # bundles from before issue 21 lack them
    (tmp_path / "m" / "model.json").write_text(json.dumps(doc))
    back = CaGPRegressor.load(tmp_path / "m")
    assert back.get_params() == model.get_params()
    np.testing.assert_array_equal(back.predict(x), model.predict(frame))


def test_baseline_set_params_after_fit_and_a_failed_refit(tmp_path: Path) -> None:
    x, y = _data()
    model = MODELS["cagp"]().fit(x, y)
    mean = model.predict(x)
    model.set_params(dtype="float32", noise="tests")
    np.testing.assert_array_equal(model.predict(x), mean)  # no tests needed: fitted constant
    back = CaGPRegressor.load(model.save(tmp_path / "m"))
    assert back.get_params()["noise"] == "constant"
    np.testing.assert_array_equal(back.predict(x), mean)
    with pytest.raises(DataError):
        model.fit(x[:, :1], y[:5])
    assert model.n_features_in_ == 2
    np.testing.assert_array_equal(model.predict(x), mean)
