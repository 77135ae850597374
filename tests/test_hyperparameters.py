"""The DBK hyperparameters declared once (:mod:`geodbk.hyperparameters`): the estimator takes
its parameters and defaults from them, stays a scikit-learn estimator (identity equality,
hashable, parameters from ``__init__``), and the training loop's options are built from them."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import numpy as np
import pytest
from sklearn.base import clone

from geodbk import DBKRegressor
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.training import LoopConfig

#: What only the estimator declares (the model's numerics and the urban floor).
ESTIMATOR_ONLY = {"jitter", "dtype", "noise_floor", "noise_urban"}


def _defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(cls)}


def test_the_estimator_takes_the_shared_parameters_and_their_defaults() -> None:
    shared = _defaults(DBKHyperparameters)
    assert MISSING not in shared.values()
    params = DBKRegressor().get_params()
    assert set(params) == set(shared) | ESTIMATOR_ONLY
    assert {k: params[k] for k in shared} == shared
    signature = inspect.signature(DBKRegressor.__init__).parameters
    assert all(signature[k].kind is inspect.Parameter.KEYWORD_ONLY for k in params)
    assert (shared["rank"], shared["hidden"], shared["objective"]) == (1024, 256, "dppgp")


def test_the_estimator_keeps_scikit_learns_equality_repr_and_hash() -> None:
    a, b = DBKRegressor(rank=8), DBKRegressor(rank=8)
    assert a != b and a == a and len({a, b}) == 2  # identity, as BaseEstimator
    assert repr(a) == "DBKRegressor(rank=8)"  # only the parameters that differ from the defaults
    assert clone(a).get_params() == a.get_params()
    hp = DBKHyperparameters(rank=8)
    assert hp != DBKHyperparameters(rank=8) and len({hp}) == 1


@pytest.mark.parametrize(
    ("expansion", "objective", "corrected"),
    [
        ("rbf", "ppgp", True),
        ("rbf", "elbo", True),
        ("rbf", "dppgp", False),
        ("rbf", "exact", False),
        ("silu", "ppgp", False),
        ("silu", "elbo", False),
    ],
)
def test_variance_correction_is_ppgp_and_elbo_with_the_rbf_basis(
    expansion: str, objective: str, corrected: bool
) -> None:
    hp = DBKHyperparameters(expansion=expansion, objective=objective)
    assert hp.variance_correction is corrected
    assert DBKRegressor(expansion=expansion, objective=objective).variance_correction is corrected
    assert LoopConfig.of(hp).variance_correction is corrected


def test_the_loop_config_is_built_from_the_hyperparameters() -> None:
    est = DBKRegressor(objective="elbo", batch_size=np.int64(64), lr=np.float32(0.5), seed=3)
    config = LoopConfig.of(est)
    assert config == LoopConfig(
        objective="elbo",
        alpha=0.1,
        beta=0.01,
        batch_size=64,
        epochs=400,
        lr=0.5,
        weight_decay=1e-2,
        patience=50,
        seed=3,
        variance_correction=True,
    )
    assert type(config.batch_size) is int and type(config.lr) is float  # cast from numpy
    changed = LoopConfig.of(DBKHyperparameters(), variance_correction=True, epochs=2)
    assert (changed.variance_correction, changed.epochs, changed.objective) == (True, 2, "dppgp")
    with pytest.raises(TypeError):
        LoopConfig(objective="dppgp")  # type: ignore[call-arg]  # no defaults of its own
    with pytest.raises(ValueError, match="objective must be one of"):
        LoopConfig.of(DBKHyperparameters(objective="sgd"))
    with pytest.raises(ValueError, match="batch_size and patience"):
        LoopConfig.of(DBKHyperparameters(batch_size=0))
