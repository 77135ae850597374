"""SOLVE-GP (geodbk/baselines/solvegp.py; paper 003, methods.md §4) against dense float64
formulas on small data, each able to fail.

* Dense formulas (issue 9): the predictive mean, latent variance and ELBO of the whitened model
  against the unwhitened dense formulas with K_uu and C_vv from the model's own factors (so an
  error in C_vv would cancel), with constant noise s2 I and with the tests-aware
  D = diag(s2_i).
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
from baseline_helpers import dense_s2, kl_gauss, region, set_tests_noise, speed_test_counts

from geodbk.baselines.kernels import psd_cholesky, tri_solve
from geodbk.baselines.solvegp import SolveGPModule, SolveGPRegressor, solvegp_loss

JITTER = 1e-6  # SolveGPModule.factors: relative jitter 1e-6 on K_uu (mean diagonal) and C_vv


def _matern32(A: np.ndarray, B: np.ndarray, ls: np.ndarray, os2: float) -> np.ndarray:
    r = np.sqrt(np.maximum((((A[:, None, :] - B[None, :, :]) / ls) ** 2).sum(-1), 0.0))
    return os2 * (1.0 + math.sqrt(3.0) * r) * np.exp(-math.sqrt(3.0) * r)


# ---------------------------------------------------------------------------------- dense formulas
def _solvegp_randomise(m: torch.nn.Module, seed: int) -> None:
    """Random whitened q(u~), q(v~) so that the dense check is not at the N(0, I) start."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for q in (m.q_u, m.q_v):
            r = q.mean.shape[0]
            q.mean.copy_(torch.randn(r, generator=gen, dtype=torch.float64))
            q.log_diag.copy_(-0.5 + 0.2 * torch.randn(r, generator=gen, dtype=torch.float64))
            q.lower.copy_(0.2 * torch.randn(r, r, generator=gen, dtype=torch.float64))


def _solvegp_dense(m: torch.nn.Module, Xq: torch.Tensor) -> tuple[np.ndarray, np.ndarray, float]:
    """Unwhitened dense SOLVE-GP: predictive mean, latent variance and KL(q(u)||p) + KL(q(v)||p).

    mean = k(x,Z)Kuu^{-1}mu_u + c(x,O)Cvv^{-1}mu_v + c; var = k(x,Z)Kuu^{-1}S_uKuu^{-1}k(Z,x)
    + c(x,x) + c(x,O)Cvv^{-1}(S_v - Cvv)Cvv^{-1}c(O,x); KLs against N(0, Kuu) and N(0, Cvv).
    Kuu and Cvv come from the model's own factors here, so an error in Cvv would cancel; the
    independent reference (Cvv = K_OO - K_OZ K_ZZ^{-1} K_ZO built in numpy, with mutation
    checks) is test_solvegp_matches_an_independent_dense_reference below.
    """
    with torch.no_grad():
        Luu, _, Lvv = m.factors()
        Kuu = (Luu @ Luu.T).numpy()  # k(Z,Z) + jitter, the matrix the model factorises
        Cvv = (Lvv @ Lvv.T).numpy()
        Z, Orth = m.Z, m.O

        def k(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
            return m.k(a, b).numpy()

        def c(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
            return k(a, b) - k(a, Z) @ np.linalg.solve(Kuu, k(Z, b))

        Lu, Lv = (Luu.numpy(), Lvv.numpy())
        mu_u = Lu @ m.q_u.mean.numpy()
        Su = Lu @ m.q_u.scale_tril().numpy() @ m.q_u.scale_tril().numpy().T @ Lu.T
        mu_v = Lv @ m.q_v.mean.numpy()
        Sv = Lv @ m.q_v.scale_tril().numpy() @ m.q_v.scale_tril().numpy().T @ Lv.T
        A = np.linalg.solve(Kuu, k(Z, Xq)).T  # k(x,Z) Kuu^{-1}
        B = np.linalg.solve(Cvv, c(Orth, Xq)).T  # c(x,O) Cvv^{-1}
        mean = A @ mu_u + B @ mu_v + float(m.mean_const)
        var = (
            np.einsum("ij,jk,ik->i", A, Su, A)
            + np.diag(c(Xq, Xq))
            + np.einsum("ij,jk,ik->i", B, Sv - Cvv, B)
        )
        kl = kl_gauss(mu_u, Su, np.zeros(len(mu_u)), Kuu) + kl_gauss(
            mu_v, Sv, np.zeros(len(mu_v)), Cvv
        )
    return mean, var, kl


def test_solvegp_matches_unwhitened_dense_formulas() -> None:
    X, y = region(60, seed=3)
    est = SolveGPRegressor(
        num_inducing=6, num_orthogonal=5, epochs=1, batch_size=60, dtype="float64"
    ).fit(X, y)
    m = est.module_
    _solvegp_randomise(m, seed=1)
    Xq = torch.as_tensor(region(9, seed=8)[0])
    mean, var, kl = _solvegp_dense(m, Xq)
    with torch.no_grad():
        ours_mean, ours_var = m.latent(Xq)
        np.testing.assert_allclose(ours_mean.numpy(), mean, rtol=1e-8, atol=1e-8)
        np.testing.assert_allclose(ours_var.numpy(), var, rtol=1e-6, atol=1e-8)

        # ELBO with the unwhitened KLs against N(0, Kuu) and N(0, Cvv)
        yq = torch.sin(3 * Xq[:, 0])
        s2 = float(m.noise())
        n_total = 200
        exp_ll = (
            -0.5 * np.log(2 * np.pi * s2) - ((yq.numpy() - mean) ** 2 + var) / (2 * s2)
        ).mean()
        ours = float(solvegp_loss(m, Xq, yq, n_total))
        assert ours == pytest.approx(-exp_ll + kl / n_total, rel=1e-7, abs=1e-9)


def test_solvegp_tests_noise_matches_dense_formula() -> None:
    """-ELBO / n = -mean_B[log N(y_i; mean_i, s2_i) - var_i / (2 s2_i)] + KL / n."""
    X, y = region(30, seed=15)
    tests = speed_test_counts(30, seed=15)
    est = SolveGPRegressor(
        num_inducing=6, num_orthogonal=5, epochs=1, batch_size=30, dtype="float64", noise="tests"
    ).fit(X, y, tests=tests)
    m = est.module_
    set_tests_noise(m.noise)
    _solvegp_randomise(m, seed=2)
    Xq = torch.as_tensor(region(9, seed=16)[0])
    tq = speed_test_counts(9, seed=16)
    mean, var, kl = _solvegp_dense(m, Xq)
    yq = torch.sin(3 * Xq[:, 0])
    s2 = dense_s2(tq)
    exp_ll = (-0.5 * np.log(2 * np.pi * s2) - ((yq.numpy() - mean) ** 2 + var) / (2 * s2)).mean()
    with torch.no_grad():
        ours = float(solvegp_loss(m, Xq, yq, 200, torch.as_tensor(tq)))
    assert ours == pytest.approx(-exp_ll + kl / 200, rel=1e-7, abs=1e-9)
    pred = est.predict_dist(Xq.numpy(), tests=tq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(pred.var, (var + s2) * sd**2, rtol=1e-6, atol=1e-8)


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
