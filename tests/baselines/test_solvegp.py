"""SOLVE-GP (geodbk/baselines/solvegp.py; paper 003, methods.md §4) against dense float64
formulas on small data, each able to fail.

* Independent dense reference (issue 24): K_uu and C_vv = K_OO - K_OZ K_ZZ^{-1} K_ZO are built
  here from the Matérn-3/2 kernel in numpy (not from the model's factors); the predictive mean,
  latent variance and ELBO follow methods.md §4 (003 eqs. 31, 33–36). Whitened ARD model (tuned
  preset): q(u~), q(v~) are unwhitened with the Cholesky factors of *these* matrices.
  Unwhitened model with one lengthscale (paper preset): q(u), q(v) are used as they are. A
  wrong C_vv in the model would no longer cancel. Every comparison is also run with one factor
  of C_vv or K_uu perturbed (monkeypatched, scaled by 1.01) and must then fail: the mutation
  checks. The unwhitened model starts at the priors q(u) = N(0, K_uu), q(v) = N(0, C_vv).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from baseline_helpers import kl_gauss, region

from geodbk.baselines.kernels import psd_cholesky, tri_solve
from geodbk.baselines.solvegp import SolveGPModule, SolveGPRegressor, solvegp_loss

JITTER = 1e-6  # SolveGPModule.factors: relative jitter 1e-6 on K_uu (mean diagonal) and C_vv


def _matern32(A: np.ndarray, B: np.ndarray, ls: np.ndarray, os2: float) -> np.ndarray:
    r = np.sqrt(np.maximum((((A[:, None, :] - B[None, :, :]) / ls) ** 2).sum(-1), 0.0))
    return os2 * (1.0 + math.sqrt(3.0) * r) * np.exp(-math.sqrt(3.0) * r)


# ---------------------------------------------------------------------------------- reference
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
    kl = kl_gauss(mu_u, Su, np.zeros(len(Z)), Kuu) + kl_gauss(mu_v, Sv, np.zeros(len(Ov)), Cvv)
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
