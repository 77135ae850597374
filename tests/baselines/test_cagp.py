"""CaGP-Opt (geodbk/baselines/cagp.py, paper 002).

* The learning-rate schedule: constant (tuned) or paper 002's LinearLR to 0.1·lr at the last
  epoch (preset "paper"), the learning-rate grid the benchmark sweeps, and save/load.
* Against the dense O(n³) formulas (float64): the predictive mean and variances, the loss as
  the negative ELBO of the dense posterior, the chunked kernel-times-actions products against
  the unchunked and dense ones, with constant noise s2 I and with the tests-aware
  D = diag(s2_i). The reference builds K in numpy and S from the action weights, and fails
  when the model's kernel, noise, actions or variance solve is perturbed (mutation checks).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as nn_f
from baseline_helpers import dense_s2, kl_gauss, region, set_tests_noise, speed_test_counts
from torch import nn

from geodbk.baselines import cagp as cagp_module
from geodbk.baselines.cagp import CaGPRegressor, cagp_terms
from geodbk.baselines.kernels import morton_order
from geodbk.baselines.registry import CAGP_LR_GRID, PAPER_PRESET, build_model


class _RecordingAdam(torch.optim.Adam):
    """Adam that records its learning rate at every step."""

    lrs: list[float]

    def step(self, closure: Any = None) -> Any:
        self.lrs.append(float(self.param_groups[0]["lr"]))
        return super().step(closure)


class _RecordingCaGP(CaGPRegressor):
    """CaGP whose optimiser records the learning rate of every step in ``lrs_``."""

    def _optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        opt = _RecordingAdam(module.parameters(), lr=self.lr)
        self.lrs_: list[float] = []
        opt.lrs = self.lrs_
        return opt


@pytest.mark.parametrize("epochs", [6, 2])
def test_linear_schedule_reaches_a_tenth_of_lr_at_the_last_epoch(epochs: int) -> None:
    X, y = region(40, seed=0)
    est = _RecordingCaGP(
        n_actions=4, epochs=epochs, lr=0.2, patience=None, lr_schedule="linear"
    ).fit(X, y)
    assert len(est.lrs_) == epochs  # full batch: one step per epoch
    expected = 0.2 * (1.0 - 0.9 * np.arange(epochs) / (epochs - 1))
    np.testing.assert_allclose(est.lrs_, expected, rtol=1e-12)
    assert est.lrs_[-1] == pytest.approx(0.02, rel=1e-12)
    constant = _RecordingCaGP(n_actions=4, epochs=epochs, lr=0.2, patience=None).fit(X, y)
    assert constant.lrs_ == [0.2] * epochs
    assert constant._scheduler(torch.optim.SGD([torch.zeros(1)], lr=1.0)) is None


def test_invalid_schedule_raises_and_the_schedule_round_trips(tmp_path: Path) -> None:
    X, y = region(30, seed=1)
    with pytest.raises(ValueError, match="lr_schedule"):
        CaGPRegressor(n_actions=4, epochs=1, lr_schedule="cosine").fit(X, y)
    est = CaGPRegressor(n_actions=4, epochs=3, lr_schedule="linear", dtype="float64").fit(X, y)
    est.save(tmp_path / "m")
    back = CaGPRegressor.load(tmp_path / "m")
    assert back.lr_schedule == "linear" and back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.predict(X[:5]), est.predict(X[:5]))


def test_registry_presets_and_lr_grid() -> None:
    """Paper: lr 0.1 (from the grid) with the linear schedule; tuned: lr 0.05, constant."""
    assert CAGP_LR_GRID == (1.0, 0.1, 0.01)
    assert PAPER_PRESET["cagp"]["lr"] in CAGP_LR_GRID
    X, y = region(30, seed=2)
    for preset, lr, schedule in (("paper", 0.1, "linear"), ("tuned", 0.05, "constant")):
        est = build_model("cagp", epochs=2, batch_size=32, seed=0, rank=4, preset=preset)
        assert isinstance(est, CaGPRegressor)
        assert (est.lr, est.lr_schedule) == (lr, schedule)
        pred = est.fit(X, y).predict_dist(X[:5])
        assert np.isfinite(pred.mean).all() and (pred.var > 0).all()


# ---------------------------------------------------------------------------------- dense formulas
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


def _matern32(A: np.ndarray, B: np.ndarray, ls: np.ndarray, os2: float) -> np.ndarray:
    """The Matérn-3/2 ARD kernel in numpy, independent of the model's kernel code."""
    z = math.sqrt(3.0) * np.sqrt((((A[:, None, :] - B[None, :, :]) / ls) ** 2).sum(-1))
    return os2 * (1.0 + z) * np.exp(-z)


def _cagp_dense(est: CaGPRegressor) -> dict[str, Any]:
    """K from ``_matern32``, S from the action weights (``_block_dense``), G and C = S G^{-1} S'."""
    module = est.module_
    n = module.n
    Xs = module.X[:n].detach().double().numpy()
    with torch.no_grad():
        ls, os2 = module.lengthscale().double().numpy(), float(module.outputscale())
        s2 = module.noise.floor + float(nn_f.softplus(module.noise.raw))
        c = float(module.mean_const)
    K = _matern32(Xs, Xs, ls, os2)
    S = _block_dense(est)[:n]
    r = est._y_pad[:n].numpy() - c
    G = S.T @ (K + s2 * np.eye(n)) @ S
    G += 1e-8 * np.mean(np.diag(G)) * np.eye(G.shape[0])  # the model's relative Cholesky jitter
    C = S @ np.linalg.solve(G, S.T)
    return {"K": K, "S": S, "C": C, "r": r, "s2": s2, "Xs": Xs, "ls": ls, "os2": os2, "c": c}


def _compare_cagp(est: CaGPRegressor) -> None:
    """Predictive mean and variances, and the loss as the negative ELBO of the dense posterior.

    mean = c + k(x,X) C r, var_f = s - k(x,X) C k(X,x), var = var_f + s2;
    -ELBO = -Σ E_q log N(y_j; f_j, s2) + KL(N(mu, K - KCK) || N(0, K)), mu = K C r.
    """
    est._refresh(est.module_, None, None)  # type: ignore[arg-type]
    d = _cagp_dense(est)
    K, C, r, s2 = d["K"], d["C"], d["r"], d["s2"]
    Xq, _ = region(11, seed=9)
    Kq = _matern32(Xq, d["Xs"], d["ls"], d["os2"])
    mean = d["c"] + Kq @ C @ r
    var_f = d["os2"] - np.einsum("ij,jk,ik->i", Kq, C, Kq)
    pred = est.predict_dist(Xq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + s2) * sd**2, rtol=1e-7, atol=1e-10)
    n = K.shape[0]
    mu = K @ C @ r
    Sigma = K - K @ C @ K
    exp_loglik = -0.5 * n * math.log(2 * math.pi * s2) - ((r - mu) ** 2 + np.diag(Sigma)).sum() / (
        2 * s2
    )
    dense = (-exp_loglik + kl_gauss(mu, Sigma, np.zeros(n), K)) / n
    with torch.no_grad():
        ours = cagp_terms(est.module_, est._y_pad, chunk_elems=2**20, grad=False)["loss"]
    assert float(ours) == pytest.approx(dense, rel=1e-7, abs=1e-9)


def test_cagp_matches_the_dense_posterior_and_elbo(cagp: CaGPRegressor) -> None:
    _compare_cagp(cagp)


def _scaled(fn: Any, factor: float) -> Any:
    return lambda *args, **kwargs: factor * fn(*args, **kwargs)


@pytest.mark.parametrize("factor", ["kernel", "noise", "actions", "variance solve"])
def test_cagp_reference_fails_when_a_factor_is_perturbed(
    factor: str, cagp: CaGPRegressor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation check: K, s2, some action weights or the variance's solve scaled in the model."""
    module = cagp.module_
    if factor == "kernel":
        monkeypatch.setattr(cagp_module, "matern32_ard", _scaled(cagp_module.matern32_ard, 1.01))
    elif factor == "noise":
        monkeypatch.setattr(module.noise, "forward", _scaled(module.noise.forward, 1.01))
    elif factor == "actions":  # one row of each block (a common scale of S cancels in C)
        bump = torch.ones_like(module.actions)
        bump[:, 0] = 1.01
        weights = module.weights
        monkeypatch.setattr(module, "weights", lambda: weights() * bump)
    else:
        monkeypatch.setattr(cagp_module, "tri_solve", _scaled(cagp_module.tri_solve, 1.01))
    with pytest.raises(AssertionError):
        _compare_cagp(cagp)
    monkeypatch.undo()
    _compare_cagp(cagp)  # the fixture is left as it was


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
    w = (module.actions * module.mask).detach().numpy()  # the weights, not via module.weights
    for j in range(module.i):
        S[j * module.block : (j + 1) * module.block, j] = w[j]
    return S


def test_cagp_tests_noise_matches_dense_formula() -> None:
    """G = S'(K + D)S, C = S G^{-1} S'; -ELBO with E_q log N(y_j; f_j, s2_j) and the same KL."""
    X, y = region(37, seed=13)  # 5 actions of 8 rows: the last block is padded
    tests = speed_test_counts(37, seed=13)
    est = CaGPRegressor(n_actions=5, epochs=2, dtype="float64", lengthscale=0.5, noise="tests").fit(
        X, y, tests=tests
    )
    m = est.module_
    set_tests_noise(m.noise)
    Tt = torch.as_tensor(tests)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        m.actions.add_(0.3 * torch.randn(m.actions.shape, generator=gen, dtype=torch.float64))
        est._refresh(m, None, None, Tt)  # type: ignore[arg-type]
        ours = cagp_terms(
            m, est._y_pad, chunk_elems=2**20, grad=False, tests_pad=est._tests_pad(m, Tt)
        )["loss"]
        Xs = m.X[:37].detach()  # the training inputs in the actions' (Morton) order
        ls = m.lengthscale().double().numpy()
        K = _matern32(Xs.numpy(), Xs.numpy(), ls, float(m.outputscale()))
        Kq_t = torch.as_tensor(region(9, seed=14)[0])
        Kq = _matern32(Kq_t.numpy(), Xs.numpy(), ls, float(m.outputscale()))
        c, os_ = float(m.mean_const), float(m.outputscale())
    s2 = dense_s2(tests[morton_order(X)])  # D in the actions' (Morton) row order
    S = _block_dense(est)[:37]
    r = est._y_pad[:37].numpy() - c
    G = S.T @ (K + np.diag(s2)) @ S
    G += 1e-8 * np.mean(np.diag(G)) * np.eye(G.shape[0])  # the model's relative jitter
    C = S @ np.linalg.solve(G, S.T)
    mu, Sigma = K @ C @ r, K - K @ C @ K
    exp_loglik = (
        -0.5 * np.log(2 * math.pi * s2) - ((r - mu) ** 2 + np.diag(Sigma)) / (2 * s2)
    ).sum()
    dense = (-exp_loglik + kl_gauss(mu, Sigma, np.zeros(37), K)) / 37
    assert float(ours) == pytest.approx(dense, rel=1e-7, abs=1e-9)
    tq = speed_test_counts(9, seed=14)
    pred = est.predict_dist(Kq_t.numpy(), tests=tq)
    mean = c + Kq @ C @ r
    var_f = os_ - np.einsum("ij,jk,ik->i", Kq, C, Kq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + dense_s2(tq)) * sd**2, rtol=1e-7)
