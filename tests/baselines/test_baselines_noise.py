"""Every baseline takes the tests-aware noise s2_i = s2_floor + s2_meas / tests_i^p (issue 9).

SVDBK, exact RBF, CaGP, SOLVE-GP and SoftKI through ``TorchBaseline`` (dense formulas: each
model's own test file, ``test_exact_rbf.py``, ``test_cagp.py``, ``test_solvegp.py``,
``test_softki.py``); SV-RBF, SV-DKL, PP-DKL and VBLL through the core's DBKRegressor:
``test_svgp.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from baseline_helpers import field, region, rows_with_tests

from geodbk.baselines.base import TorchBaseline
from geodbk.baselines.registry import build_model
from geodbk.baselines.softki import SoftKIRegressor
from geodbk.errors import DataError
from geodbk.likelihoods import inverse_softplus

TORCH_BASELINES = ("exact-rbf", "cagp", "solve-gp", "softki", "svdbk")


def _build(name: str, **overrides: Any) -> TorchBaseline:
    model = build_model(
        name, epochs=2, batch_size=32, seed=0, rank=6, hidden=8, overrides=overrides
    )
    assert isinstance(model, TorchBaseline)
    return model


@pytest.mark.parametrize("name", TORCH_BASELINES)
def test_torch_baselines_tests_noise_contract(name: str, tmp_path: Path) -> None:
    """fit(tests=, tests_val=), predict(tests=, quantity=), noise_*(), save/load round trip."""
    x, y, tests = rows_with_tests(n=80)
    model = _build(name, noise="tests")
    with pytest.raises(DataError, match="tests"):
        model.fit(x, y)
    with pytest.raises(DataError, match="tests_val"):
        model.fit(x, y, x[:20], y[:20], tests=tests)
    model.fit(x, y, x[:20], y[:20], tests=tests, tests_val=tests[:20])
    params = model.noise_parameters()
    assert params["noise"] == "tests" and params["s2_meas"] > 0 and params["power"] == 1.0
    one = model.predict_dist(x[:5])
    many = model.predict_dist(x[:5], tests=20)
    latent = model.predict_dist(x[:5], quantity="latent")
    assert np.all(latent.var < many.var) and np.all(many.var < one.var)
    np.testing.assert_allclose(latent.var, one.var_f)
    np.testing.assert_allclose(one.mean, many.mean)
    # var - var_f is the noise s2(tests) (SVDBK adds its test-time correction on top)
    s2 = model.noise_variance(np.full(5, 20.0))
    assert s2 == pytest.approx(params["s2_floor"] + params["s2_meas"] / 20, rel=1e-5)
    if name != "svdbk":
        np.testing.assert_allclose(many.var - many.var_f, s2, rtol=1e-5)
    # the noise split into its terms (what the tile effect rescales) sums to the noise
    names, comp = model.noise_components([1.0, 20.0, 20.0], devices=[1.0, 2.0, 3.0])
    assert names == ("floor", "meas") and comp.shape == (3, 2)
    np.testing.assert_allclose(comp.sum(1), model.noise_variance([1.0, 20.0, 20.0]), rtol=1e-6)
    assert comp[0, 1] == pytest.approx(20 * comp[1, 1], rel=1e-6)
    with pytest.raises(ValueError, match="quantity"):
        model.predict_dist(x[:5], quantity="mean")
    with pytest.raises(DataError, match=">= 1"):
        model.predict_dist(x[:5], tests=0)
    folder = model.save(tmp_path / name)
    back = type(model).load(folder, device="cpu")
    assert back.noise == "tests"
    np.testing.assert_allclose(
        back.predict_dist(x[:5], tests=[1, 2, 3, 4, 5]).var,
        model.predict_dist(x[:5], tests=[1, 2, 3, 4, 5]).var,
        rtol=1e-6,
    )


def _std_tensors(est: TorchBaseline, X: np.ndarray, y: np.ndarray, tests: np.ndarray):
    return (
        torch.as_tensor(X),
        torch.as_tensor((y - est.y_mean_) / est.y_sd_),
        torch.as_tensor(tests, dtype=torch.float64),
    )


def _constant_twin(est: TorchBaseline, s2: float) -> TorchBaseline:
    """The fitted tests-aware ``est`` with its noise replaced by a constant ``s2``."""
    twin = type(est)(**{**est.get_params(), "noise": "constant"})
    twin.sizes_, twin.y_mean_, twin.y_sd_ = est.sizes_, est.y_mean_, est.y_sd_
    module = twin._make_module(twin.sizes_).to(dtype=torch.float64)
    assert est.module_ is not None
    state = {k: v for k, v in est.module_.state_dict().items() if "noise." not in k}
    missing = module.load_state_dict(state, strict=False).missing_keys
    assert all("noise." in k for k in missing)
    noise = twin._noise(module)
    with torch.no_grad():
        noise.raw.fill_(inverse_softplus(s2 - noise.floor))
    for attr in ("_y_pad", "_order"):  # CaGP's training rows in Morton order
        if hasattr(est, attr):
            setattr(twin, attr, getattr(est, attr))
    twin.module_ = module
    return twin


@pytest.mark.parametrize("name", TORCH_BASELINES)
def test_equal_tests_reproduce_constant_noise(name: str) -> None:
    """tests_i = k for every row is the constant model with s2 = s2_floor + s2_meas / k."""
    X, y = region(30, seed=21)
    Xq = region(6, seed=22)[0]
    k = 4.0
    tests = np.full(30, k)
    est = _build(name, noise="tests", dtype="float64").fit(X, y, tests=tests)
    module = est.module_
    noise = est._noise(module)
    with torch.no_grad():
        noise.raw_floor.fill_(inverse_softplus(0.05))
        noise.raw_meas.fill_(inverse_softplus(0.4))
    Xt, yt, Tt = _std_tensors(est, X, y, tests)
    twin = _constant_twin(est, noise.floor + 0.05 + 0.4 / k)
    with torch.no_grad():
        est._refresh(module, Xt, yt, Tt)
        twin._refresh(twin.module_, Xt, yt, None)
        loss = float(est._loss(module, Xt, yt, 30, Tt))
        loss_c = float(twin._loss(twin.module_, Xt, yt, 30, None))
    assert loss == pytest.approx(loss_c, rel=1e-9, abs=1e-12)
    pred, pred_c = est.predict_dist(Xq, tests=k), twin.predict_dist(Xq)
    for a, b in ((pred.mean, pred_c.mean), (pred.var, pred_c.var), (pred.var_f, pred_c.var_f)):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


FIT = {
    "exact-rbf": {"epochs": 40},
    "cagp": {"epochs": 40},
    "solve-gp": {"epochs": 20, "lr": 0.05},
    "softki": {"epochs": 15, "lr": 0.03},
    "svdbk": {"epochs": 30, "lr": 0.03},
}


@pytest.mark.parametrize("name", TORCH_BASELINES)
def test_learned_noise_follows_single_test_rows(name: str) -> None:
    """Single-test rows noisier (var 0.01 + 0.6 / tests): s2_meas grows past s2_floor.

    Both start at half the initial noise (s2_meas = s2_floor); training must move them apart.
    """
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, (240, 2))
    tests = rng.choice([1.0, 1.0, 1.0, 2.0, 4.0, 10.0, 30.0], size=240)
    y = field(X) + rng.standard_normal(240) * np.sqrt(0.01 + 0.6 / tests)
    cfg = dict(FIT[name])
    model = build_model(
        name,
        epochs=cfg.pop("epochs"),
        batch_size=48,
        seed=0,
        rank=16,
        hidden=16,
        overrides={"noise": "tests", **cfg},
    )
    model.fit(X, y, tests=tests)
    p = model.noise_parameters()
    assert p["s2_meas"] > 0 and p["s2_meas"] > 1.5 * p["s2_floor"], p


def test_legacy_bundle_noise_option_loads_as_constant(tmp_path: Path) -> None:
    """Bundles from before issue 9 stored the initial noise variance as ``noise``."""
    X, y = region(60, seed=23)
    model = SoftKIRegressor(num_points=6, epochs=1, batch_size=30).fit(X, y)
    folder = model.save(tmp_path / "old")
    meta_path = folder / "model.json"
    meta = json.loads(meta_path.read_text())
    params = meta["baseline"]["params"]
    params["noise"] = params.pop("noise_init")
    del params["noise_power"]
    meta_path.write_text(json.dumps(meta))
    back = SoftKIRegressor.load(folder)
    assert back.noise == "constant" and back.noise_init == model.noise_init
    np.testing.assert_allclose(back.predict_dist(X[:4]).var, model.predict_dist(X[:4]).var)
    assert back.noise_parameters()["noise"] == "constant"


@pytest.mark.parametrize("noise", ["constant", "tests"])
def test_torch_baselines_take_the_tile_effect(noise: str) -> None:
    """CaGP's latent prediction and noise terms are what the tile effect is built on: a
    persistent offset per tile, seen in other quarters, is recovered."""
    from geodbk.tile_effect import fit_tile_effect, predict_with_tile_effect

    rng = np.random.default_rng(3)
    n_tiles, quarters = 60, 4
    centre = rng.uniform(-1, 1, size=(n_tiles, 2))
    offset = rng.normal(0.0, 0.5, n_tiles)
    tile = np.repeat(np.arange(n_tiles), quarters)
    time = np.tile(np.arange(quarters, dtype=float), n_tiles)
    tests = rng.integers(1, 10, tile.size).astype(float)
    x = centre[tile]
    y = np.sin(2 * x[:, 0]) + offset[tile] + rng.normal(size=tile.size) * np.sqrt(0.05 / tests)
    ids = np.array([f"t{j}" for j in tile])
    test, val = time == 3, time == 2
    train = ~test & ~val
    model = _build("cagp", noise=noise, epochs=5)
    kw = {"tests": tests} if noise == "tests" else {}
    part = lambda m: {k: v[m] for k, v in kw.items()}  # noqa: E731
    model.fit(
        x[train],
        y[train],
        x[val],
        y[val],
        **part(train),
        **{f"{k}_val": v[val] for k, v in kw.items()},
    )
    effect = fit_tile_effect(
        model,
        X=x[train],
        y=y[train],
        tiles=ids[train],
        times=time[train],
        X_val=x[val],
        y_val=y[val],
        tiles_val=ids[val],
        times_val=time[val],
        noise=part(train),
        noise_val=part(val),
    )
    names, _ = model.noise_components(n=1)
    assert effect.params.components == names
    with_effect = predict_with_tile_effect(
        model, effect, x[test], tiles=ids[test], times=time[test], noise=part(test)
    )
    alone = model.predict_dist(x[test], **part(test))

    def nll(pred) -> float:
        return float(
            np.mean(0.5 * (np.log(2 * np.pi * pred.var) + (y[test] - pred.mean) ** 2 / pred.var))
        )

    assert nll(with_effect) < nll(alone) - 0.2
