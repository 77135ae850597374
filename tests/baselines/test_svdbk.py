"""SVDBK and its exact variant (geodbk/baselines/svdbk.py; paper 001, methods.md §2).

* Paper 001's basis: shapes, which parameters get the weight decay, the Adam / AdamW choice,
  and that it trains on a tiny problem and predicts finite values (both variants).
* Exact variant against independent float64 references built from phi, y, c and s2 alone:
  001 eq. 12 in weight space (Lambda_hat = Phi'D^{-1}Phi + s2 I, D = diag(s2_hat / s2)), the
  dense n×n GP with the corrected kernel Phi Phi' + diag(c) + S (constant and tests-aware
  noise), and the loss -[log N(y; c, Phi Phi' + s2 I) - tr(C) / (2 s2)] / n. Mutation checks:
  with the Gram matrix, the projection Phi'S_hat^{-1}y or max_train ||phi||² scaled by 1.01 the
  comparison must fail.
* SVDBK against an independent float64 reference (issue 24) built from phi(x), m, L, c and s2
  alone: the loss (ELBO data term + KL / n + the trace term) and the predictive variance with
  the test-time correction s2 + max(0, max_train ||phi||² - ||phi(x)||²) (methods.md §2).
  Mutation checks: with the KL, the ELBO data term or max_train ||phi||² scaled by 1.01 the
  comparison must fail.
* Save/load round trips, option validation, the size refusal and the registry's presets.

Every factorisation in the exact variant's references is a Cholesky with jitter followed by
triangular solves.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from baseline_helpers import kl_gauss, region
from scipy.linalg import solve_triangular

import geodbk.baselines.svdbk as svdbk_module
from geodbk.backbone import ResidualMLP
from geodbk.baselines.base import ProblemTooLargeError
from geodbk.baselines.registry import FULL_BATCH, MODEL_NAMES, build_model
from geodbk.baselines.svdbk import (
    DirectBasis,
    PaperBasisNet,
    SVDBKExactModule,
    SVDBKExactRegressor,
    SVDBKModule,
    SVDBKOptions,
    SVDBKRegressor,
    svdbk_exact_loss,
    svdbk_loss,
)

#: A small module: r = 7, width 16.
TINY = SVDBKOptions(rank=7, hidden=16, jitter=1e-4, noise_init=0.1, seed=0)
JITTER = 1e-12  # relative to the smallest possible eigenvalue of the factorised matrix


def _chol(M: np.ndarray, floor: float) -> np.ndarray:
    """Lower Cholesky factor of the symmetric ``M + JITTER·floor·I``."""
    return np.linalg.cholesky(0.5 * (M + M.T) + JITTER * floor * np.eye(M.shape[0]))


def _lower(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    return solve_triangular(L, B, lower=True)


# ---------------------------------------------------------------------------------- basis
def test_paper_basis_outputs_r_functions_and_only_the_network_is_decayed() -> None:
    net = PaperBasisNet(3, 16, 7)
    x = torch.randn(11, 3)
    assert net(x).shape == (11, 7)
    assert [p.shape for p in net.parameters()] == [
        (16, 3),
        (16,),
        (16, 16),
        (16,),
        (7, 16),
        (7,),
    ]
    g = torch.randn(4, 7)
    assert DirectBasis()(g) is g and DirectBasis().prior_variance(g) is None
    for module in (
        SVDBKModule(3, replace(TINY, basis="paper")),
        SVDBKExactModule(3, replace(TINY, basis="paper")),
    ):
        assert module.features(x).shape == (11, 7)
        net_ids = {id(p) for p in module.network_parameters()}
        assert len(net_ids) == 6  # the whole tanh MLP, nothing else
        others = {id(p) for p in module.other_parameters()}
        assert not net_ids & others
        assert net_ids | others == {id(p) for p in module.parameters()}
    rbf = SVDBKExactModule(3, TINY)
    assert isinstance(rbf.network, ResidualMLP) and rbf.features(x).shape == (11, 7)


@pytest.mark.parametrize("cls", [SVDBKRegressor, SVDBKExactRegressor])
def test_the_optimizer_option_picks_adam_or_adamw_with_decay_on_the_network(cls) -> None:
    X, y = region(40, seed=0)
    kw = {"rank": 4, "hidden": 8, "epochs": 1, "batch_size": 40, "weight_decay": 1e-4}
    paper = cls(basis="paper", optimizer="adam", **kw).fit(X, y)
    opt = paper._optimizer(paper.module_)
    assert type(opt) is torch.optim.Adam
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert {id(p) for p in opt.param_groups[0]["params"]} == {
        id(p) for p in paper.module_.network_parameters()
    }
    tuned = cls(**kw).fit(X, y)  # the defaults: today's model
    assert (tuned.basis, tuned.optimizer) == ("rbf", "adamw")
    assert type(tuned._optimizer(tuned.module_)) is torch.optim.AdamW


@pytest.mark.parametrize("cls", [SVDBKRegressor, SVDBKExactRegressor])
@pytest.mark.parametrize(
    ("option", "match"),
    [({"basis": "mlp"}, "basis must be one of"), ({"optimizer": "sgd"}, "optimizer must be one")],
)
def test_bad_options_are_clear_errors(cls, option: dict, match: str) -> None:
    X, y = region(20, seed=0)
    with pytest.raises(ValueError, match=match):
        cls(rank=4, hidden=8, epochs=1, **option).fit(X, y)
    with pytest.raises(ValueError, match="basis must be one of"):
        SVDBKModule(2, replace(TINY, basis="mlp"))


@pytest.mark.parametrize("cls", [SVDBKRegressor, SVDBKExactRegressor])
def test_paper_basis_trains_on_a_tiny_problem_and_predicts_finite_values(cls) -> None:
    X, y = region(200, seed=5)
    est = cls(
        basis="paper",
        optimizer="adam",
        weight_decay=1e-4,
        rank=8,
        hidden=16,
        epochs=40,
        batch_size=64,
        lr=1e-2,
        noise_init=0.3,
    ).fit(X[:150], y[:150])
    losses = [h["train_loss"] for h in est.history_]
    assert losses[-1] < losses[0]
    pred = est.predict_dist(X[150:])
    assert np.isfinite(pred.mean).all() and np.isfinite(pred.var).all()
    assert (pred.var_f >= 0).all() and (pred.var > pred.var_f).all()
    assert np.mean((pred.mean - y[150:]) ** 2) < np.var(y[150:])
    assert est.features(X[:5]).shape == (5, 8)


# ---------------------------------------------------------------------------------- eq. 12
def _exact(noise: str = "constant", basis: str = "paper") -> tuple[SVDBKExactRegressor, dict]:
    X, y = region(50, seed=6)
    tests = np.arange(50) % 7 + 1.0
    est = SVDBKExactRegressor(
        basis=basis,
        optimizer="adam",
        rank=6,
        hidden=8,
        epochs=3,
        lr=1e-2,
        noise_init=0.05,
        dtype="float64",
        noise=noise,
    )
    est.fit(X, y, tests=tests if noise == "tests" else None)
    Xq = np.vstack([region(9, seed=7)[0], [[3.0, -3.0], [-4.0, 2.5]]])  # two far points
    return est, {"X": X, "y": y, "tests": tests, "Xq": Xq, "tests_q": np.arange(11) % 4 + 1.0}


def _parts(est: SVDBKExactRegressor, data: dict) -> dict:
    """phi on the training and query inputs, y in standardised units, c and the noise."""
    module = est.module_
    with torch.no_grad():
        c = float(module.const_mean)
        tests = torch.as_tensor(data["tests"]) if est.noise == "tests" else None
        tests_q = torch.as_tensor(data["tests_q"]) if est.noise == "tests" else None
        s2 = np.broadcast_to(module.noise_var(tests).numpy(), (len(data["X"]),))
        s2_q = np.broadcast_to(module.noise_var(tests_q).numpy(), (len(data["Xq"]),))
    return {
        "phi": est.features(data["X"]),
        "phi_q": est.features(data["Xq"]),
        "y": (data["y"] - est.y_mean_) / est.y_sd_,
        "c": c,
        "s2": np.array(s2, dtype=np.float64),
        "s2_q": np.array(s2_q, dtype=np.float64),
    }


def _eq12_reference(p: dict) -> tuple[np.ndarray, np.ndarray]:
    """001 eq. 12 as printed (scalar s2): D = diag(s2_hat / s2), Phi_hat = D^{-1/2} Phi,
    y_hat = D^{-1/2} (y - c), Lambda_hat = Phi'D^{-1}Phi + s2 I;
    mean = c + phi*'Lambda_hat^{-1} Phi_hat'y_hat, var = s2 ||Lambda_hat^{-1/2} phi*||² + s2_hat(x*),
    c(x) = max_{x' in X ∪ {x}} ||phi(x')||² - ||phi(x)||²."""
    phi, phi_q, s2 = p["phi"], p["phi_q"], float(p["s2"][0])
    k, k_q = (phi**2).sum(1), (phi_q**2).sum(1)
    D = (s2 + k.max() - k) / s2
    phi_hat = phi / np.sqrt(D)[:, None]
    y_hat = (p["y"] - p["c"]) / np.sqrt(D)
    Lam = phi.T @ (phi / D[:, None]) + s2 * np.eye(phi.shape[1])
    L = _chol(Lam, s2)
    mean = p["c"] + _lower(L, phi_q.T).T @ _lower(L, phi_hat.T @ y_hat)
    s2_hat_q = s2 + np.maximum(k.max(), k_q) - k_q
    var = s2 * (_lower(L, phi_q.T) ** 2).sum(0) + s2_hat_q
    return mean, var


def _dense_gp_reference(p: dict) -> tuple[np.ndarray, np.ndarray]:
    """The n×n GP with the corrected kernel: y ~ N(c, Phi Phi' + diag(c_i) + S), S = diag(s2_i);
    mean = c + K_*X K_hat^{-1}(y - c), var = ||phi*||² + c(x*) + s2(x*) - K_*X K_hat^{-1} K_X*."""
    phi, phi_q = p["phi"], p["phi_q"]
    k, k_q = (phi**2).sum(1), (phi_q**2).sum(1)
    K_hat = phi @ phi.T + np.diag(k.max() - k + p["s2"])
    L = _chol(K_hat, float(p["s2"].min()))
    A = _lower(L, phi @ phi_q.T)  # L^{-1} K_X*
    mean = p["c"] + A.T @ _lower(L, p["y"] - p["c"])
    var = k_q + np.maximum(k.max() - k_q, 0.0) + p["s2_q"] - (A**2).sum(0)
    return mean, var


def _compare(est: SVDBKExactRegressor, data: dict, reference) -> None:
    p = _parts(est, data)
    mean, var = reference(p)
    tests_q = data["tests_q"] if est.noise == "tests" else None
    pred = est.predict_dist(data["Xq"], tests=tests_q)
    np.testing.assert_allclose(pred.mean, est.y_mean_ + est.y_sd_ * mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(pred.var, est.y_sd_**2 * var, rtol=1e-8, atol=1e-12)


@pytest.fixture(scope="module")
def exact_paper() -> tuple[SVDBKExactRegressor, dict]:
    return _exact()


def test_exact_variant_matches_eq12_and_the_dense_corrected_gp(exact_paper) -> None:
    est, data = exact_paper
    _compare(est, data, _eq12_reference)
    _compare(est, data, _dense_gp_reference)
    # the correction is exercised: positive at a far query point
    p = _parts(est, data)
    k, k_q = (p["phi"] ** 2).sum(1), (p["phi_q"] ** 2).sum(1)
    assert (k.max() - k_q).max() > 1e-3 * k.max()


@pytest.mark.parametrize(("noise", "basis"), [("tests", "paper"), ("constant", "rbf")])
def test_exact_variant_matches_the_dense_gp_with_tests_noise_and_the_rbf_basis(
    noise: str, basis: str
) -> None:
    est, data = _exact(noise, basis)
    _compare(est, data, _dense_gp_reference)


def test_exact_loss_matches_the_dense_marginal_likelihood_minus_the_trace(exact_paper) -> None:
    est, data = exact_paper
    p = _parts(est, data)
    phi, r, s2 = p["phi"], p["y"] - p["c"], float(p["s2"][0])
    n = len(r)
    L = _chol(phi @ phi.T + s2 * np.eye(n), s2)
    alpha = _lower(L, r)
    log_p = -0.5 * alpha @ alpha - np.log(np.diag(L)).sum() - 0.5 * n * np.log(2 * np.pi)
    k = (phi**2).sum(1)
    ref = (-log_p + (k.max() - k).sum() / (2 * s2)) / n
    module = est.module_
    with torch.no_grad():
        loss = svdbk_exact_loss(
            torch.as_tensor(phi),
            torch.as_tensor(p["y"]),
            module.noise_var(None),
            module.const_mean,
        )
    assert float(loss) == pytest.approx(ref, rel=1e-9, abs=1e-10)


def _refresh(est: SVDBKExactRegressor, data: dict) -> None:
    with torch.no_grad():
        est._refresh(
            est.module_,
            torch.as_tensor(data["X"]),
            torch.as_tensor((data["y"] - est.y_mean_) / est.y_sd_),
        )


def test_eq12_reference_fails_when_a_factor_is_perturbed(
    exact_paper, monkeypatch: pytest.MonkeyPatch
) -> None:
    est, data = exact_paper
    stats = svdbk_module.accumulate_statistics

    def scaled(which: int):  # the Gram matrix (0) or the projection (1), scaled by 1.01
        def mutated(*args, **kwargs):
            parts = list(stats(*args, **kwargs))
            parts[which] = 1.01 * parts[which]
            return tuple(parts)

        return mutated

    mutations = {"gram": scaled(0), "proj": scaled(1)}
    for mutated in mutations.values():
        with monkeypatch.context() as mp:
            mp.setattr(svdbk_module, "accumulate_statistics", mutated)
            _refresh(est, data)
        with pytest.raises(AssertionError):
            _compare(est, data, _eq12_reference)
        _refresh(est, data)
        _compare(est, data, _eq12_reference)  # restored
    # max_train ||phi||² (the correction c(x) of the prediction)
    buffer = est.module_.max_phi_sq
    with torch.no_grad():
        buffer.mul_(1.01)
    with pytest.raises(AssertionError):
        _compare(est, data, _eq12_reference)
    _refresh(est, data)
    _compare(est, data, _eq12_reference)


# ---------------------------------------------------------------------------------- SVDBK reference
# Independent dense reference (issue 24): the loss (ELBO data term + KL / n + the trace term)
# and the predictive variance with the test-time correction s2 + max(0, max_train ||phi||² -
# ||phi(x)||²) (methods.md §2), from phi(x), m, L, c and s2 alone. Each comparison is also run
# with one factor perturbed (monkeypatched or scaled by 1.01) and must then fail.
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
    kl = kl_gauss(m, L @ L.T, np.zeros(len(m)), np.eye(len(m)))
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


# ---------------------------------------------------------------------------------- bundles
@pytest.mark.parametrize("cls", [SVDBKRegressor, SVDBKExactRegressor])
@pytest.mark.parametrize("basis", ["paper", "rbf"])
def test_save_load_round_trip_keeps_the_basis(cls, basis: str, tmp_path: Path) -> None:
    X, y = region(80, seed=2)
    est = cls(basis=basis, optimizer="adam", rank=5, hidden=8, epochs=2, batch_size=40)
    est.fit(X[:60], y[:60])
    pred = est.predict_dist(X[60:])
    again = cls.load(est.save(tmp_path / "m"))
    assert (again.basis, again.optimizer) == (basis, "adam")
    assert type(again.module_) is type(est.module_)
    pred2 = again.predict_dist(X[60:])
    np.testing.assert_allclose(pred2.mean, pred.mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(pred2.var, pred.var, rtol=1e-6, atol=1e-9)


def test_exact_variant_refuses_more_rows_than_max_n() -> None:
    X, y = region(30, seed=0)
    with pytest.raises(ProblemTooLargeError, match="max_n=20"):
        SVDBKExactRegressor(max_n=20, rank=4, hidden=8, epochs=1).fit(X, y)


# ---------------------------------------------------------------------------------- registry
def test_registry_builds_both_variants_with_both_presets() -> None:
    assert "svdbk-exact" in MODEL_NAMES and "svdbk-exact" in FULL_BATCH
    assert "svdbk" not in FULL_BATCH
    budget = {"epochs": 1, "batch_size": 256, "seed": 0, "rank": 8, "hidden": 16}
    for name, cls in (("svdbk", SVDBKRegressor), ("svdbk-exact", SVDBKExactRegressor)):
        paper = build_model(name, preset="paper", **budget)
        tuned = build_model(name, preset="tuned", **budget)
        assert type(paper) is cls and type(tuned) is cls
        p, t = paper.get_params(), tuned.get_params()
        assert (p["basis"], p["optimizer"], p["weight_decay"]) == ("paper", "adam", 1e-4)
        assert (p["lr"], p["noise_init"]) == (1e-3, 1e-2)
        assert (t["basis"], t["optimizer"], t["weight_decay"]) == ("rbf", "adamw", 1e-2)
        assert t["noise_init"] == 0.5
        assert p["rank"] == t["rank"] == 8 and p["hidden"] == t["hidden"] == 16
