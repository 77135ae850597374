"""Noise floor per urban/rural class: s2_i = s2_floor(u_i) + s2_meas / tests_i^p (+ devices)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_noise import _dense_reference, _dppgp_reference

from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.geo.parquet_batches import fit_parquet
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.likelihoods import TestsNoise as _TestsNoise  # (not a test class)
from geodbk.likelihoods import inverse_softplus, noise_parameters
from geodbk.model import DBKModel
from geodbk.objectives import exact_marginal_log_likelihood
from geodbk.training import LoopConfig, batch_loss

DT = torch.float64


def _numpy_s2(noise: _TestsNoise, cov: np.ndarray) -> np.ndarray:
    """Direct float64 formula from the parameters; ``cov`` holds the columns of ``noise``."""
    sp = lambda v: float(torch.nn.functional.softplus(v.detach().double()))  # noqa: E731
    tests = np.maximum(cov[:, 0], 1.0)
    urban = cov[:, -1]
    floor = (1.0 - urban) * sp(noise.raw_floor) + urban * sp(noise.raw_floor_urban)
    p = sp(noise.raw_power) if noise.learn_power else 1.0
    s2 = noise.floor + floor + sp(noise.raw_meas) / tests**p
    if noise.devices:
        q = sp(noise.raw_power_devices) if noise.learn_power else 1.0
        s2 = s2 + sp(noise.raw_dev) / np.maximum(cov[:, 1], 1.0) ** q
    return s2


@pytest.mark.parametrize("devices", [False, True])
def test_urban_floor_formula(devices: bool) -> None:
    noise = _TestsNoise(init=0.4, learn_power=True, devices=devices, urban=True).double()
    assert noise.columns == ("tests", *(("devices",) if devices else ()), "urban")
    # both floors start at init / 2
    with torch.no_grad():
        assert float(noise.s2_floor_urban) == pytest.approx(float(noise.s2_floor), rel=1e-12)
        noise.raw_floor.fill_(inverse_softplus(0.3))
        noise.raw_floor_urban.fill_(inverse_softplus(0.02))
        noise.raw_power.fill_(inverse_softplus(0.8))
    tests = np.array([1.0, 2.0, 5.0, 40.0, 0.3, 3.0])
    urban = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    cols = [tests] + ([np.array([1.0, 2.0, 2.0, 9.0, 1.0, 4.0])] if devices else []) + [urban]
    cov = np.column_stack(cols)
    got = noise.variance(torch.tensor(cov, dtype=DT)).detach().numpy()
    np.testing.assert_allclose(got, _numpy_s2(noise, cov), rtol=1e-12)
    # many tests (from many devices) leave each class's own floor
    many = np.column_stack([np.full(2, 1e30)] * (2 if devices else 1) + [np.array([0.0, 1.0])])
    with torch.no_grad():
        left = noise.variance(torch.tensor(many, dtype=DT)).numpy()
    np.testing.assert_allclose(left, noise.floor + np.array([0.3, 0.02]), rtol=1e-9)
    # the class is required: None and a 1-D covariate are refused
    for bad in (None, torch.tensor(tests, dtype=DT)):
        with pytest.raises(ValueError, match="urban/rural"):
            noise.variance(bad)
    params = noise_parameters(noise, y_var=4.0)
    assert params["s2_floor"] == pytest.approx(4.0 * (noise.floor + 0.3))
    assert params["s2_floor_urban"] == pytest.approx(4.0 * (noise.floor + 0.02))
    # without urban=True the floor is shared and no urban parameter exists
    shared = _TestsNoise(init=0.4, devices=devices)
    assert "s2_floor_urban" not in noise_parameters(shared, y_var=1.0)
    assert not any("urban" in k for k in shared.state_dict())


def test_dppgp_and_exact_mll_use_the_class_floor() -> None:
    torch.manual_seed(0)
    model = DBKModel(
        2, rank=6, hidden=4, noise="tests+devices", noise_urban=True, noise_init=0.3
    ).double()
    with torch.no_grad():
        model.noise.raw_floor_urban.fill_(inverse_softplus(0.01))
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(32, 2, generator=gen, dtype=DT) * 2 - 1
    y = torch.randn(32, generator=gen, dtype=DT)
    counts = torch.randint(1, 20, (32, 2), generator=gen).double()
    urban = (torch.rand(32, generator=gen) < 0.5).double()
    cov = torch.column_stack([counts, urban])
    config = LoopConfig.of(DBKHyperparameters(objective="dppgp", alpha=0.7, beta=0.05))
    loss = batch_loss(model, x, y, n=500, config=config, tests=cov)
    s2 = torch.tensor(_numpy_s2(model.noise, cov.numpy()), dtype=DT)
    expect = _dppgp_reference(model, x, y, s2, alpha=0.7, beta=0.05, n=500)
    torch.testing.assert_close(loss, expect, rtol=1e-10, atol=1e-12)
    loss.backward()
    assert float(model.noise.raw_floor_urban.grad) != 0.0
    assert float(model.noise.raw_floor.grad) != 0.0
    # the weighted Woodbury marginal likelihood against the dense O(n^3) one
    phi = torch.randn(32, 5, generator=gen, dtype=DT)
    s2_t = model.noise.variance(cov)
    got = exact_marginal_log_likelihood(phi, y, s2_t, mean=0.1)
    ref = _dense_reference(phi, y, s2_t.detach(), 0.1)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=0)


def _class_data(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """Rural tiles 20x noisier at the floor: s2_i = (0.2 rural | 0.01 urban) + 0.3 / tests_i."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    f = np.sin(2.5 * x[:, 0]) + 0.5 * np.cos(3.0 * x[:, 1])
    tests = np.minimum(rng.geometric(0.1, size=n), 60).astype(np.float64)
    urban = rng.uniform(size=n) < 0.5
    y = f + rng.normal(size=n) * np.sqrt(np.where(urban, 0.01, 0.2) + 0.3 / tests)
    return x, y, tests, urban


SMALL = {"rank": 16, "hidden": 16, "batch_size": 128, "lr": 1e-2, "device": "cpu", "seed": 0}


def test_class_floor_recovers_the_floors_and_beats_a_shared_floor() -> None:
    x, y, t, u = _class_data(1500, seed=1)
    xv, yv, tv, uv = _class_data(500, seed=2)
    kw = {**SMALL, "epochs": 40, "patience": 40, "noise_init": 0.5, "noise": "tests"}
    by_class = DBKRegressor(noise_urban=True, **kw).fit(
        x, y, xv, yv, tests=t, tests_val=tv, urban=u, urban_val=uv
    )
    shared = DBKRegressor(**kw).fit(x, y, xv, yv, tests=t, tests_val=tv)
    best = lambda m: min(h["val_nll"] for h in m.history_)  # noqa: E731
    assert best(by_class) < best(shared) - 0.03
    p = by_class.noise_parameters()
    assert p["s2_floor"] > 5 * p["s2_floor_urban"]  # rural floor well above the urban one
    # the validation NLL recorded in training is that of predict(tests=, urban=)
    pred = by_class.predict_dist(xv, tests=tv, urban=uv)
    nll = np.mean(0.5 * np.log(2 * np.pi * pred.var) + (yv - pred.mean) ** 2 / (2 * pred.var))
    assert nll == pytest.approx(by_class.history_[by_class.best_epoch_ - 1]["val_nll"], rel=1e-4)
    # well-measured tiles: the class floor fixes the shared floor's urban/rural miscalibration
    many = tv >= 16

    def coverage(model: DBKRegressor, cls: np.ndarray) -> float:
        m = many & cls
        kw_pred = {"urban": uv[m]} if model.noise_urban else {}
        pr = model.predict_dist(xv[m], tests=tv[m], **kw_pred)
        return float(np.mean(np.abs(yv[m] - pr.mean) <= 1.96 * np.sqrt(pr.var)))

    assert coverage(shared, ~uv) < coverage(by_class, ~uv)
    assert coverage(shared, uv) > coverage(by_class, uv) or coverage(shared, uv) == 1.0


@pytest.fixture(scope="module")
def urban_fit() -> tuple[DBKRegressor, np.ndarray]:
    x, y, t, u = _class_data(300, seed=4)
    model = DBKRegressor(noise="tests+devices", noise_urban=True, epochs=2, **SMALL)
    fitted = model.fit(
        x, y, x[:50], y[:50], tests=t, tests_val=t[:50], devices=t, devices_val=t[:50],
        urban=u, urban_val=u[:50],
    )  # fmt: skip
    return fitted, x


def test_predict_and_noise_variance_by_class(urban_fit) -> None:
    model, x = urban_fit
    p = model.noise_parameters()
    assert set(p) >= {"s2_floor", "s2_floor_urban", "s2_meas", "s2_dev"}
    s2 = model.noise_variance([1.0, 4.0], [1.0, 2.0], urban=[False, True])
    expect = (
        np.array([p["s2_floor"], p["s2_floor_urban"]])
        + p["s2_meas"] / np.array([1.0, 4.0])
        + p["s2_dev"] / np.array([1.0, 2.0])
    )
    np.testing.assert_allclose(s2, expect, rtol=1e-5)
    # a scalar class broadcasts; tests=None is one test from one device
    np.testing.assert_allclose(
        model.noise_variance(urban=True, n=3), np.full(3, p["s2_floor_urban"] + p["s2_meas"]
        + p["s2_dev"]), rtol=1e-5,
    )  # fmt: skip
    rural = model.predict_dist(x[:5], tests=3, urban=False)
    town = model.predict_dist(x[:5], tests=3, urban=np.ones(5, dtype=bool))
    np.testing.assert_allclose(
        rural.var - town.var, np.full(5, p["s2_floor"] - p["s2_floor_urban"]), rtol=1e-4
    )
    # the latent quantity needs no class
    np.testing.assert_allclose(model.predict_dist(x[:5], quantity="latent").var, rural.var_f)


def test_class_floor_errors(urban_fit) -> None:
    model, x = urban_fit
    with pytest.raises(DataError, match="urban="):
        model.predict_dist(x[:3], tests=2)
    with pytest.raises(DataError, match="urban must be True/False"):
        model.predict_dist(x[:3], tests=2, urban=[0.0, 0.5, 1.0])
    with pytest.raises(DataError, match="urban has 2 values"):
        model.predict_dist(x[:3], urban=[True, False])
    xs, ys, ts, us = _class_data(40, seed=5)
    est = DBKRegressor(noise="tests", noise_urban=True, epochs=1, **SMALL)
    with pytest.raises(DataError, match=r"urban=\.\.\."):
        est.fit(xs, ys, tests=ts)
    with pytest.raises(DataError, match=r"urban_val=\.\.\."):
        est.fit(xs, ys, xs, ys, tests=ts, tests_val=ts, urban=us)
    with pytest.raises(DataError, match="urban_val must be True/False"):
        est.fit(xs, ys, xs, ys, tests=ts, tests_val=ts, urban=us, urban_val=np.full(40, np.nan))
    with pytest.raises(DataError, match="fit_parquet"):
        fit_parquet(est, "unused.parquet", y_column="y", tests_column="tests")
    with pytest.raises(ValueError, match="noise_urban"):
        DBKRegressor(noise="constant", noise_urban=True, epochs=1, **SMALL).fit(xs, ys)


def test_exact_objective_and_save_load(urban_fit, tmp_path) -> None:
    x, y, t, u = _class_data(200, seed=6)
    exact = DBKRegressor(
        noise="tests", noise_urban=True, objective="exact", epochs=3, dtype="float64", **SMALL
    )
    exact.fit(x, y, x[:40], y[:40], tests=t, tests_val=t[:40], urban=u, urban_val=u[:40])
    assert np.isfinite(exact.predict_dist(x[:5], tests=t[:5], urban=u[:5]).var).all()
    model, xs = urban_fit
    model.save(tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["config"]["noise_urban"] is True
    back = DBKRegressor.load(tmp_path / "m", device="cpu")
    assert back.noise_urban and back.noise_parameters() == pytest.approx(model.noise_parameters())
    np.testing.assert_allclose(
        back.predict_dist(xs[:5], tests=3, urban=True).var,
        model.predict_dist(xs[:5], tests=3, urban=True).var,
    )
