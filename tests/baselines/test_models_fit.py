"""Every benchmark model fits the small synthetic region, beats a constant-mean predictor on test
NLL, and survives a save/load round trip with identical predictions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from baseline_helpers import FIT_SETTINGS, region

from geodbk.baselines.registry import MODEL_NAMES, build_model
from geodbk.errors import ModelFileError
from geodbk.predictive import Prediction


def _nll(pred: Prediction, y: np.ndarray) -> float:
    return float(
        np.mean(0.5 * np.log(2 * np.pi * pred.var) + (y - pred.mean) ** 2 / (2 * pred.var))
    )


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    X, y = region(600, seed=1)
    return {
        "X": X[:320],
        "y": y[:320],
        "Xv": X[320:400],
        "yv": y[320:400],
        "Xt": X[400:],
        "yt": y[400:],
    }


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_beats_constant_mean(name: str, data: dict[str, np.ndarray], tmp_path: Path) -> None:
    cfg = FIT_SETTINGS[name]
    model = build_model(
        name,
        epochs=cfg["epochs"],
        batch_size=64,
        seed=0,
        rank=24,
        hidden=16,
        overrides=cfg["overrides"],
    )
    model.fit(data["X"], data["y"], data["Xv"], data["yv"])
    pred = model.predict_dist(data["Xt"])
    assert isinstance(pred, Prediction)
    assert np.all(pred.var >= pred.var_f) and np.all(pred.var > 0)
    const = Prediction(
        mean=np.full(data["yt"].shape, data["y"].mean()),
        var=np.full(data["yt"].shape, data["y"].var()),
        var_f=np.zeros(data["yt"].shape),
    )
    nll, nll_const = _nll(pred, data["yt"]), _nll(const, data["yt"])
    assert nll < nll_const - 0.2, f"{name}: test NLL {nll:.3f} vs constant mean {nll_const:.3f}"
    assert len(model.history_) >= 1 and model.best_epoch_ is not None

    K = model.kernel(data["Xt"][:5], data["Xt"][:7])
    assert K.shape == (5, 7) and np.isfinite(K).all()

    folder = model.save(tmp_path / name, metadata={"note": name})
    again = type(model).load(folder)
    pred2 = again.predict_dist(data["Xt"])
    np.testing.assert_allclose(pred2.mean, pred.mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(pred2.var, pred.var, rtol=1e-6, atol=1e-9)
    assert again.metadata_.get("note") == name


@pytest.mark.parametrize("name", ["solve-gp", "exact-rbf"])
def test_paper_preset_fits_and_round_trips(
    name: str, data: dict[str, np.ndarray], tmp_path: Path
) -> None:
    """SOLVE-GP unwhitened with one lengthscale, exact RBF from l = sqrt(d): fit, finite
    predictions, identical after save/load (the options are rebuilt from the bundle)."""
    model = build_model(name, epochs=5, batch_size=64, seed=0, rank=24, preset="paper")
    model.fit(data["X"], data["y"], data["Xv"], data["yv"])
    pred = model.predict_dist(data["Xt"])
    assert np.isfinite(pred.mean).all() and np.all(pred.var > 0)
    again = type(model).load(model.save(tmp_path / name))
    assert again.get_params() == model.get_params()
    pred2 = again.predict_dist(data["Xt"])
    np.testing.assert_allclose(pred2.mean, pred.mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(pred2.var, pred.var, rtol=1e-6, atol=1e-9)


def test_corrupt_baseline_bundle_is_a_clear_error(
    data: dict[str, np.ndarray], tmp_path: Path
) -> None:
    from geodbk.baselines.cagp import CaGPRegressor
    from geodbk.baselines.softki import SoftKIRegressor

    model = SoftKIRegressor(num_points=8, epochs=1, batch_size=64).fit(data["X"], data["y"])
    folder = model.save(tmp_path / "m")
    with pytest.raises(ModelFileError, match="softki"):
        CaGPRegressor.load(folder)  # a foreign model type
    weights = folder / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])
    with pytest.raises(ModelFileError):
        SoftKIRegressor.load(folder)
