"""CaGP-Opt, SOLVE-GP, SoftKI and the exact RBF GP against their dense O(n³) formulas (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from baseline_helpers import region

from geodbk.baselines.base import ProblemTooLargeError
from geodbk.baselines.cagp import CaGPRegressor, cagp_terms
from geodbk.baselines.exact_rbf import ExactRBFRegressor
from geodbk.baselines.kernels import matern32_ard, morton_order
from geodbk.baselines.softki import SoftKIRegressor, batch_marginal_nll
from geodbk.baselines.solvegp import SolveGPRegressor, solvegp_loss


def _kl_gauss(m1: np.ndarray, S1: np.ndarray, m0: np.ndarray, S0: np.ndarray) -> float:
    """KL(N(m1, S1) || N(m0, S0)) by the dense formula."""
    n = m1.shape[0]
    solve = np.linalg.solve(S0, S1)
    diff = m1 - m0
    return 0.5 * (
        np.trace(solve)
        + diff @ np.linalg.solve(S0, diff)
        - n
        + np.linalg.slogdet(S0)[1]
        - np.linalg.slogdet(S1)[1]
    )


# ---------------------------------------------------------------------------------- CaGP
@pytest.fixture(scope="module")
def cagp() -> CaGPRegressor:
    X, y = region(37, seed=2)  # 37 rows, 5 actions of 8 rows: the last block is padded
    est = CaGPRegressor(n_actions=5, epochs=2, dtype="float64", lengthscale=0.5).fit(X, y)
    module = est.module_
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        module.actions.add_(
            0.3 * torch.randn(module.actions.shape, generator=gen, dtype=torch.float64)
        )
        est._refresh(module, None, None)  # type: ignore[arg-type]
    return est


def _cagp_dense(est: CaGPRegressor) -> dict[str, np.ndarray]:
    module = est.module_
    n = module.n
    Xs = torch.as_tensor(est.training_inputs())
    K = module.k(Xs, Xs).detach().numpy()
    s2 = float(module.noise().detach())
    S = est.dense_actions()
    r = est._y_pad[:n].numpy() - float(module.mean_const)
    G = S.T @ (K + s2 * np.eye(n)) @ S
    G += 1e-8 * np.mean(np.diag(G)) * np.eye(G.shape[0])  # the model's relative Cholesky jitter
    C = S @ np.linalg.solve(G, S.T)
    return {"K": K, "S": S, "C": C, "r": r, "s2": s2, "Xs": Xs.numpy()}


def test_cagp_predictive_matches_dense_formula(cagp: CaGPRegressor) -> None:
    d = _cagp_dense(cagp)
    module = cagp.module_
    Xq, _ = region(11, seed=9)
    Kq = module.k(torch.as_tensor(Xq), torch.as_tensor(d["Xs"])).detach().numpy()
    mean = float(module.mean_const) + Kq @ d["C"] @ d["r"]
    var_f = float(module.outputscale()) - np.einsum("ij,jk,ik->i", Kq, d["C"], Kq)
    pred = cagp.predict(Xq)
    sd = cagp.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + cagp.y_mean_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + d["s2"]) * sd**2, rtol=1e-7, atol=1e-10)


def test_cagp_loss_is_the_negative_elbo_of_the_dense_posterior(cagp: CaGPRegressor) -> None:
    """-ELBO = -Σ E_q log N(y_j; f_j, s2) + KL(N(mu, K - KCK) || N(0, K)) with dense matrices."""
    d = _cagp_dense(cagp)
    K, C, r, s2 = d["K"], d["C"], d["r"], d["s2"]
    n = K.shape[0]
    mu = K @ C @ r
    Sigma = K - K @ C @ K
    exp_loglik = -0.5 * n * math.log(2 * math.pi * s2) - ((r - mu) ** 2 + np.diag(Sigma)).sum() / (
        2 * s2
    )
    dense = (-exp_loglik + _kl_gauss(mu, Sigma, np.zeros(n), K)) / n
    with torch.no_grad():
        ours = cagp_terms(cagp.module_, cagp._y_pad, chunk_elems=2**20, grad=False)["loss"]
    assert float(ours) == pytest.approx(dense, rel=1e-7, abs=1e-9)


def test_cagp_chunked_products_match_unchunked_values_and_gradients(cagp: CaGPRegressor) -> None:
    module = cagp.module_
    X = module.X[: module.n]
    results = []
    for chunk in (7, 10_000):
        module.zero_grad()
        KS = module.kernel_times_actions(X, chunk_rows=chunk, grad=True)
        KS.pow(2).sum().backward()
        results.append(
            (KS.detach().clone(), module.actions.grad.clone(), module.lengthscale.raw.grad.clone())
        )
    for a, b in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # and against the dense product
    dense = module.k(X, module.X) @ torch.as_tensor(_block_dense(cagp))
    torch.testing.assert_close(results[0][0], dense.detach(), rtol=1e-10, atol=1e-12)


def _block_dense(est: CaGPRegressor) -> np.ndarray:
    module = est.module_
    S = np.zeros((module.i * module.block, module.i))
    w = module.weights().detach().numpy()
    for j in range(module.i):
        S[j * module.block : (j + 1) * module.block, j] = w[j]
    return S


def test_morton_order_is_deterministic_and_z_shaped() -> None:
    g = np.array([[x, y] for y in range(4) for x in range(4)], dtype=float)
    order = morton_order(g)
    assert [tuple(g[i]) for i in order[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (500, 2))
    np.testing.assert_array_equal(morton_order(X), morton_order(X.copy()))


# ---------------------------------------------------------------------------------- SOLVE-GP
def test_solvegp_matches_unwhitened_dense_formulas() -> None:
    X, y = region(60, seed=3)
    est = SolveGPRegressor(
        num_inducing=6, num_orthogonal=5, epochs=1, batch_size=60, dtype="float64"
    ).fit(X, y)
    m = est.module_
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for q in (m.q_u, m.q_v):
            r = q.mean.shape[0]
            q.mean.copy_(torch.randn(r, generator=gen, dtype=torch.float64))
            q.log_diag.copy_(-0.5 + 0.2 * torch.randn(r, generator=gen, dtype=torch.float64))
            q.lower.copy_(0.2 * torch.randn(r, r, generator=gen, dtype=torch.float64))
        Luu, _, Lvv = m.factors()
        Kuu = (Luu @ Luu.T).numpy()  # k(Z,Z) + jitter, the matrix the model factorises
        Cvv = (Lvv @ Lvv.T).numpy()
        Z, Orth = m.Z, m.O
        Xq = torch.as_tensor(region(9, seed=8)[0])

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
        kl = _kl_gauss(mu_u, Su, np.zeros(6), Kuu) + _kl_gauss(mu_v, Sv, np.zeros(5), Cvv)
        ours = float(solvegp_loss(m, Xq, yq, n_total))
        assert ours == pytest.approx(-exp_ll + kl / n_total, rel=1e-7, abs=1e-9)


# ---------------------------------------------------------------------------------- SoftKI
def test_softki_posterior_matches_dense_gp() -> None:
    X, y = region(80, seed=4)
    est = SoftKIRegressor(num_points=10, epochs=3, batch_size=40, dtype="float64").fit(X, y)
    m = est.module_
    with torch.no_grad():
        Xt = torch.as_tensor(X)
        Xq = torch.as_tensor(region(13, seed=5)[0])
        Phi = m.features(Xt).numpy()
        Phq = m.features(Xq).numpy()
        s2 = float(m.noise())
        r = (y - est.y_mean_) / est.y_sd_ - float(m.mean_const)
        Khat = Phi @ Phi.T + s2 * np.eye(80)
        Kq = Phq @ Phi.T
        mean = float(m.mean_const) + Kq @ np.linalg.solve(Khat, r)
        var_f = np.einsum("ij,ij->i", Phq, Phq) - np.einsum(
            "ij,ji->i", Kq, np.linalg.solve(Khat, Kq.T)
        )
        # the kernel is w(x)' Kzz w(x') with the soft weights
        W = m.weights(Xq).numpy()
        Kzz = (m.kzz_chol() @ m.kzz_chol().T).numpy()
        np.testing.assert_allclose(
            est.kernel(Xq.numpy(), Xq.numpy()), W @ Kzz @ W.T, rtol=1e-9, atol=1e-12
        )
        # batch marginal likelihood vs a dense multivariate normal
        nll = float(batch_marginal_nll(torch.as_tensor(Phi), torch.as_tensor(r), m.noise()))
        dense_nll = (
            -torch.distributions.MultivariateNormal(
                torch.zeros(80, dtype=torch.float64), torch.as_tensor(Khat)
            ).log_prob(torch.as_tensor(r))
            / 80
        )
        assert nll == pytest.approx(float(dense_nll), rel=1e-9)
    pred = est.predict(Xq.numpy())
    np.testing.assert_allclose(pred.mean, mean * est.y_sd_ + est.y_mean_, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * est.y_sd_**2, rtol=1e-6, atol=1e-10)


def test_softki_temperature_is_learned() -> None:
    X, y = region(200, seed=6)
    start = SoftKIRegressor(num_points=16, epochs=0, batch_size=50).fit(X, y)
    trained = SoftKIRegressor(num_points=16, epochs=5, batch_size=50).fit(X, y)
    t0 = float(start.module_.log_temperature.exp())
    t1 = float(trained.module_.log_temperature.exp())
    assert 0.0 < t0 < 0.5  # half the median nearest-neighbour spacing of the 16 points
    assert abs(t1 - t0) > 1e-4


# ---------------------------------------------------------------------------------- exact RBF
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
    pred = est.predict(Xq.numpy())
    np.testing.assert_allclose(pred.mean, mean * est.y_sd_ + est.y_mean_, rtol=1e-8)
    np.testing.assert_allclose(pred.var_f, var_f * est.y_sd_**2, rtol=1e-6, atol=1e-10)
    with pytest.raises(ProblemTooLargeError, match="max_n=40"):
        ExactRBFRegressor(max_n=40, epochs=1).fit(X, y)


def test_matern_kernel_matches_closed_form() -> None:
    a = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.3, -0.4]], dtype=torch.float64)
    ls = torch.tensor([0.5, 0.5], dtype=torch.float64)
    rho = 1.0  # ||(0.3, -0.4)|| / 0.5
    expected = 2.0 * (1 + math.sqrt(3) * rho) * math.exp(-math.sqrt(3) * rho)
    got = matern32_ard(a, b, lengthscale=ls, outputscale=torch.tensor(2.0, dtype=torch.float64))
    assert float(got) == pytest.approx(expected, rel=1e-12)
