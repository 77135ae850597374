"""DBKRegressor.predict_change: the latent change f(b) - f(a) against a dense float64 reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from geodbk import DBKRegressor
from geodbk.errors import DataError

SMALL: dict[str, Any] = {
    "rank": 12,
    "hidden": 8,
    "batch_size": 32,
    "epochs": 3,
    "device": "cpu",
    "seed": 0,
    "dtype": "float64",
}


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 3))  # [x1, x2, t]
    y = 4.0 + 0.5 * np.sin(3 * x[:, 0]) + 0.3 * x[:, 2] + 0.1 * rng.standard_normal(n)
    return x, y


@pytest.fixture(scope="module", params=["dppgp", "exact", "elbo"])
def fitted(request: pytest.FixtureRequest) -> DBKRegressor:
    x, y = _data(150, 0)
    return DBKRegressor(objective=request.param, **SMALL).fit(x, y)


def _joint_cov(est: DBKRegressor, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, ...]:
    """Dense reference: mean of [f(A); f(B)] and its (2n, 2n) posterior covariance (y units).

    ``Cov = Phi S Phi'`` with ``S = LL'`` (q(w)), plus the residual ``K~ - Phi Phi'`` of the
    base kernel for the variance-corrected objectives.
    """
    model = est.model_
    X = np.vstack([A, B])
    phi = est.features(X)
    with torch.no_grad():
        m = model.q.mean.detach().double().numpy()
        L = model.q.scale_tril().detach().double().numpy()
        c = float(model.const_mean)
        cov = phi @ (L @ L.T) @ phi.T
        if est.variance_correction:
            g = model.backbone(torch.as_tensor(X, dtype=torch.float64))
            kernel = model.basis.kernel(g, g).double().numpy()
            cov = cov + kernel - phi @ phi.T
    mean = est.y_mean_ + est.y_std_ * (phi @ m + c)
    return mean, cov * est.y_std_**2


def test_change_matches_dense_joint_posterior(fitted: DBKRegressor) -> None:
    A, _ = _data(25, 1)
    B = A.copy()
    B[:, 2] = np.clip(A[:, 2] + 0.7, -1, 1.5)  # same place, a later time
    B[::5] = _data(5, 2)[0]  # and a few unrelated pairs
    n = len(A)
    mean, cov = _joint_cov(fitted, A, B)
    want_mean = mean[n:] - mean[:n]
    idx = np.arange(n)
    want_var = cov[idx, idx] + cov[n + idx, n + idx] - 2 * cov[idx, n + idx]
    got_mean, got_var = fitted.predict_change(A, B, chunk_size=7)
    assert got_mean.shape == (n,) and got_var.dtype == np.float64
    np.testing.assert_allclose(got_mean, want_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got_var, want_var, rtol=1e-8, atol=1e-12)
    assert np.all(got_var > 0)

    # var(f(a) - f(b)) = var_f(a) + var_f(b) - 2 cov(a, b), with var_f from predict()
    vf_a = fitted.predict_dist(A, quantity="latent").var_f
    vf_b = fitted.predict_dist(B, quantity="latent").var_f
    np.testing.assert_allclose(vf_a, cov[idx, idx], rtol=1e-8)
    np.testing.assert_allclose(got_var, vf_a + vf_b - 2 * cov[idx, n + idx], rtol=1e-8, atol=1e-12)
    # and the change's mean is the difference of the predictive means
    np.testing.assert_allclose(
        got_mean, fitted.predict_dist(B).mean - fitted.predict_dist(A).mean, rtol=1e-8, atol=1e-10
    )


def test_change_to_itself_is_zero(fitted: DBKRegressor) -> None:
    A, _ = _data(10, 3)
    mean, var = fitted.predict_change(A, A)
    assert np.all(mean == 0.0) and np.all(var == 0.0)
    # and reversing the pair flips the mean, keeps the variance
    B, _ = _data(10, 4)
    m1, v1 = fitted.predict_change(A, B)
    m2, v2 = fitted.predict_change(B, A)
    np.testing.assert_allclose(m1, -m2, rtol=1e-12)
    np.testing.assert_allclose(v1, v2, rtol=1e-10)


def test_change_rejects_mismatched_rows(fitted: DBKRegressor) -> None:
    A, _ = _data(10, 3)
    with pytest.raises(DataError, match="rows"):
        fitted.predict_change(A, A[:5])
    with pytest.raises(DataError, match="columns"):
        fitted.predict_change(A[:, :2], A[:, :2])


def test_change_survives_save_and_load(fitted: DBKRegressor, tmp_path: Any) -> None:
    A, _ = _data(8, 5)
    B, _ = _data(8, 6)
    fitted.save(tmp_path / "m")
    back = DBKRegressor.load(tmp_path / "m", device="cpu")
    for a, b in zip(fitted.predict_change(A, B), back.predict_change(A, B), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10)
