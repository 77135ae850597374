"""Second noise covariate: s2_i = s2_floor + s2_meas / tests_i^p + s2_dev / devices_i^q."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_noise import _dense_reference, _dppgp_reference

from geodbk import DBKRegressor
from geodbk.baselines.base import make_noise
from geodbk.baselines.registry import build_model
from geodbk.errors import DataError
from geodbk.geo.parquet_batches import fit_parquet
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.likelihoods import NOISE_MODELS, inverse_softplus, noise_parameters
from geodbk.likelihoods import TestsNoise as _TestsNoise  # (not a test class)
from geodbk.model import DBKModel
from geodbk.objectives import exact_marginal_log_likelihood
from geodbk.training import LoopConfig, batch_loss

DT = torch.float64


def _numpy_s2(noise: _TestsNoise, tests: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """Direct float64 formula from the noise's parameters."""
    sp = lambda v: float(torch.nn.functional.softplus(v.detach().double()))  # noqa: E731
    p = sp(noise.raw_power) if noise.learn_power else 1.0
    q = sp(noise.raw_power_devices) if noise.learn_power else 1.0
    return (
        noise.floor
        + sp(noise.raw_floor)
        + sp(noise.raw_meas) / np.maximum(tests, 1.0) ** p
        + sp(noise.raw_dev) / np.maximum(devices, 1.0) ** q
    )


@pytest.mark.parametrize("learn_power", [False, True])
def test_devices_noise_formula(learn_power: bool) -> None:
    assert "tests+devices" in NOISE_MODELS
    noise = _TestsNoise(init=0.4, learn_power=learn_power, devices=True).double()
    # initialisation: s2_floor = s2_meas = init / 2 (as "tests"), s2_dev = 0.25 init, p = q = 1
    with torch.no_grad():
        assert float(noise.s2_dev) == pytest.approx(0.1, rel=1e-6)
        assert float(noise.s2_meas) == pytest.approx(0.2 - 5e-7, rel=1e-6)
        assert float(noise.power) == pytest.approx(1.0, rel=1e-8)
        assert float(noise.power_devices) == pytest.approx(1.0, rel=1e-8)
    if learn_power:
        with torch.no_grad():
            noise.raw_power.fill_(inverse_softplus(0.7))
            noise.raw_power_devices.fill_(inverse_softplus(1.6))
    tests = np.array([1.0, 2.0, 5.0, 40.0, 0.3, 3.0])
    devices = np.array([1.0, 1.0, 4.0, 7.0, 1.0, 9.0])  # devices > tests is allowed
    cov = torch.tensor(np.column_stack([tests, devices]), dtype=DT)
    got = noise.variance(cov).detach().numpy()
    np.testing.assert_allclose(got, _numpy_s2(noise, tests, devices), rtol=1e-12)
    # (n,) means devices = tests; None and a scalar 1 mean one test from one device
    same = noise.variance(torch.tensor(tests, dtype=DT)).detach().numpy()
    np.testing.assert_allclose(same, _numpy_s2(noise, tests, tests), rtol=1e-12)
    one = _numpy_s2(noise, np.ones(1), np.ones(1))[0]
    with torch.no_grad():
        assert float(noise.variance(None)) == pytest.approx(one, rel=1e-12)
        assert float(noise.variance(1.0)) == pytest.approx(one, rel=1e-12)
        # tests, devices -> inf leave s2_floor
        big = float(noise.variance(torch.tensor([[1e12, 1e12]], dtype=DT))[0])
        assert big == pytest.approx(noise.floor + float(noise.s2_floor), rel=1e-6)
    params = noise_parameters(noise, y_var=4.0)
    assert params["noise"] == "tests+devices"
    assert params["s2_dev"] == pytest.approx(4.0 * float(noise.s2_dev.detach()))
    assert params["power_devices"] == pytest.approx(1.6 if learn_power else 1.0)
    assert params["power"] == pytest.approx(0.7 if learn_power else 1.0)
    # the "tests" model is unchanged: no devices parameters
    assert "s2_dev" not in noise_parameters(_TestsNoise(init=0.4), y_var=1.0)
    assert not any("dev" in k for k in _TestsNoise(init=0.4).state_dict())


def test_dppgp_uses_per_point_s2_in_data_and_trace_terms() -> None:
    torch.manual_seed(0)
    model = DBKModel(2, rank=6, hidden=4, noise="tests+devices", noise_init=0.3).double()
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(32, 2, generator=gen, dtype=DT) * 2 - 1
    y = torch.randn(32, generator=gen, dtype=DT)
    cov = torch.randint(1, 20, (32, 2), generator=gen).double()
    config = LoopConfig.of(DBKHyperparameters(objective="dppgp", alpha=0.7, beta=0.05))
    loss = batch_loss(model, x, y, n=500, config=config, tests=cov)
    s2 = torch.tensor(
        _numpy_s2(model.noise, cov[:, 0].numpy(), cov[:, 1].numpy()), dtype=DT
    )  # per point, from numpy
    expect = _dppgp_reference(model, x, y, s2, alpha=0.7, beta=0.05, n=500)
    torch.testing.assert_close(loss, expect, rtol=1e-10, atol=1e-12)
    # the devices term is trained: gradients reach s2_dev
    loss.backward()
    assert model.noise.raw_dev.grad is not None and float(model.noise.raw_dev.grad) != 0.0


def test_exact_marginal_likelihood_takes_devices_noise() -> None:
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(40, 5, generator=gen, dtype=DT)
    y = torch.randn(40, generator=gen, dtype=DT)
    cov = torch.randint(1, 30, (40, 2), generator=gen).double()
    noise = _TestsNoise(init=0.5, learn_power=True, devices=True).double()
    s2 = noise.variance(cov)
    got = exact_marginal_log_likelihood(phi, y, s2, mean=0.2)
    torch.testing.assert_close(got, _dense_reference(phi, y, s2.detach(), 0.2), rtol=1e-10, atol=0)
    got.backward()
    assert float(noise.raw_dev.grad) != 0.0 and float(noise.raw_power_devices.grad) != 0.0


def _devices_data(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """Noise dominated by the devices term: s2_i = 0.01 + 0.05 / tests_i + 0.5 / devices_i."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    f = np.sin(2.5 * x[:, 0]) + 0.5 * np.cos(3.0 * x[:, 1])
    tests = np.minimum(rng.geometric(0.15, size=n), 60).astype(np.float64)
    devices = 1.0 + rng.binomial((tests - 1).astype(int), rng.uniform(0, 1, size=n))
    y = f + rng.normal(size=n) * np.sqrt(0.01 + 0.05 / tests + 0.5 / devices)
    return x, y, tests, devices


SMALL = {"rank": 8, "hidden": 8, "batch_size": 128, "lr": 1e-2, "device": "cpu", "seed": 0}


def test_devices_noise_beats_tests_noise_on_devices_data() -> None:
    x, y, t, d = _devices_data(1500, seed=1)
    xv, yv, tv, dv = _devices_data(500, seed=2)
    kw = {**SMALL, "epochs": 25, "patience": 25, "noise_init": 0.5}
    both = DBKRegressor(noise="tests+devices", **kw).fit(
        x, y, xv, yv, tests=t, tests_val=tv, devices=d, devices_val=dv
    )
    only = DBKRegressor(noise="tests", **kw).fit(x, y, xv, yv, tests=t, tests_val=tv)
    best = lambda m: min(h["val_nll"] for h in m.history_)  # noqa: E731
    assert best(both) < best(only) - 0.03
    # the validation NLL recorded in training is that of predict(tests=, devices=)
    pred = both.predict_dist(xv, tests=tv, devices=dv)
    nll = np.mean(0.5 * np.log(2 * np.pi * pred.var) + (yv - pred.mean) ** 2 / (2 * pred.var))
    assert nll == pytest.approx(both.history_[both.best_epoch_ - 1]["val_nll"], rel=1e-4)
    p = both.noise_parameters()
    assert p["s2_dev"] > p["s2_meas"]  # the devices term carries the per-tile noise


@pytest.fixture(scope="module")
def devices_fit() -> tuple[DBKRegressor, np.ndarray]:
    x, y, t, d = _devices_data(300, seed=4)
    model = DBKRegressor(noise="tests+devices", noise_power=True, epochs=2, **SMALL)
    return model.fit(
        x, y, x[:50], y[:50], tests=t, tests_val=t[:50], devices=d, devices_val=d[:50]
    ), x


def test_predict_and_noise_variance_with_devices(devices_fit) -> None:
    model, x = devices_fit
    assert model.tests_aware and model.devices_aware
    p = model.noise_parameters()
    assert set(p) == {"noise", "s2_floor", "s2_meas", "power", "s2_dev", "power_devices"}
    s2 = model.noise_variance(np.array([1.0, 4.0, 4.0]), np.array([1.0, 1.0, 4.0]))
    expect = (
        p["s2_floor"]
        + p["s2_meas"] / np.array([1.0, 4.0, 4.0]) ** p["power"]
        + p["s2_dev"] / np.array([1.0, 1.0, 4.0]) ** p["power_devices"]
    )
    np.testing.assert_allclose(s2, expect, rtol=1e-5)
    # defaults: tests=None -> one test from one device; devices=None -> devices = tests
    np.testing.assert_allclose(model.noise_variance(), s2[:1], rtol=1e-6)
    np.testing.assert_allclose(model.noise_variance(4.0), s2[2:], rtol=1e-6)
    one = model.predict_dist(x[:5])
    four_two = model.predict_dist(x[:5], tests=4, devices=2)
    np.testing.assert_allclose(
        four_two.var - four_two.var_f, model.noise_variance(4.0, 2.0, n=5), rtol=1e-6
    )
    assert (four_two.var < one.var).all()
    np.testing.assert_allclose(model.predict_dist(x[:5], quantity="latent").var, one.var_f)


def test_devices_errors(devices_fit) -> None:
    model, x = devices_fit
    with pytest.raises(DataError, match="devices has 2 values"):
        model.predict_dist(x[:3], tests=2, devices=[1.0, 2.0])
    with pytest.raises(DataError, match="devices must be finite and >= 1"):
        model.predict_dist(x[:3], tests=2, devices=0.5)
    xs, ys, ts, ds = _devices_data(40, seed=5)
    est = DBKRegressor(noise="tests+devices", epochs=1, **SMALL)
    with pytest.raises(DataError, match=r"devices=\.\.\."):
        est.fit(xs, ys, tests=ts)
    with pytest.raises(DataError, match="devices_val"):
        est.fit(xs, ys, xs, ys, tests=ts, tests_val=ts, devices=ds, devices_val=np.nan * ds)
    with pytest.raises(DataError, match="devices has 39 values"):
        est.fit(xs, ys, tests=ts, devices=ds[:-1])
    with pytest.raises(DataError, match=r'fit_parquet.*noise="tests"'):
        fit_parquet(est, "unused.parquet", y_column="y", tests_column="tests")
    # devices <= tests is not required
    est.fit(xs, ys, tests=np.ones(40), devices=np.full(40, 3.0))


def test_torch_baselines_refuse_devices_noise() -> None:
    # scikit-learn estimators take any option when built or set and check it in fit
    x = np.random.default_rng(0).uniform(size=(8, 2))
    cagp = build_model("cagp", epochs=1, batch_size=8, seed=0, overrides={"noise": "tests+devices"})
    with pytest.raises(ValueError, match=r'tests\+devices.*noise="tests"'):
        cagp.fit(x, x[:, 0], tests=np.ones(8))
    softki = build_model("softki", epochs=1, batch_size=8, seed=0).set_params(noise="tests+devices")
    with pytest.raises(ValueError, match=r"tests\+devices"):
        softki.fit(x, x[:, 0], tests=np.ones(8))
    with pytest.raises(ValueError, match=r"tests\+devices"):
        make_noise("tests+devices", init=0.5)


def test_exact_objective_fits_devices_noise() -> None:
    x, y, t, d = _devices_data(200, seed=6)
    model = DBKRegressor(
        noise="tests+devices", objective="exact", epochs=3, dtype="float64", **SMALL
    )
    model.fit(x, y, x[:40], y[:40], tests=t, tests_val=t[:40], devices=d, devices_val=d[:40])
    assert np.isfinite(model.predict_dist(x[:5], tests=t[:5], devices=d[:5]).var).all()


def test_save_load_round_trip(devices_fit, tmp_path) -> None:
    model, x = devices_fit
    model.save(tmp_path / "m")
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["config"]["noise"] == "tests+devices" and doc["config"]["noise_power"] is True
    back = DBKRegressor.load(tmp_path / "m", device="cpu")
    assert back.devices_aware and back.noise_parameters() == pytest.approx(model.noise_parameters())
    np.testing.assert_allclose(
        back.predict_dist(x[:5], tests=3, devices=2).var,
        model.predict_dist(x[:5], tests=3, devices=2).var,
    )
