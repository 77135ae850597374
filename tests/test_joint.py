"""Joint posterior draws (geodbk.joint): the exact covariance against the dense reference."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from geodbk import DBKRegressor
from geodbk.joint import (
    JointSampler,
    LatentDraws,
    quantity_draws,
    quantity_parts,
    standard_normal_weights,
)
from geodbk.quantities import QuantityPrediction

SMALL: dict[str, Any] = {
    "rank": 12,
    "hidden": 8,
    "batch_size": 32,
    "epochs": 3,
    "device": "cpu",
    "seed": 0,
    "dtype": "float64",
}


def _data(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    y = 3.0 + 0.4 * np.sin(3 * x[:, 0]) + rng.normal(scale=0.1, size=n)
    return x, y


@pytest.fixture(scope="module", params=["dppgp", "ppgp"])
def fitted(request: pytest.FixtureRequest) -> DBKRegressor:
    x, y = _data()
    model = DBKRegressor(**SMALL, objective=request.param)
    return model.fit(x[:100], y[:100], x[100:], y[100:])


def _dense_covariance(model: DBKRegressor, x: np.ndarray) -> np.ndarray:
    """``y_sd² Phi L L' Phi'`` from the basis and q(w)'s factor directly (no folding)."""
    phi = model.features(x)
    L = model.model_.q.scale_tril().detach().to(torch.float64).numpy()
    A = phi @ L
    return model.y_std_**2 * A @ A.T


def test_exact_covariance_equals_the_dense_reference(fitted: DBKRegressor) -> None:
    x, _ = _data(25, seed=3)
    r = fitted.model_.rank
    draws = fitted.latent_draws(x, np.eye(r), chunk_size=7)  # eps = I: deviations = y_sd U B
    cov = draws.deviations @ draws.deviations.T
    np.testing.assert_allclose(cov, _dense_covariance(fitted, x), rtol=1e-9, atol=1e-12)
    pred = fitted.predict_dist(x, quantity="latent")
    np.testing.assert_allclose(draws.mean, pred.mean, rtol=1e-12)
    np.testing.assert_allclose(np.diag(cov) + draws.residual_var, pred.var_f, rtol=1e-9)
    if fitted.variance_correction:
        assert (draws.residual_var > 0).any()
    else:
        assert not draws.residual_var.any()


def test_sample_covariance_converges_and_chunks_share_the_weight_draws(
    fitted: DBKRegressor,
) -> None:
    x, _ = _data(6, seed=4)
    eps = standard_normal_weights(fitted.model_.rank, 40_000, rng=np.random.default_rng(1))
    sampler = JointSampler(fitted, eps)
    whole = sampler.draws(x)
    parts = [sampler.draws(x[:2]), sampler.draws(x[2:])]  # two calls, same weight draws
    np.testing.assert_allclose(
        np.vstack([p.deviations for p in parts]), whole.deviations, rtol=1e-10, atol=1e-14
    )
    exact = _dense_covariance(fitted, x)
    sample = np.cov(whole.deviations)
    scale = np.sqrt(np.outer(np.diag(exact), np.diag(exact)))
    assert np.abs(sample - exact).max() < 0.03 * scale.max()  # Monte Carlo error ~ 1/sqrt(S)


def test_eps_of_the_wrong_rank_is_refused(fitted: DBKRegressor) -> None:
    with pytest.raises(ValueError, match="rank"):
        JointSampler(fitted, np.zeros((fitted.model_.rank + 1, 3)))


def _prediction(quantity: str, var: np.ndarray, area_var: np.ndarray) -> QuantityPrediction:
    n = var.size
    zero = np.zeros(n)
    return QuantityPrediction(
        quantity=quantity,
        mean=np.arange(n, dtype=float),
        var=var,
        area_mean=zero,
        area_var=area_var,
        offset=zero,
        pull=zero,
        tile_var=var,
        noise_var=zero,
        seen=np.zeros(n, dtype=bool),
        tile_basis="tile effect",
    )


def test_quantity_parts_keep_each_place_s_variance() -> None:
    area_var = np.array([0.04, 0.04, 0.04, 0.0])
    resid = np.array([0.0, 0.01, 0.0, 0.0])
    tile_var = np.array([0.10, 0.10, 0.02, 0.05])  # the third: history shrank it below v_c
    a, ind = quantity_parts(_prediction("tile", tile_var, area_var), resid)
    v_c = area_var - resid
    np.testing.assert_allclose(a[:2] ** 2, 1.0)  # the GP's whole error, shared across places
    np.testing.assert_allclose(a[2] ** 2, 0.02 / 0.04)
    np.testing.assert_allclose(a**2 * v_c + ind, tile_var)
    assert (ind >= 0).all() and ind[2] == 0
    a, ind = quantity_parts(_prediction("area", area_var, area_var), resid)
    np.testing.assert_allclose(a, 1.0)
    np.testing.assert_allclose(ind, resid)


def test_quantity_draws_have_the_quantity_s_mean_variance_and_correlation() -> None:
    rng = np.random.default_rng(0)
    S = 100_000
    shared = rng.standard_normal(S)
    dev = np.vstack([0.2 * shared, 0.2 * shared])  # two places, fully correlated f
    latent = LatentDraws(mean=np.zeros(2), deviations=dev, residual_var=np.zeros(2))
    pred = _prediction("tile", np.array([0.05, 0.05]), np.array([0.04, 0.04]))
    q = quantity_draws(pred, latent, rng=rng)
    np.testing.assert_allclose(q.mean(axis=1), pred.mean, atol=0.005)
    np.testing.assert_allclose(q.var(axis=1), pred.var, rtol=0.02)
    corr = np.corrcoef(q)[0, 1]  # 0.04 shared out of 0.05
    assert abs(corr - 0.8) < 0.01


def test_truncated_factor_draws_keep_predict_dist_s_variance(fitted: DBKRegressor) -> None:
    core = fitted.model_
    L = core.q.scale_tril().detach().to(torch.float64)
    lam = torch.linalg.eigvalsh(L @ L.T).flip(0)
    rtol = float(lam[core.rank // 2]) * float(core.basis.outputscale().detach())
    rtol = 1.0001 * rtol / core.min_noise_var()  # keeps about half the eigenpairs
    est = copy.copy(fitted)
    est._folded = core.fold(variance_correction=fitted.variance_correction, variance_rtol=rtol)
    assert est._folded.truncated
    x, _ = _data(25, seed=3)
    draws = est.latent_draws(x, np.eye(core.rank), chunk_size=7)
    pred = est.predict_dist(x, quantity="latent")
    cov = draws.deviations @ draws.deviations.T
    np.testing.assert_allclose(np.diag(cov) + draws.residual_var, pred.var_f, rtol=1e-9)
    exact = _dense_covariance(fitted, x)
    bound = fitted.y_std_**2 * est._folded.variance_bound
    assert np.all(np.diag(exact) - np.diag(cov) >= -1e-12)
    assert np.all(np.diag(exact) - np.diag(cov) <= bound)
