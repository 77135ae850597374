"""Tests-aware observation noise: s2_i = s2_floor + s2_meas / tests_i^p (issue 9)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.likelihoods import TestsNoise
from geodbk.objectives import exact_marginal_log_likelihood, gaussian_kl_standard
from geodbk.posterior import exact_weight_posterior


def _dppgp_reference(model, x, y, s2, *, alpha, beta, n):
    """dPPGP loss written out from the model's outputs and a per-point ``s2`` (float64):
    mean NLL of N(y; mean, var_f + s2) + alpha * mean((max phi² - phi²) / (2 s2)) + beta/n KL."""
    out = model(x)
    var = out.var_f + s2
    nll = (0.5 * torch.log(2 * math.pi * var) + (y - out.mean) ** 2 / (2 * var)).mean()
    trace = ((out.phi_sq.max() - out.phi_sq) / (2 * s2)).mean()
    kl = gaussian_kl_standard(model.q.mean, model.q.scale_tril())
    return nll + alpha * trace + beta / n * kl


def _dense_reference(phi, y, s2, c):
    cov = phi @ phi.T + torch.diag(s2)
    dist = torch.distributions.MultivariateNormal(torch.full_like(y, c), covariance_matrix=cov)
    return dist.log_prob(y)


def test_weighted_exact_mml_and_posterior_match_dense_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    n, r = 60, 7
    phi = torch.randn(n, r, generator=gen, dtype=torch.float64)
    y = torch.randn(n, generator=gen, dtype=torch.float64)
    tests = torch.randint(1, 40, (n,), generator=gen).double()
    noise = TestsNoise(init=0.5, learn_power=True).double()
    with torch.no_grad():
        noise.raw_floor.fill_(-2.0)
        noise.raw_power.fill_(0.3)
    s2 = noise.variance(tests)
    c = 0.37
    got = exact_marginal_log_likelihood(phi, y, s2, mean=c)
    ref = _dense_reference(phi, y, s2.detach(), c)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    # gradients reach both noise terms and the power
    got.backward()
    for p in (noise.raw_floor, noise.raw_meas, noise.raw_power):
        assert p.grad is not None and torch.isfinite(p.grad) and float(p.grad) != 0.0
    # exact posterior of w: N(A^{-1} Phi'D^{-1}(y - c), A^{-1}), A = I + Phi'D^{-1}Phi
    s2d = s2.detach()
    post = exact_weight_posterior(phi, y, s2d, mean=c)
    a = torch.eye(r, dtype=torch.float64) + phi.T @ (phi / s2d[:, None])
    cov = torch.linalg.inv(a)
    torch.testing.assert_close(post.mean, cov @ (phi.T @ ((y - c) / s2d)), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(post.scale_tril @ post.scale_tril.T, cov, rtol=1e-9, atol=1e-10)


def _synthetic(n: int, *, s2_floor: float, s2_meas: float, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    f = np.sin(2.5 * x[:, 0]) + 0.5 * np.cos(3.0 * x[:, 1])
    tests = np.minimum(rng.geometric(0.25, size=n), 60).astype(np.float64)
    y = f + rng.normal(size=n) * np.sqrt(s2_floor + s2_meas / tests)
    return x, y, tests, f


def test_tests_aware_model_recovers_known_noise() -> None:
    s2_floor, s2_meas = 0.01, 0.16
    x, y, tests, _ = _synthetic(3000, s2_floor=s2_floor, s2_meas=s2_meas, seed=1)
    xv, yv, tv, _ = _synthetic(600, s2_floor=s2_floor, s2_meas=s2_meas, seed=2)
    model = DBKRegressor(
        rank=48,
        hidden=32,
        objective="exact",
        epochs=150,
        lr=5e-2,
        patience=150,
        dtype="float64",
        device="cpu",
        noise="tests",
        noise_init=0.2,
    )
    model.fit(x, y, xv, yv, tests=tests, tests_val=tv)
    params = model.noise_parameters()
    assert params["noise"] == "tests"
    assert params["s2_meas"] == pytest.approx(s2_meas, rel=0.2)
    assert params["s2_floor"] == pytest.approx(s2_floor, abs=0.01)
    # the tests-aware model beats a constant-noise fit on held-out NLL
    const = DBKRegressor(**{**model.get_params(), "noise": "constant"})
    const.fit(x, y, xv, yv)
    xt, yt, tt, _ = _synthetic(2000, s2_floor=s2_floor, s2_meas=s2_meas, seed=3)

    def nll(pred):
        return float(
            np.mean(0.5 * np.log(2 * np.pi * pred.var) + (yt - pred.mean) ** 2 / (2 * pred.var))
        )

    assert nll(model.predict_dist(xt, tests=tt)) < nll(const.predict_dist(xt)) - 0.05


@pytest.fixture(scope="module")
def small_fit():
    x, y, tests, _ = _synthetic(400, s2_floor=0.02, s2_meas=0.2, seed=4)
    model = DBKRegressor(
        rank=16, hidden=8, epochs=3, batch_size=128, device="cpu", noise="tests", seed=0
    )
    return model.fit(x, y, x[:50], y[:50], tests=tests, tests_val=tests[:50]), x


def test_predict_quantities(small_fit) -> None:
    model, x = small_fit
    one = model.predict_dist(x[:20])
    assert np.allclose(one.var, model.predict_dist(x[:20], tests=1).var)
    many = model.predict_dist(x[:20], tests=16)
    latent = model.predict_dist(x[:20], quantity="latent")
    assert np.allclose(one.mean, many.mean) and np.allclose(one.mean, latent.mean)
    assert np.allclose(latent.var, latent.var_f)
    assert (latent.var < many.var).all() and (many.var < one.var).all()
    per_point = model.predict_dist(x[:3], tests=np.array([1.0, 4.0, 16.0]))
    noise_part = per_point.var - per_point.var_f
    assert noise_part[0] > noise_part[1] > noise_part[2]
    p = model.noise_parameters()
    np.testing.assert_allclose(
        many.var - many.var_f, p["s2_floor"] + p["s2_meas"] / 16.0, rtol=1e-5
    )
    with pytest.raises(ValueError, match="quantity"):
        model.predict_dist(x[:2], quantity="median")
    with pytest.raises(DataError, match=">= 1"):
        model.predict_dist(x[:2], tests=0.5)


def test_fit_needs_tests_for_tests_noise() -> None:
    x, y, tests, _ = _synthetic(50, s2_floor=0.02, s2_meas=0.2, seed=5)
    with pytest.raises(DataError, match="tests"):
        DBKRegressor(rank=4, hidden=4, epochs=1, noise="tests", device="cpu").fit(x, y)
    with pytest.raises(ValueError, match="noise"):
        DBKRegressor(rank=4, hidden=4, epochs=1, noise="devices", device="cpu").fit(x, y)
    # constant noise ignores tests in fit and predict
    const = DBKRegressor(rank=4, hidden=4, epochs=1, device="cpu").fit(x, y, tests=tests)
    assert np.allclose(const.predict_dist(x[:5], tests=20).var, const.predict_dist(x[:5]).var)


def test_save_load_keeps_noise_and_old_bundles_load_constant(small_fit, tmp_path) -> None:
    model, x = small_fit
    model.save(tmp_path / "m")
    back = DBKRegressor.load(tmp_path / "m", device="cpu")
    assert back.noise == "tests" and back.tests_aware
    np.testing.assert_allclose(
        back.predict_dist(x[:5], tests=3).var, model.predict_dist(x[:5], tests=3).var
    )
    assert back.noise_parameters() == pytest.approx(model.noise_parameters())
    # a bundle written before the noise option and kernel_update_every: none in its config
    x2, y2, _, _ = _synthetic(60, s2_floor=0.02, s2_meas=0.2, seed=6)
    const = DBKRegressor(rank=4, hidden=4, epochs=1, device="cpu").fit(x2, y2)
    const.save(tmp_path / "old")
    doc = json.loads((tmp_path / "old" / "model.json").read_text())
    del doc["config"]["noise"], doc["config"]["noise_power"]
    del doc["config"]["kernel_update_every"]
    (tmp_path / "old" / "model.json").write_text(json.dumps(doc))
    old = DBKRegressor.load(tmp_path / "old", device="cpu")
    assert old.noise == "constant" and not old.tests_aware and old.kernel_update_every == 1
    np.testing.assert_allclose(old.predict_dist(x2[:4]).var, const.predict_dist(x2[:4]).var)
