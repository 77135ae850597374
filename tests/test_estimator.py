"""DBKRegressor: the estimator contract, persistence, resume, devices."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

from geodbk import DBKRegressor, Prediction
from geodbk.errors import DataError, ModelFileError

SMALL: dict[str, Any] = {
    "rank": 16,
    "hidden": 8,
    "batch_size": 32,
    "epochs": 3,
    "device": "cpu",
    "seed": 0,
}


def _data(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    y = 50.0 + 10.0 * np.sin(3 * x[:, 0]) + rng.normal(scale=2.0, size=n)
    return x, y


@pytest.fixture(scope="module")
def fitted() -> DBKRegressor:
    x, y = _data()
    return DBKRegressor(**SMALL).fit(x[:100], y[:100], x[100:], y[100:])


def test_contract_shapes_and_units(fitted: DBKRegressor) -> None:
    x, _ = _data(30, seed=1)
    pred = fitted.predict_dist(x)
    assert isinstance(pred, Prediction)
    for arr in (pred.mean, pred.var, pred.var_f, pred.std, pred.lower, pred.upper):
        assert arr.shape == (30,) and arr.dtype == np.float64
    assert np.all(pred.var > pred.var_f) and np.all(pred.var_f >= 0)
    assert np.allclose(pred.upper - pred.lower, 2 * 1.959964 * pred.std, rtol=1e-5)
    # y's units: the mean is near the data's level, not the standardised 0
    assert abs(float(pred.mean.mean()) - 50.0) < 10.0
    assert fitted.features(x).shape == (30, 16)
    k = fitted.kernel(x, x[:7])
    assert k.shape == (30, 7)
    phi = fitted.features(x)
    assert np.allclose(k, phi @ phi[:7].T)
    assert np.allclose(fitted.kernel(x, x[:7], in_y_units=True), k * fitted.y_std_**2)
    assert [h["epoch"] for h in fitted.history_] == [1, 2, 3]
    assert set(fitted.history_[0]) == {"epoch", "train_loss", "val_nll", "seconds"}
    assert 1 <= fitted.best_epoch_ <= 3


def test_chunked_prediction_matches_single_batch(fitted: DBKRegressor) -> None:
    x, _ = _data(50, seed=2)
    a, b = fitted.predict_dist(x, chunk_size=7), fitted.predict_dist(x, chunk_size=10_000)
    assert np.allclose(a.mean, b.mean, rtol=1e-5, atol=1e-5)
    assert np.allclose(a.var, b.var, rtol=1e-5, atol=1e-6)


def test_save_load_round_trip(fitted: DBKRegressor, tmp_path: Path) -> None:
    x, _ = _data(40, seed=3)
    fitted.save(tmp_path / "m", metadata={"target": "download", "n": 3})
    assert (tmp_path / "m" / "weights.safetensors").is_file()
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    assert doc["config"]["rank"] == 16 and doc["best_epoch"] == fitted.best_epoch_
    loaded = DBKRegressor.load(tmp_path / "m", device="cpu")
    a, b = fitted.predict_dist(x), loaded.predict_dist(x)
    assert np.array_equal(a.mean, b.mean) and np.array_equal(a.var, b.var)
    assert np.array_equal(a.var_f, b.var_f)
    assert loaded.metadata_ == {"target": "download", "n": 3}
    assert loaded.history_ == fitted.history_
    assert loaded.get_params() == fitted.get_params()
    assert np.array_equal(loaded.kernel(x, x[:3]), fitted.kernel(x, x[:3]))


def test_corrupt_foreign_and_missing_bundles(fitted: DBKRegressor, tmp_path: Path) -> None:
    folder = fitted.save(tmp_path / "m")
    with pytest.raises(ModelFileError, match="not found"):
        DBKRegressor.load(tmp_path / "nope")
    weights = folder / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="corrupt"):
        DBKRegressor.load(folder)
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFileError):
        DBKRegressor.load(folder)
    folder2 = fitted.save(tmp_path / "m2")
    (folder2 / "model.json").write_text('{"format": "something-else"}')
    with pytest.raises(ModelFileError, match="not a geodbk model"):
        DBKRegressor.load(folder2)
    (folder2 / "model.json").write_text("{truncated")
    with pytest.raises(ModelFileError, match="not valid JSON"):
        DBKRegressor.load(folder2)
    folder3 = fitted.save(tmp_path / "m3")
    (folder3 / "weights.safetensors").unlink()
    with pytest.raises(ModelFileError, match="missing"):
        DBKRegressor.load(folder3)


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    x, y = _data()
    opts = {**SMALL, "epochs": 4}
    straight = DBKRegressor(**opts).fit(x[:100], y[:100], x[100:], y[100:])
    first = DBKRegressor(**{**opts, "epochs": 2}).fit(
        x[:100], y[:100], x[100:], y[100:], checkpoint_dir=tmp_path / "ck"
    )
    assert len(first.history_) == 2
    resumed = DBKRegressor(**opts).fit(
        x[:100], y[:100], x[100:], y[100:], checkpoint_dir=tmp_path / "ck", resume=True
    )
    sa, sb = straight.model_.state_dict(), resumed.model_.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)

    def strip(h: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in h]

    assert strip(straight.history_) == strip(resumed.history_)
    assert straight.best_epoch_ == resumed.best_epoch_
    assert np.array_equal(straight.predict_dist(x).mean, resumed.predict_dist(x).mean)


def test_resume_with_other_options_is_refused(tmp_path: Path) -> None:
    x, y = _data()
    DBKRegressor(**{**SMALL, "epochs": 1}).fit(x, y, checkpoint_dir=tmp_path)
    with pytest.raises(ModelFileError, match="different options"):
        DBKRegressor(**{**SMALL, "lr": 0.5}).fit(x, y, checkpoint_dir=tmp_path, resume=True)


@pytest.mark.parametrize("expansion", ["rbf", "silu"])
@pytest.mark.parametrize("objective", ["dppgp", "exact", "ppgp", "elbo"])
def test_all_objectives_and_expansions_train(expansion: str, objective: str) -> None:
    x, y = _data(80)
    m = DBKRegressor(**{**SMALL, "epochs": 2, "expansion": expansion, "objective": objective})
    m.fit(x, y)
    pred = m.predict_dist(x)
    assert np.isfinite(pred.mean).all() and np.all(pred.var > 0)
    assert all(np.isfinite(h["train_loss"]) and h["val_nll"] is None for h in m.history_)


def test_progress_callback_and_early_stopping(capsys: pytest.CaptureFixture[str]) -> None:
    x, y = _data(60)
    seen: list[dict] = []
    # lr = 1e-30: every update is below the parameters' rounding (lr must be > 0)
    m = DBKRegressor(**{**SMALL, "epochs": 10, "lr": 1e-30, "patience": 2})
    m.fit(x[:40], y[:40], x[40:], y[40:], progress=True, callback=seen.append)
    # nothing improves after epoch 1, so training stops after 1 + patience epochs
    assert [r["epoch"] for r in seen] == [1, 2, 3]
    assert m.best_epoch_ == 1 and m.stopped_early_
    assert "val_nll" in capsys.readouterr().err


def test_seeded_reproducibility_and_seed_effect() -> None:
    x, y = _data(80)
    a = DBKRegressor(**SMALL).fit(x, y).predict_dist(x).mean
    b = DBKRegressor(**SMALL).fit(x, y).predict_dist(x).mean
    c = DBKRegressor(**{**SMALL, "seed": 1}).fit(x, y).predict_dist(x).mean
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_bad_inputs_raise_clear_errors(fitted: DBKRegressor) -> None:
    x, y = _data(20)
    with pytest.raises(DataError, match="NaN"):
        DBKRegressor(**SMALL).fit(np.where(x > 0.9, np.nan, x), y)
    with pytest.raises(DataError, match="values but the inputs have"):
        DBKRegressor(**SMALL).fit(x, y[:5])
    with pytest.raises(DataError, match="X has 5 features, but DBKRegressor is expecting 2"):
        fitted.predict(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="expansion"):
        DBKRegressor(**{**SMALL, "expansion": "poly"}).fit(x, y)
    for held in ({"expansion": "silu"}, {"objective": "exact"}):
        with pytest.raises(ValueError, match=r"kernel_update_every must be 0 \(default\) or 1"):
            DBKRegressor(**{**SMALL, "kernel_update_every": 2, **held}).fit(x, y)
    with pytest.raises(ValueError, match="kernel_update_every must be >= 0, got -1"):
        DBKRegressor(**{**SMALL, "kernel_update_every": -1}).fit(x, y)
    with pytest.raises(NotFittedError, match="not fitted"):
        DBKRegressor().predict(x)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("expansion", "kernel_update_every"), [("rbf", 1), ("silu", 1), ("rbf", 2)]
)
def test_cuda_matches_cpu(expansion: str, kernel_update_every: int, tmp_path: Path) -> None:
    x, y = _data()
    opts = {
        **SMALL,
        "expansion": expansion,
        "dtype": "float64",
        "epochs": 3,
        "kernel_update_every": kernel_update_every,
    }
    cpu = DBKRegressor(**{**opts, "device": "cpu"}).fit(x, y)
    gpu = DBKRegressor(**{**opts, "device": "cuda"}).fit(x, y)
    assert next(gpu.model_.parameters()).is_cuda
    a, b = cpu.predict_dist(x), gpu.predict_dist(x)
    assert np.allclose(a.mean, b.mean, rtol=1e-6, atol=1e-6)
    assert np.allclose(a.var, b.var, rtol=1e-6, atol=1e-6)
    gpu.save(tmp_path / "g")
    back = DBKRegressor.load(tmp_path / "g", device="cpu")
    assert np.allclose(back.predict_dist(x).mean, b.mean, rtol=1e-9, atol=1e-9)


def test_fit_warns_when_the_inputs_lie_far_from_the_unit_square() -> None:
    """Raw lon/lat (about -157, 21) leave every inducing point, initialised in [-1, 1], far
    from the data: the model fits a constant (R² 0). The warning names the column and the fix."""
    import pandas as pd

    x, y = _data(60)
    raw = pd.DataFrame({"lon": x[:, 0] - 157.0, "lat": x[:, 1]})
    with pytest.warns(
        UserWarning, match=r"X column 'lon' .*MinMaxScaler\(feature_range=\(-1, 1\)\)"
    ):
        DBKRegressor(**{**SMALL, "epochs": 1}).fit(raw, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DBKRegressor(**{**SMALL, "epochs": 1}).fit(x * 2.5, y)  # standardised inputs are fine


def test_the_docstring_documents_every_parameter() -> None:
    """``help(DBKRegressor)`` shows a numpy-style Parameters section naming every ``__init__``
    parameter (the section was indented under the summary, so it did not parse)."""
    import inspect
    import re

    doc = inspect.getdoc(DBKRegressor) or ""
    assert "\nParameters\n----------\n" in doc
    section = doc.split("\nParameters\n----------\n", 1)[1]
    named = {
        n.strip() for line in re.findall(r"^(\w[\w, ]*)$", section, re.M) for n in line.split(",")
    }
    assert set(DBKRegressor._get_param_names()) <= named
