"""The exact RBF-ARD GP (geodbk/baselines/exact_rbf.py) against its dense O(n³) formulas
(float64), with constant noise s2 I and with the tests-aware D = diag(s2_i) (issue 9); the size
refusal; the paper preset's lengthscales start at sqrt(d) (000 App. B). The reference builds
the kernel in numpy, and fails when the model's kernel, noise or variance solve is perturbed
(mutation checks)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as nn_f
from baseline_helpers import (
    BUDGET,
    dense_s2,
    region,
    set_tests_noise,
    speed_test_counts,
    standardised,
)

from geodbk.baselines import exact_rbf
from geodbk.baselines.base import ProblemTooLargeError
from geodbk.baselines.exact_rbf import ExactRBFModule, ExactRBFRegressor
from geodbk.baselines.registry import build_model


def _rbf(A: np.ndarray, B: np.ndarray, ls: np.ndarray, os2: float) -> np.ndarray:
    """The RBF-ARD kernel in numpy, independent of the model's kernel code."""
    return os2 * np.exp(-0.5 * (((A[:, None, :] - B[None, :, :]) / ls) ** 2).sum(-1))


def _compare_with_dense(est: ExactRBFRegressor, X: np.ndarray, y: np.ndarray, tests: Any) -> None:
    """The loss, mean, var_f and var against the dense float64 GP with K + D, K from ``_rbf``.

    -log N(y; c, K + D) / n, mean c + k(x,X)(K + D)^{-1} r, var_f = s - k(x,X)(K + D)^{-1}k(X,x),
    var = var_f + s2(tests*); D = diag(s2(tests)) (``tests=None``: the constant s2 of the noise
    module, read from its parameter).
    """
    m = est.module_
    n = len(y)
    Xq = region(7, seed=12)[0]
    tq = None if tests is None else speed_test_counts(7, seed=12)
    Xt, yt = torch.as_tensor(X), standardised(est, y)
    Tt = None if tests is None else torch.as_tensor(tests)
    with torch.no_grad():
        loss = float(est._loss(m, Xt, yt, n, Tt))  # also caches the solve used by predict
        ls, os2 = m.lengthscale().double().numpy(), float(m.outputscale())
        c = float(m.mean_const)
        s2_const = None if tests is not None else m.noise.floor + float(nn_f.softplus(m.noise.raw))
    s2 = (lambda t: dense_s2(t)) if tests is not None else (lambda t: np.full(len(t), s2_const))
    K = _rbf(X, X, ls, os2) + np.diag(s2(np.ones(n) if tests is None else tests))
    Kq = _rbf(Xq, X, ls, os2)
    r = yt.numpy() - c
    dense_nll = (
        0.5 * r @ np.linalg.solve(K, r)
        + 0.5 * np.linalg.slogdet(K)[1]
        + n / 2 * math.log(2 * math.pi)
    ) / n
    assert loss == pytest.approx(dense_nll, rel=1e-9)
    mean = c + Kq @ np.linalg.solve(K, r)
    var_f = os2 - np.einsum("ij,ji->i", Kq, np.linalg.solve(K, Kq.T))
    sd = est.y_sd_
    pred = est.predict_dist(Xq, tests=tq)
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-8)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-6, atol=1e-10)
    s2q = s2(np.ones(7) if tq is None else tq)
    np.testing.assert_allclose(pred.var, (var_f + s2q) * sd**2, rtol=1e-6)
    np.testing.assert_allclose(est.predict_dist(Xq, quantity="latent").var, pred.var_f)


@pytest.fixture(scope="module")
def exact_constant() -> tuple[ExactRBFRegressor, np.ndarray, np.ndarray]:
    X, y = region(50, seed=7)
    return ExactRBFRegressor(epochs=3).fit(X, y), X, y


@pytest.fixture(scope="module")
def exact_tests() -> tuple[ExactRBFRegressor, np.ndarray, np.ndarray, np.ndarray]:
    X, y = region(30, seed=11)
    tests = speed_test_counts(30, seed=11)
    est = ExactRBFRegressor(epochs=2, noise="tests").fit(X, y, tests=tests)
    set_tests_noise(est.module_.noise)
    return est, X, y, tests


def test_exact_rbf_matches_dense_formula_and_refuses_large_n(exact_constant) -> None:
    est, X, y = exact_constant
    _compare_with_dense(est, X, y, None)
    with pytest.raises(ProblemTooLargeError, match="max_n=40"):
        ExactRBFRegressor(max_n=40, epochs=1).fit(X, y)


def test_exact_rbf_tests_noise_matches_dense_formula(exact_tests) -> None:
    est, X, y, tests = exact_tests
    _compare_with_dense(est, X, y, tests)
    one = est.predict_dist(region(7, seed=12)[0])  # tests=None: a single speed test
    var_f = one.var_f / est.y_sd_**2
    np.testing.assert_allclose(one.var, (var_f + dense_s2(np.ones(7))) * est.y_sd_**2, rtol=1e-6)


def _scaled(fn: Any, factor: float) -> Any:
    return lambda *args, **kwargs: factor * fn(*args, **kwargs)


@pytest.mark.parametrize("noise", ["constant", "tests"])
@pytest.mark.parametrize("factor", ["kernel", "noise", "variance solve"])
def test_dense_reference_fails_when_a_factor_is_perturbed(
    factor: str, noise: str, exact_constant, exact_tests, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation check: K, D or the variance's triangular solve scaled by 1.01 in the model."""
    est, X, y, *rest = exact_constant if noise == "constant" else exact_tests
    tests = rest[0] if rest else None
    module = est.module_
    if factor == "kernel":
        monkeypatch.setattr(exact_rbf, "rbf_ard", _scaled(exact_rbf.rbf_ard, 1.01))
    elif factor == "noise":
        monkeypatch.setattr(module.noise, "forward", _scaled(module.noise.forward, 1.01))
    else:
        monkeypatch.setattr(exact_rbf, "tri_solve", _scaled(exact_rbf.tri_solve, 1.01))
    with pytest.raises(AssertionError):
        _compare_with_dense(est, X, y, tests)
    monkeypatch.undo()
    _compare_with_dense(est, X, y, tests)  # and the fixture is left as it was


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
