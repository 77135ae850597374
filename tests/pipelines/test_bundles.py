"""A run's saved models: a target's bundle with its checks, and the tile effect saved with it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from geodbk import DBKRegressor
from geodbk.errors import ModelFileError
from geodbk.geo.tile_effect_files import has_tile_effect
from geodbk.tile_effect import TileEffect, TileEffectParameters
from pipelines.bundles import load_model, load_tile_effect, save_tile_effect
from pipelines.rundir import RunDir

PARAMS = TileEffectParameters(tau2=0.5, rho=1.0, noise_scale=(1.0,), components=("noise",))


@pytest.fixture(scope="module")
def model() -> DBKRegressor:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(40, 2))
    opts = {"rank": 4, "hidden": 4, "epochs": 1, "batch_size": 20, "device": "cpu"}
    return DBKRegressor(**opts).fit(x, np.sin(x[:, 0]))


def _save(model: DBKRegressor, rd: RunDir, folder: str, **metadata: object) -> Path:
    """Save ``model`` as ``folder``'s bundle, its metadata naming ``folder`` as the target."""
    return model.save(rd.model_dir(folder), metadata={"target": folder, **metadata})


def _effect() -> TileEffect:
    return TileEffect(
        PARAMS, tiles=["a", "b"], times=[0.0, 1.0], residual=[0.3, -0.1], var_f=[0.0, 0.0],
        components=[[0.1], [0.2]],
    )  # fmt: skip


def test_a_target_s_model_loads_and_a_wrong_or_damaged_one_is_refused(
    model: DBKRegressor, tmp_path: Path
) -> None:
    rd = RunDir(tmp_path)
    with pytest.raises(ModelFileError, match=r"geodbk train --run .* --target download"):
        load_model(rd, "download")
    _save(model, rd, "download")
    loaded = load_model(rd, "download")
    x = np.zeros((3, 2))
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    _save(model, rd, "upload", target="latency")
    with pytest.raises(ModelFileError, match="holds a 'latency' model, not 'upload'"):
        load_model(rd, "upload")
    path = rd.model_dir("download") / "model.json"
    doc = json.loads(path.read_text())
    doc["standardization"]["y_std"] = 0.0
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="a finite mean and a positive sd are needed"):
        load_model(rd, "download")


def test_a_model_of_an_earlier_ingest_loads_with_a_warning(
    model: DBKRegressor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rd = RunDir(tmp_path)
    table = pa.table({"x1": [0.0]})
    pq.write_table(
        table.replace_schema_metadata({b"geodbk": b'{"schema_version": 1, "ingest_id": "new"}'}),
        rd.tiles,
    )
    _save(model, rd, "download", tiles_metadata={"ingest_id": "old"})
    with caplog.at_level(logging.WARNING, logger="geodbk"):
        load_model(rd, "download")
    assert "trained on an earlier ingest" in caplog.text


def test_the_tile_effect_round_trips_and_must_be_the_models(
    model: DBKRegressor, tmp_path: Path
) -> None:
    rd = RunDir(tmp_path)
    folder = _save(model, rd, "download")
    assert load_tile_effect(rd, "download", DBKRegressor.load(folder)) is None  # trained without
    effect = _effect()
    save_tile_effect(folder, effect)
    _save(model, rd, "download", tile_effect=PARAMS.to_dict())
    got = load_tile_effect(rd, "download", DBKRegressor.load(folder))
    assert got.params == effect.params and list(got.tiles) == ["a", "b"]
    np.testing.assert_array_equal(got.residual, effect.residual)
    other = {**PARAMS.to_dict(), "rho": 0.5}
    _save(model, rd, "download", tile_effect=other)
    with pytest.raises(ModelFileError, match="do not belong to this model"):
        load_tile_effect(rd, "download", DBKRegressor.load(folder))
    save_tile_effect(folder, None)  # a model trained without: the stale files go
    assert not has_tile_effect(folder)
    _save(model, rd, "download", tile_effect=PARAMS.to_dict())
    with pytest.raises(ModelFileError, match=r"no complete tile effect.*--tile-effect"):
        load_tile_effect(rd, "download", DBKRegressor.load(folder))
    save_tile_effect(folder, effect)
    (folder / "tile_effect.json").write_text("{truncated")
    with pytest.raises(ModelFileError, match=r"missing or unreadable.*geodbk train --run"):
        load_tile_effect(rd, "download", DBKRegressor.load(folder))
