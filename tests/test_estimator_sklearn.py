"""DBKRegressor as a scikit-learn estimator (issue 21).

scikit-learn's common estimator checks on a tiny configuration, the model inside
``make_pipeline`` / ``clone`` / ``cross_val_score`` / ``GridSearchCV``, ``NotFittedError``,
``n_features_in_`` / ``feature_names_in_``, ``predict`` (numpy mean, ``return_std``) against
``predict_dist`` (the full :class:`~geodbk.predictive.Prediction`), and loading bundles whose
config has keys that are no longer parameters.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

from geodbk import DBKRegressor, Prediction
from geodbk.errors import DataError

#: A configuration that trains in a fraction of a second and still fits scikit-learn's
#: regression check data (R² > 0.5 in ``check_regressors_train``). float64: in float32 a row's
#: prediction depends on how the batch's matrix products are blocked (~1e-7 relative), and
#: ``check_methods_subset_invariance`` compares predictions on a subset at rtol = 1e-7.
TINY: dict[str, Any] = {
    "rank": 16,
    "hidden": 16,
    "epochs": 30,
    "patience": 30,
    "lr": 3e-2,
    "batch_size": 64,
    "device": "cpu",
    "dtype": "float64",
}

#: scikit-learn checks that fail by design, each with the reason.
EXPECTED_FAILED_CHECKS = {
    # A 1-D X is read as one feature per row (geodbk.validation.as_feature_matrix), as everywhere
    # in geodbk; scikit-learn expects fit to refuse it.
    "check_fit1d": "a 1-D X is one feature per row in geodbk, not an error",
}


@parametrize_with_checks(
    [DBKRegressor(**TINY)],
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS,
    xfail_strict=True,
)
def test_sklearn_estimator_checks(estimator: DBKRegressor, check: Any) -> None:
    check(estimator)


def _data(n: int = 150, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    y = 50.0 + 10.0 * np.sin(3 * x[:, 0]) + 3.0 * x[:, 1] + rng.normal(scale=1.0, size=n)
    return x, y


@pytest.fixture(scope="module")
def fitted() -> DBKRegressor:
    x, y = _data()
    return DBKRegressor(**TINY).fit(x, y)


def test_is_a_scikit_learn_regressor() -> None:
    model = DBKRegressor(**TINY)
    assert is_regressor(model)
    tags = get_tags(model)
    assert tags.estimator_type == "regressor" and tags.target_tags.required
    assert not tags.target_tags.positive_only and not tags.input_tags.allow_nan
    # the parameters are the __init__ signature's
    names = [p for p in inspect.signature(DBKRegressor.__init__).parameters if p != "self"]
    assert sorted(model.get_params()) == sorted(names)
    assert model.set_params(rank=8).rank == 8
    with pytest.raises(ValueError, match="Invalid parameter"):
        model.set_params(no_such_option=1)
    # options are stored as given and checked when fitting
    bad = DBKRegressor(expansion="poly")
    with pytest.raises(ValueError, match="expansion"):
        bad.fit(*_data(20))


def test_unfitted_model_raises_not_fitted_error() -> None:
    model = DBKRegressor(**TINY)
    x, y = _data(10)
    with pytest.raises(NotFittedError):
        check_is_fitted(model)
    for call in (
        lambda: model.predict(x),
        lambda: model.predict(x, return_std=True),
        lambda: model.predict_dist(x),
        lambda: model.score(x, y),
        lambda: model.predict_change(x, x),
        lambda: model.features(x),
        lambda: model.noise_variance(),
        lambda: model.save("unused"),
    ):
        with pytest.raises(NotFittedError, match="not fitted yet; call fit"):
            call()
    # a fit that fails after checking X leaves the model as it was: unfitted, nothing recorded
    with pytest.raises(DataError, match="values but the inputs have"):
        model.fit(x, y[:5])
    assert not hasattr(model, "n_features_in_") and not hasattr(model, "fit_params_")
    with pytest.raises(NotFittedError):
        model.predict(x)


def test_a_failed_refit_keeps_the_fitted_model() -> None:
    x, y = _data()
    model = DBKRegressor(**TINY).fit(x, y)
    before = model.predict(x)
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(DataError):
        model.fit(x[:, :1], bad)  # one column: n_features_in_ would be 1 beside a 2-input model
    assert model.n_features_in_ == 2
    np.testing.assert_array_equal(model.predict(x), before)


def test_set_params_after_fit_changes_nothing_until_the_next_fit(tmp_path: Path) -> None:
    x, y = _data()
    model = DBKRegressor(**TINY).fit(x, y)
    mean, sd = model.predict(x, return_std=True)
    model.set_params(objective="elbo", dtype="float32", rank=8)
    got = model.predict(x, return_std=True)
    np.testing.assert_array_equal(got[0], mean)
    np.testing.assert_array_equal(got[1], sd)
    # what is saved is the model that was fitted, with the parameters it was fitted with
    back = DBKRegressor.load(model.save(tmp_path / "m"))
    assert back.get_params()["rank"] == TINY["rank"] and back.objective == "dppgp"
    np.testing.assert_allclose(back.predict(x, return_std=True), (mean, sd), rtol=1e-12)
    model.fit(x, y)  # the next fit takes the new parameters
    assert model.fit_params_["rank"] == 8 and model.predict(x).dtype == np.float64


def test_predict_returns_numpy_mean_and_std(fitted: DBKRegressor) -> None:
    x, _ = _data(40, seed=1)
    mean = fitted.predict(x)
    assert isinstance(mean, np.ndarray)
    assert np.asarray(fitted.predict(x)).shape == (40,) and mean.dtype == np.float64
    dist = fitted.predict_dist(x)
    assert isinstance(dist, Prediction)
    np.testing.assert_array_equal(mean, dist.mean)
    m, s = fitted.predict(x, return_std=True)
    assert m.shape == (40,) and s.shape == (40,)
    np.testing.assert_array_equal(m, mean)
    # the predictive sd of a new observation: noise included, the Prediction's std
    np.testing.assert_array_equal(s, dist.std)
    np.testing.assert_allclose(s**2, dist.var_f + fitted.noise_variance(n=40), rtol=1e-12)
    assert np.all(s > fitted.predict_dist(x, quantity="latent").std)
    # lists of rows are inputs too
    np.testing.assert_allclose(fitted.predict(x.tolist()), mean, rtol=1e-12)


def test_predict_dist_is_the_old_predict(fitted: DBKRegressor) -> None:
    """predict_dist keeps the old ``predict``: mean, var and var_f in y's units from the folded
    weights (recomputed here from the torch model), with every keyword option."""
    x, _ = _data(25, seed=2)
    model = fitted.model_
    with torch.no_grad():
        mu, var_f, var = model.predict_folded(
            torch.as_tensor(x, dtype=torch.float64), model.fold(variance_correction=False)
        )
    sd2 = fitted.y_std_**2
    got = fitted.predict_dist(x, chunk_size=7)
    np.testing.assert_allclose(got.mean, fitted.y_mean_ + fitted.y_std_ * mu.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got.var_f, sd2 * var_f.numpy(), rtol=1e-10)
    np.testing.assert_allclose(got.var, sd2 * var.numpy(), rtol=1e-10)
    latent = fitted.predict_dist(x, quantity="latent")
    np.testing.assert_array_equal(latent.var, latent.var_f)
    np.testing.assert_array_equal(latent.mean, fitted.predict(x))
    with pytest.raises(ValueError, match="quantity"):
        fitted.predict_dist(x, quantity="median")


def test_score_is_r2(fitted: DBKRegressor) -> None:
    x, y = _data(60, seed=3)
    assert fitted.score(x, y) == pytest.approx(r2_score(y, fitted.predict(x)))
    assert fitted.score(x, y) > 0.5


def test_fit_accepts_arrays_lists_and_dataframes() -> None:
    x, y = _data(60)
    a = DBKRegressor(**TINY).fit(x, y).predict(x)
    b = DBKRegressor(**TINY).fit(x.tolist(), y.tolist()).predict(x)
    frame = pd.DataFrame(x, columns=["lon", "lat"])
    c = DBKRegressor(**TINY).fit(frame, pd.Series(y)).predict(frame)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    with pytest.raises(DataError, match="requires y to be passed"):
        DBKRegressor(**TINY).fit(x, None)
    with pytest.raises(DataError, match="1 sample"):
        DBKRegressor(**TINY).fit(x[:1], y[:1])


def test_feature_names_are_recorded_and_checked(tmp_path: Path) -> None:
    x, y = _data(60)
    frame = pd.DataFrame(x, columns=["lon", "lat"])
    model = DBKRegressor(**TINY).fit(frame, y)
    assert model.n_features_in_ == 2
    assert list(model.feature_names_in_) == ["lon", "lat"]
    mean = model.predict(frame)
    with pytest.raises(ValueError, match="same order as they were in fit"):
        model.predict(frame[["lat", "lon"]])
    with pytest.raises(ValueError, match="unseen at fit time"):
        model.predict(frame.rename(columns={"lat": "latitude"}))
    with pytest.raises(ValueError, match="same order"):
        model.predict_dist(frame[["lat", "lon"]])
    with pytest.raises(ValueError, match="same order"):  # validation rows are checked too
        DBKRegressor(**TINY).fit(frame, y, frame[["lat", "lon"]], y)
    with pytest.raises(ValueError, match="unseen at fit time:\n- t"):
        model.predict(frame.assign(t=0.0))
    # a plain array still works (scikit-learn warns that it has no names)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        np.testing.assert_array_equal(model.predict(x), mean)
    # the names survive save/load
    model.save(tmp_path / "m")
    back = DBKRegressor.load(tmp_path / "m", device="cpu")
    assert list(back.feature_names_in_) == ["lon", "lat"]
    np.testing.assert_allclose(back.predict(frame), mean, rtol=1e-12)
    with pytest.raises(ValueError, match="same order"):
        back.predict(frame[["lat", "lon"]])
    # refitted on an array: no names any more
    model.fit(x, y)
    assert not hasattr(model, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.predict(x)
    with pytest.raises(DataError, match="X has 3 features, but DBKRegressor is expecting 2"):
        model.predict(np.column_stack([x, x[:, 0]]))
    with pytest.raises(DataError, match="Reshape your data"):
        model.predict(x[0])  # a 1-D X is one feature per row: 2 rows of 1 feature


def test_pipeline_clone_cross_validation_and_grid_search() -> None:
    x, y = _data()
    x = x * np.array([1.0, 30.0]) + np.array([0.0, 100.0])  # unscaled inputs: the scaler's job
    pipe = make_pipeline(StandardScaler(), DBKRegressor(**TINY))
    pipe.fit(x, y)
    assert pipe.predict(x).shape == (150,)
    mean, std = pipe.predict(x[:10], return_std=True)  # passed on to the regressor
    assert mean.shape == std.shape == (10,) and np.all(std > 0)
    assert pipe.score(x, y) > 0.5

    model = DBKRegressor(**TINY).fit(x, y)
    twin = clone(model)
    assert twin.get_params() == model.get_params()
    assert not hasattr(twin, "model_")
    with pytest.raises(NotFittedError):
        twin.predict(x)

    scores = cross_val_score(make_pipeline(StandardScaler(), DBKRegressor(**TINY)), x, y, cv=3)
    assert scores.shape == (3,) and np.all(np.isfinite(scores))

    search = GridSearchCV(DBKRegressor(**TINY), {"rank": [4, 16]}, cv=2).fit(x, y)
    assert search.best_params_["rank"] in (4, 16)
    assert search.best_estimator_.predict(x).shape == (150,)


def test_load_ignores_unknown_config_keys(fitted: DBKRegressor, tmp_path: Path) -> None:
    """Bundles from other versions: keys that are not ``__init__`` parameters are ignored and
    options added later take their old defaults."""
    x, _ = _data(10, seed=4)
    fitted.save(tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert set(doc["config"]) == set(fitted.get_params())
    doc["config"]["retired_option"] = 3  # e.g. an option a later version dropped
    del doc["config"]["noise_urban"]  # a bundle from before noise_urban
    (tmp_path / "m" / "model.json").write_text(json.dumps(doc))
    back = DBKRegressor.load(tmp_path / "m", device="cpu")
    assert not hasattr(back, "retired_option") and back.noise_urban is False
    assert back.get_params() == {**fitted.get_params(), "device": "cpu"}
    np.testing.assert_array_equal(back.predict(x), fitted.predict(x))
    check_is_fitted(back)


@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("alpha", float("nan"), "alpha must be a finite number >= 0"),
        ("beta", float("inf"), "beta must be a finite number >= 0"),
        ("lr", 0.0, "lr must be a finite number > 0"),
        ("noise_init", float("nan"), "noise_init must be"),
        ("jitter", -1e-4, "jitter must be a finite number >= 0"),
        ("rank", 0, "rank must be >= 1"),
    ],
)
def test_bad_hyperparameters_are_named_before_training(option: str, value: Any, rule: str) -> None:
    x, y = _data(20)
    with pytest.raises(ValueError, match=rule):
        DBKRegressor(**{**TINY, option: value}).fit(x, y)
    # numpy numbers, as a parameter grid gives them, are numbers
    assert DBKRegressor(**{**TINY, "rank": np.int64(4), "epochs": 1}).fit(x, y).rank == 4
