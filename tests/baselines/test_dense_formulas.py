"""CaGP-Opt, SOLVE-GP, SoftKI and the exact RBF GP against their dense O(n³) formulas (float64),
with constant noise s2 I and with the tests-aware D = diag(s2_i) (issue 9)."""

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
from geodbk.likelihoods import TestsNoise as _TestsNoise  # (not a test class)
from geodbk.likelihoods import inverse_softplus


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
    pred = cagp.predict_dist(Xq)
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
    checks) is in tests/baselines/test_solvegp.py.
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
        kl = _kl_gauss(mu_u, Su, np.zeros(len(mu_u)), Kuu) + _kl_gauss(
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
    pred = est.predict_dist(Xq.numpy())
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
    pred = est.predict_dist(Xq.numpy())
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


# ---------------------------------------------------------------------------------- tests-aware
# noise="tests" (issue 9): s2_i = floor + s2_floor + s2_meas / tests_i with D = diag(s2_i) in
# place of s2 I. Each model is checked against its dense formula on ~30 points in float64, with
# the noise parameters set to distinct values (s2_floor = 0.05, s2_meas = 0.4).
S2_FLOOR, S2_MEAS = 0.05, 0.4


def _tests(n: int, *, seed: int) -> np.ndarray:
    """Test counts with many single-test rows (1..40)."""
    rng = np.random.default_rng(seed)
    return rng.choice([1.0, 1.0, 2.0, 3.0, 5.0, 12.0, 40.0], size=n)


def _dense_s2(tests: np.ndarray) -> np.ndarray:
    """s2_i = 1e-6 + S2_FLOOR + S2_MEAS / tests_i (the TestsNoise floor is 1e-6)."""
    return 1e-6 + S2_FLOOR + S2_MEAS / np.asarray(tests, dtype=np.float64)


def _set_tests_noise(noise: _TestsNoise) -> None:
    with torch.no_grad():
        noise.raw_floor.fill_(inverse_softplus(S2_FLOOR))
        noise.raw_meas.fill_(inverse_softplus(S2_MEAS))


def _std(est, y: np.ndarray) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.as_tensor((y - est.y_mean_) / est.y_sd_)


def test_exact_rbf_tests_noise_matches_dense_formula() -> None:
    """-log N(y; c, K + D) / n, mean c + k(x,X)(K + D)^{-1} r, var_f, var = var_f + s2(tests*)."""
    X, y = region(30, seed=11)
    tests = _tests(30, seed=11)
    est = ExactRBFRegressor(epochs=2, noise="tests").fit(X, y, tests=tests)
    m = est.module_
    _set_tests_noise(m.noise)
    Xt, yt, Tt = torch.as_tensor(X), _std(est, y), torch.as_tensor(tests)
    Xq, tq = region(7, seed=12)[0], _tests(7, seed=12)
    with torch.no_grad():
        loss = float(est._loss(m, Xt, yt, 30, Tt))  # also caches the solve used by predict
        K = m.k(Xt, Xt).numpy() + np.diag(_dense_s2(tests))
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
    np.testing.assert_allclose(pred.var, (var_f + _dense_s2(tq)) * sd**2, rtol=1e-6)
    one = est.predict_dist(Xq)  # tests=None: a single speed test
    np.testing.assert_allclose(one.var, (var_f + _dense_s2(np.ones(7))) * sd**2, rtol=1e-6)
    np.testing.assert_allclose(est.predict_dist(Xq, quantity="latent").var, pred.var_f)


def test_cagp_tests_noise_matches_dense_formula() -> None:
    """G = S'(K + D)S, C = S G^{-1} S'; -ELBO with E_q log N(y_j; f_j, s2_j) and the same KL."""
    X, y = region(37, seed=13)  # 5 actions of 8 rows: the last block is padded
    tests = _tests(37, seed=13)
    est = CaGPRegressor(n_actions=5, epochs=2, dtype="float64", lengthscale=0.5, noise="tests").fit(
        X, y, tests=tests
    )
    m = est.module_
    _set_tests_noise(m.noise)
    Tt = torch.as_tensor(tests)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        m.actions.add_(0.3 * torch.randn(m.actions.shape, generator=gen, dtype=torch.float64))
        est._refresh(m, None, None, Tt)  # type: ignore[arg-type]
        ours = cagp_terms(
            m, est._y_pad, chunk_elems=2**20, grad=False, tests_pad=est._tests_pad(m, Tt)
        )["loss"]
        Xs = torch.as_tensor(est.training_inputs())
        K = m.k(Xs, Xs).numpy()
        Kq_t = torch.as_tensor(region(9, seed=14)[0])
        Kq = m.k(Kq_t, Xs).numpy()
        c, os_ = float(m.mean_const), float(m.outputscale())
    s2 = _dense_s2(tests[morton_order(X)])  # D in the actions' (Morton) row order
    S = est.dense_actions()
    r = est._y_pad[:37].numpy() - c
    G = S.T @ (K + np.diag(s2)) @ S
    G += 1e-8 * np.mean(np.diag(G)) * np.eye(G.shape[0])  # the model's relative jitter
    C = S @ np.linalg.solve(G, S.T)
    mu, Sigma = K @ C @ r, K - K @ C @ K
    exp_loglik = (
        -0.5 * np.log(2 * math.pi * s2) - ((r - mu) ** 2 + np.diag(Sigma)) / (2 * s2)
    ).sum()
    dense = (-exp_loglik + _kl_gauss(mu, Sigma, np.zeros(37), K)) / 37
    assert float(ours) == pytest.approx(dense, rel=1e-7, abs=1e-9)
    tq = _tests(9, seed=14)
    pred = est.predict_dist(Kq_t.numpy(), tests=tq)
    mean = c + Kq @ C @ r
    var_f = os_ - np.einsum("ij,jk,ik->i", Kq, C, Kq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + _dense_s2(tq)) * sd**2, rtol=1e-7)


def test_solvegp_tests_noise_matches_dense_formula() -> None:
    """-ELBO / n = -mean_B[log N(y_i; mean_i, s2_i) - var_i / (2 s2_i)] + KL / n."""
    X, y = region(30, seed=15)
    tests = _tests(30, seed=15)
    est = SolveGPRegressor(
        num_inducing=6, num_orthogonal=5, epochs=1, batch_size=30, dtype="float64", noise="tests"
    ).fit(X, y, tests=tests)
    m = est.module_
    _set_tests_noise(m.noise)
    _solvegp_randomise(m, seed=2)
    Xq = torch.as_tensor(region(9, seed=16)[0])
    tq = _tests(9, seed=16)
    mean, var, kl = _solvegp_dense(m, Xq)
    yq = torch.sin(3 * Xq[:, 0])
    s2 = _dense_s2(tq)
    exp_ll = (-0.5 * np.log(2 * np.pi * s2) - ((yq.numpy() - mean) ** 2 + var) / (2 * s2)).mean()
    with torch.no_grad():
        ours = float(solvegp_loss(m, Xq, yq, 200, torch.as_tensor(tq)))
    assert ours == pytest.approx(-exp_ll + kl / 200, rel=1e-7, abs=1e-9)
    pred = est.predict_dist(Xq.numpy(), tests=tq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(pred.var, (var + s2) * sd**2, rtol=1e-6, atol=1e-8)


def test_softki_tests_noise_matches_dense_gp() -> None:
    """N(c, Phi Phi' + D): batch marginal likelihood and the posterior over all training rows."""
    X, y = region(30, seed=17)
    tests = _tests(30, seed=17)
    est = SoftKIRegressor(
        num_points=8, epochs=2, batch_size=15, dtype="float64", noise="tests"
    ).fit(X, y, tests=tests)
    m = est.module_
    _set_tests_noise(m.noise)
    Xt, yt, Tt = torch.as_tensor(X), _std(est, y), torch.as_tensor(tests)
    Xq, tq = region(11, seed=18)[0], _tests(11, seed=18)
    with torch.no_grad():
        est._refresh(m, Xt, yt, Tt)
        Phi = m.features(Xt).numpy()
        Phq = m.features(torch.as_tensor(Xq)).numpy()
        r = yt.numpy() - float(m.mean_const)
        nll = float(batch_marginal_nll(torch.as_tensor(Phi), torch.as_tensor(r), m.noise(Tt)))
    Khat = Phi @ Phi.T + np.diag(_dense_s2(tests))
    dense_nll = -torch.distributions.MultivariateNormal(
        torch.zeros(30, dtype=torch.float64), torch.as_tensor(Khat)
    ).log_prob(torch.as_tensor(r))
    assert nll == pytest.approx(float(dense_nll) / 30, rel=1e-9)
    Kq = Phq @ Phi.T
    mean = float(m.mean_const) + Kq @ np.linalg.solve(Khat, r)
    var_f = np.einsum("ij,ij->i", Phq, Phq) - np.einsum("ij,ji->i", Kq, np.linalg.solve(Khat, Kq.T))
    pred = est.predict_dist(Xq, tests=tq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + _dense_s2(tq)) * sd**2, rtol=1e-6)
