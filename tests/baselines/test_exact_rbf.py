"""The exact RBF-ARD GP (geodbk/baselines/exact_rbf.py) against its dense O(n³) formulas
(float64), with constant noise s2 I and with the tests-aware D = diag(s2_i) (issue 9); the size
refusal; the paper preset's lengthscales start at sqrt(d) (000 App. B)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from baseline_helpers import (
    BUDGET,
    dense_s2,
    region,
    set_tests_noise,
    speed_test_counts,
    standardised,
)

from geodbk.baselines.base import ProblemTooLargeError
from geodbk.baselines.exact_rbf import ExactRBFModule, ExactRBFRegressor
from geodbk.baselines.registry import build_model


def test_exact_rbf_matches_dense_formula_and_refuses_large_n() -> None:
    X, y = region(50, seed=7)
    est = ExactRBFRegressor(epochs=3).fit(X, y)
    m = est.module_
    with torch.no_grad():
        Xt = torch.as_tensor(X)
        Xq = torch.as_tensor(region(6, seed=8)[0])
        K = m.k(Xt, Xt).numpy() + float(m.noise()) * np.eye(50)
        Kq = m.k(Xq, Xt).numpy()
        r = (y - est.y_mean_) / est.y_sd_ - float(m.mean_const)
        mean = float(m.mean_const) + Kq @ np.linalg.solve(K, r)
        var_f = float(m.outputscale()) - np.einsum("ij,ji->i", Kq, np.linalg.solve(K, Kq.T))
    pred = est.predict_dist(Xq.numpy())
    np.testing.assert_allclose(pred.mean, mean * est.y_sd_ + est.y_mean_, rtol=1e-8)
    np.testing.assert_allclose(pred.var_f, var_f * est.y_sd_**2, rtol=1e-6, atol=1e-10)
    with pytest.raises(ProblemTooLargeError, match="max_n=40"):
        ExactRBFRegressor(max_n=40, epochs=1).fit(X, y)


def test_exact_rbf_tests_noise_matches_dense_formula() -> None:
    """-log N(y; c, K + D) / n, mean c + k(x,X)(K + D)^{-1} r, var_f, var = var_f + s2(tests*)."""
    X, y = region(30, seed=11)
    tests = speed_test_counts(30, seed=11)
    est = ExactRBFRegressor(epochs=2, noise="tests").fit(X, y, tests=tests)
    m = est.module_
    set_tests_noise(m.noise)
    Xt, yt, Tt = torch.as_tensor(X), standardised(est, y), torch.as_tensor(tests)
    Xq, tq = region(7, seed=12)[0], speed_test_counts(7, seed=12)
    with torch.no_grad():
        loss = float(est._loss(m, Xt, yt, 30, Tt))  # also caches the solve used by predict
        K = m.k(Xt, Xt).numpy() + np.diag(dense_s2(tests))
        Kq = m.k(torch.as_tensor(Xq), Xt).numpy()
        r = yt.numpy() - float(m.mean_const)
        c, os_ = float(m.mean_const), float(m.outputscale())
    dense_nll = (
        0.5 * r @ np.linalg.solve(K, r) + 0.5 * np.linalg.slogdet(K)[1] + 15 * math.log(2 * math.pi)
    ) / 30
    assert loss == pytest.approx(dense_nll, rel=1e-9)
    mean = c + Kq @ np.linalg.solve(K, r)
    var_f = os_ - np.einsum("ij,ji->i", Kq, np.linalg.solve(K, Kq.T))
    sd = est.y_sd_
    pred = est.predict_dist(Xq, tests=tq)
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-8)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + dense_s2(tq)) * sd**2, rtol=1e-6)
    one = est.predict_dist(Xq)  # tests=None: a single speed test
    np.testing.assert_allclose(one.var, (var_f + dense_s2(np.ones(7))) * sd**2, rtol=1e-6)
    np.testing.assert_allclose(est.predict_dist(Xq, quantity="latent").var, pred.var_f)


@pytest.mark.parametrize("d", [1, 2, 5])
def test_exact_rbf_paper_preset_starts_the_lengthscales_at_sqrt_d(d: int) -> None:
    """000 App. B: l_j = sqrt(d) for every input j (the tuned preset: 0.3)."""
    rng = np.random.default_rng(d)
    X, y = rng.uniform(-1, 1, (40, d)), rng.standard_normal(40)
    for preset, expected in (("paper", math.sqrt(d)), ("tuned", 0.3)):
        est = build_model("exact-rbf", preset=preset, **{**BUDGET, "epochs": 0}).fit(X, y)
        assert est.initial_lengthscale(d) == pytest.approx(expected)
        module = est.module_
        assert isinstance(module, ExactRBFModule)
        with torch.no_grad():  # no optimiser step taken: the initial value
            ls = module.lengthscale().double().numpy()
        np.testing.assert_allclose(ls, np.full(d, expected), rtol=1e-6)  # raw made in float32
    with pytest.raises(ValueError, match="lengthscale_init"):
        build_model("exact-rbf", overrides={"lengthscale_init": "nope"}, **BUDGET).fit(X, y)
