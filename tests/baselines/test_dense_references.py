"""Independent dense references (issue 24), float64 on small data, each able to fail.

* SOLVE-GP: K_uu and C_vv = K_OO - K_OZ K_ZZ^{-1} K_ZO are built here from the Matérn-3/2
  kernel in numpy (not from the model's factors); the predictive mean, latent variance and
  ELBO follow methods.md §4 (003 eqs. 31, 33–36). Whitened ARD model (tuned preset): q(u~),
  q(v~) are unwhitened with the Cholesky factors of *these* matrices. Unwhitened model with
  one lengthscale (paper preset): q(u), q(v) are used as they are. A wrong C_vv in the model
  would no longer cancel.
* SVDBK: the loss (ELBO data term + KL / n + the trace term) and the predictive variance with
  the test-time correction s2 + max(0, max_train ||phi||² - ||phi(x)||²) (methods.md §2),
  from phi(x), m, L, c and s2 alone.

Every comparison is also run with one factor of the formula perturbed (monkeypatched, scaled
by 1.01) and must then fail: the mutation checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from baseline_helpers import region

import geodbk.baselines.svdbk as svdbk_module
from geodbk.baselines.kernels import psd_cholesky, tri_solve
from geodbk.baselines.solvegp import SolveGPModule, SolveGPRegressor, solvegp_loss
from geodbk.baselines.svdbk import SVDBKRegressor, svdbk_loss

JITTER = 1e-6  # SolveGPModule.factors: relative jitter 1e-6 on K_uu (mean diagonal) and C_vv


def _matern32(A: np.ndarray, B: np.ndarray, ls: np.ndarray, os2: float) -> np.ndarray:
    r = np.sqrt(np.maximum((((A[:, None, :] - B[None, :, :]) / ls) ** 2).sum(-1), 0.0))
    return os2 * (1.0 + math.sqrt(3.0) * r) * np.exp(-math.sqrt(3.0) * r)


def _kl_std(m: np.ndarray, S: np.ndarray, m0: np.ndarray, S0: np.ndarray) -> float:
    """KL(N(m, S) || N(m0, S0)), dense."""
    diff = m - m0
    return 0.5 * (
        np.trace(np.linalg.solve(S0, S))
        + diff @ np.linalg.solve(S0, diff)
        - len(m)
        + np.linalg.slogdet(S0)[1]
        - np.linalg.slogdet(S)[1]
    )


# ---------------------------------------------------------------------------------- SOLVE-GP
#: (ard, whiten): the tuned preset's whitened ARD model and the paper preset's unwhitened model
#: with one shared lengthscale (003 App. G, App. D.1).
SOLVEGP_FORMS = [(True, True), (False, False)]


def _solvegp_module(*, ard: bool = True, whiten: bool = True) -> SolveGPModule:
    X, y = region(60, seed=3)
    est = SolveGPRegressor(
        num_inducing=6,
        num_orthogonal=5,
        epochs=1,
        batch_size=60,
        dtype="float64",
        ard=ard,
        whiten=whiten,
    ).fit(X, y)
    m = est.module_
    assert isinstance(m, SolveGPModule)
    assert m.lengthscale().shape == ((2,) if ard else (1,))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # random q away from the start (N(0, I), or the priors unwhitened)
        for q in (m.q_u, m.q_v):
            r = q.mean.shape[0]
            q.mean.copy_(torch.randn(r, generator=gen, dtype=torch.float64))
            noise = 0.2 * torch.randn(r, generator=gen, dtype=torch.float64)
            lower = 0.2 * torch.randn(r, r, generator=gen, dtype=torch.float64)
            if whiten:
                q.log_diag.copy_(-0.5 + noise)
                q.lower.copy_(lower)
            else:  # around the prior's Cholesky factor, kept well conditioned
                q.log_diag.add_(noise)
                q.lower.add_(0.5 * lower * torch.diagonal(q.scale_tril()).unsqueeze(-1))
    return m


def _solvegp_reference(
    m: SolveGPModule, Xq: np.ndarray, yq: np.ndarray, n_total: int, *, whiten: bool
) -> dict:
    """Mean, latent variance and -ELBO/n of SOLVE-GP from the kernel alone (methods.md §4;
    003 eqs. 31, 33–36).

    ``whiten=False``: q(u) = N(m_u, L_u L_u'), q(v) = N(m_v, L_v L_v') are the parameters as
    they are. ``whiten=True``: they are q(u~), q(v~), mapped by u = chol(K_uu) u~,
    v = chol(C_vv) v~ with the Cholesky factors of the matrices built here.
    """
    with torch.no_grad():
        Z, Ov = m.Z.double().numpy(), m.O.double().numpy()
        ls, os2 = m.lengthscale().double().numpy(), float(m.outputscale())
        mu_q, Lq_u = m.q_u.mean.double().numpy(), m.q_u.scale_tril().double().numpy()
        mv_q, Lq_v = m.q_v.mean.double().numpy(), m.q_v.scale_tril().double().numpy()
        c0, s2 = float(m.mean_const), float(m.noise())

    def k(A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return _matern32(A, B, ls, os2)  # ls of shape (1,): one lengthscale for every input

    Kzz = k(Z, Z)
    Kuu = Kzz + JITTER * np.mean(np.diag(Kzz)) * np.eye(len(Z))
    # C_vv = K_OO - K_OZ K_ZZ^{-1} K_ZO, directly
    Cvv = k(Ov, Ov) - k(Ov, Z) @ np.linalg.solve(Kuu, k(Z, Ov)) + JITTER * os2 * np.eye(len(Ov))

    def c(A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return k(A, B) - k(A, Z) @ np.linalg.solve(Kuu, k(Z, B))

    if whiten:  # u = chol(K_uu) u~, v = chol(C_vv) v~ (Cholesky factors are unique)
        Lu, Lv = np.linalg.cholesky(Kuu), np.linalg.cholesky(Cvv)
        mu_u, Su = Lu @ mu_q, Lu @ Lq_u @ Lq_u.T @ Lu.T
        mu_v, Sv = Lv @ mv_q, Lv @ Lq_v @ Lq_v.T @ Lv.T
    else:
        mu_u, Su = mu_q, Lq_u @ Lq_u.T
        mu_v, Sv = mv_q, Lq_v @ Lq_v.T
    A = np.linalg.solve(Kuu, k(Z, Xq)).T  # k(x,Z) K_uu^{-1}
    B = np.linalg.solve(Cvv, c(Ov, Xq)).T  # c(x,O) C_vv^{-1}
    mean = c0 + A @ mu_u + B @ mu_v
    var = (
        np.einsum("ij,jk,ik->i", A, Su, A)
        + np.diag(c(Xq, Xq))
        + np.einsum("ij,jk,ik->i", B, Sv - Cvv, B)
    )
    kl = _kl_std(mu_u, Su, np.zeros(len(Z)), Kuu) + _kl_std(mu_v, Sv, np.zeros(len(Ov)), Cvv)
    exp_ll = -0.5 * np.log(2 * np.pi * s2) - ((yq - mean) ** 2 + var) / (2 * s2)
    return {"mean": mean, "var": var, "loss": -exp_ll.mean() + kl / n_total}


def _solvegp_compare(m: SolveGPModule, *, whiten: bool) -> None:
    """The model against the reference for parameters of the given form (``whiten``)."""
    Xq = region(9, seed=8)[0]
    yq = np.sin(3 * Xq[:, 0])
    ref = _solvegp_reference(m, Xq, yq, 200, whiten=whiten)
    Xt, yt = torch.as_tensor(Xq), torch.as_tensor(yq)
    with torch.no_grad():
        mean, var = m.latent(Xt)
        loss = float(solvegp_loss(m, Xt, yt, 200))
    np.testing.assert_allclose(mean.numpy(), ref["mean"], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(var.numpy(), ref["var"], rtol=1e-6, atol=1e-9)
    assert loss == pytest.approx(ref["loss"], rel=1e-7, abs=1e-9)


@pytest.mark.parametrize(("ard", "whiten"), SOLVEGP_FORMS)
def test_solvegp_matches_an_independent_dense_reference(ard: bool, whiten: bool) -> None:
    _solvegp_compare(_solvegp_module(ard=ard, whiten=whiten), whiten=whiten)


def _perturbed_factors(
    kuu_scale: float = 1.0, proj_scale: float = 1.0, koo_scale: float = 1.0
) -> Callable[[SolveGPModule], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """SolveGPModule.factors with one term of K_uu or C_vv = K_OO - K_OZ K_ZZ^{-1} K_ZO scaled."""

    def factors(self: SolveGPModule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Luu = psd_cholesky(kuu_scale * self._k64(self.Z, self.Z), jitter=1e-6)
        aO = tri_solve(Luu, self._k64(self.Z, self.O))
        Cvv = koo_scale * self._k64(self.O, self.O) - proj_scale * (aO.T @ aO)
        Lvv = psd_cholesky(Cvv, jitter=1e-6, scale=self.outputscale())
        return Luu, aO, Lvv

    return factors


@pytest.mark.parametrize(("ard", "whiten"), SOLVEGP_FORMS)
@pytest.mark.parametrize(
    "mutation",
    [
        {"proj_scale": 1.01},  # the K_OZ K_ZZ^{-1} K_ZO term of C_vv
        {"koo_scale": 1.01},  # the K_OO term of C_vv
        {"kuu_scale": 1.01},  # K_uu
    ],
)
def test_solvegp_reference_fails_when_a_factor_is_perturbed(
    mutation: dict[str, float], ard: bool, whiten: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _solvegp_module(ard=ard, whiten=whiten)
    _solvegp_compare(m, whiten=whiten)  # unperturbed: passes
    monkeypatch.setattr(SolveGPModule, "factors", _perturbed_factors(**mutation))
    with pytest.raises(AssertionError):
        _solvegp_compare(m, whiten=whiten)


def test_unwhitened_solvegp_fails_the_reference_when_read_as_whitened() -> None:
    """The same (m, L) taken as q(u~), q(v~) instead of q(u), q(v): the reference must fail."""
    m = _solvegp_module(ard=False, whiten=False)
    _solvegp_compare(m, whiten=False)
    m.whiten = True  # the model now reads its (m, L) as whitened; the reference does not
    with pytest.raises(AssertionError):
        _solvegp_compare(m, whiten=False)


def test_unwhitened_solvegp_starts_at_the_priors() -> None:
    """003 App. G: q(u) = N(0, K_uu), q(v) = N(0, C_vv) before training (K_uu, C_vv built
    here), so both KLs are 0."""
    X, y = region(60, seed=3)
    est = SolveGPRegressor(
        num_inducing=6, num_orthogonal=5, epochs=0, dtype="float64", ard=False, whiten=False
    ).fit(X, y)
    m = est.module_
    with torch.no_grad():
        Z, Ov = m.Z.numpy(), m.O.numpy()
        ls, os2 = m.lengthscale().numpy(), float(m.outputscale())
        Lq_u, Lq_v = m.q_u.scale_tril().numpy(), m.q_v.scale_tril().numpy()
        kl = float(m.kl())
    Kzz = _matern32(Z, Z, ls, os2)
    Kuu = Kzz + JITTER * np.mean(np.diag(Kzz)) * np.eye(len(Z))
    Kou = _matern32(Ov, Z, ls, os2)
    Cvv = _matern32(Ov, Ov, ls, os2) - Kou @ np.linalg.solve(Kuu, Kou.T)
    Cvv += JITTER * os2 * np.eye(len(Ov))
    assert not m.q_u.mean.any() and not m.q_v.mean.any()
    np.testing.assert_allclose(Lq_u @ Lq_u.T, Kuu, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(Lq_v @ Lq_v.T, Cvv, rtol=1e-7, atol=1e-12)
    assert kl == pytest.approx(0.0, abs=1e-8)


# ---------------------------------------------------------------------------------- SVDBK
@pytest.fixture(scope="module")
def svdbk() -> tuple[SVDBKRegressor, np.ndarray, np.ndarray]:
    X, y = region(80, seed=4)
    est = SVDBKRegressor(
        rank=6, hidden=8, epochs=2, batch_size=40, dtype="float64", device="cpu", noise_init=0.05
    ).fit(X, y)
    module = est.module_
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # a random q(w) away from the start
        q = module.dbk.q
        r = q.mean.shape[0]
        q.mean.copy_(torch.randn(r, generator=gen, dtype=torch.float64))
        q.log_diag.copy_(-1.0 + 0.2 * torch.randn(r, generator=gen, dtype=torch.float64))
        q.lower.copy_(0.2 * torch.randn(r, r, generator=gen, dtype=torch.float64))
    return est, X, y


def _svdbk_parts(est: SVDBKRegressor) -> tuple[np.ndarray, np.ndarray, float, float]:
    q = est.module_.dbk.q
    with torch.no_grad():
        return (
            q.mean.double().numpy().copy(),
            q.scale_tril().double().numpy().copy(),
            float(est.module_.dbk.const_mean),
            float(est.module_.dbk.noise_var(None)),
        )


def _svdbk_loss_reference(phi: np.ndarray, y: np.ndarray, est: SVDBKRegressor, n: int) -> float:
    """methods.md §2 per datum: mean_B[-log N(y; c + m'phi, s2) + ||L'phi||²/(2 s2)] + KL/n
    + mean_B[(max_B ||phi||² - ||phi_i||²) / (2 s2)], KL = KL(N(m, LL') || N(0, I))."""
    m, L, c, s2 = _svdbk_parts(est)
    mu = c + phi @ m
    var_f = ((phi @ L) ** 2).sum(-1)
    phi_sq = (phi**2).sum(-1)
    data = 0.5 * np.log(2 * np.pi * s2) + (y - mu) ** 2 / (2 * s2) + var_f / (2 * s2)
    kl = _kl_std(m, L @ L.T, np.zeros(len(m)), np.eye(len(m)))
    trace = (phi_sq.max() - phi_sq) / (2 * s2)
    return float(data.mean() + kl / n + trace.mean())


def _svdbk_var_reference(
    phi_q: np.ndarray, phi_train: np.ndarray, est: SVDBKRegressor
) -> np.ndarray:
    """Predictive variance in y's units: y_sd² (||L'phi*||² + s2 + max(0, max_train ||phi||²
    - ||phi*||²))."""
    _, L, _, s2 = _svdbk_parts(est)
    correction = np.maximum((phi_train**2).sum(-1).max() - (phi_q**2).sum(-1), 0.0)
    return est.y_sd_**2 * (((phi_q @ L) ** 2).sum(-1) + s2 + correction)


def _svdbk_compare(est: SVDBKRegressor, X: np.ndarray, y: np.ndarray) -> None:
    Xb, yb = X[:30], (y[:30] - est.y_mean_) / est.y_sd_  # a batch, standardised units
    with torch.no_grad():
        phi_b = est.module_.dbk.features(torch.as_tensor(Xb)).numpy()
        loss = float(svdbk_loss(est.module_, torch.as_tensor(Xb), torch.as_tensor(yb), 80))
    assert loss == pytest.approx(_svdbk_loss_reference(phi_b, yb, est, 80), rel=1e-9, abs=1e-10)
    Xq = np.vstack([region(12, seed=9)[0], [[3.0, -3.0]]])  # one far point: correction > 0
    phi_q = est.features(Xq)
    phi_train = est.features(X)
    ref_var = _svdbk_var_reference(phi_q, phi_train, est)
    np.testing.assert_allclose(est.predict_dist(Xq).var, ref_var, rtol=1e-9, atol=1e-12)


def test_svdbk_loss_and_corrected_variance_match_a_dense_reference(svdbk) -> None:
    est, X, y = svdbk
    _svdbk_compare(est, X, y)
    # the correction is exercised: positive at some test point
    phi_q = est.features(np.array([[3.0, -3.0]]))
    assert (est.features(X) ** 2).sum(-1).max() - (phi_q**2).sum(-1).max() > 1e-6


def test_svdbk_reference_fails_when_a_factor_is_perturbed(
    svdbk, monkeypatch: pytest.MonkeyPatch
) -> None:
    est, X, y = svdbk
    _svdbk_compare(est, X, y)

    def kl_scaled(mp: pytest.MonkeyPatch) -> None:  # the KL term of the loss
        kl = svdbk_module.gaussian_kl_standard
        mp.setattr(svdbk_module, "gaussian_kl_standard", lambda m, L: 1.01 * kl(m, L))

    def data_scaled(mp: pytest.MonkeyPatch) -> None:  # the ELBO data term of the loss
        elbo = svdbk_module.elbo_loss
        mp.setattr(svdbk_module, "elbo_loss", lambda *a, **k: 1.01 * elbo(*a, **k))

    for mutate in (kl_scaled, data_scaled):
        with monkeypatch.context() as mp:
            mutate(mp)
            with pytest.raises(AssertionError):
                _svdbk_compare(est, X, y)
    # max_train ||phi||² of the test-time correction (a buffer, scaled in place and restored)
    buffer = est.module_.max_phi_sq
    saved = buffer.clone()
    try:
        with torch.no_grad():
            buffer.mul_(1.01)
        with pytest.raises(AssertionError):
            _svdbk_compare(est, X, y)
    finally:
        with torch.no_grad():
            buffer.copy_(saved)
    _svdbk_compare(est, X, y)  # restored
