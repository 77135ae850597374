"""The local layer in the run directory: resolution, saving, loading, turning it off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from geodbk import DBKRegressor
from geodbk.errors import DataError, ModelFileError
from pipelines.config import TrainConfig, demo_config
from pipelines.layers import LAYER_FILE, load_local_layer, load_map_layers, tile_positions
from pipelines.predict import run_predict
from pipelines.rundir import RunDir
from pipelines.train import resolve_local_layer, run_train


def test_resolve_local_layer_follows_the_tile_effect() -> None:
    on = TrainConfig(tile_effect="on")
    assert resolve_local_layer(on).local_layer == "on"
    assert resolve_local_layer(on.replace(local_layer="off")).local_layer == "off"
    assert resolve_local_layer(TrainConfig(tile_effect="off")).local_layer == "off"
    with pytest.raises(DataError, match="local_layer: on needs the tile effect"):
        resolve_local_layer(TrainConfig(tile_effect="off", local_layer="on"))
    assert TrainConfig(local_layer=False).local_layer == "off"  # type: ignore[arg-type]
    with pytest.raises(DataError, match="local_layer"):
        TrainConfig(local_layer="sometimes")


def test_tile_positions_are_km_apart() -> None:
    # two zoom-16 neighbours east-west: 360° / 2^16 of longitude apart at latitude lat0
    xy = tile_positions(["0223031123101313", "0223031123101312"], lat0=21.3)
    want = 6371.0088 * np.cos(np.radians(21.3)) * np.radians(360 / 2**16)
    assert np.hypot(*(xy[0] - xy[1])) == pytest.approx(want, rel=1e-9)


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("layers") / "run"
    shutil.copytree(tiny_run, r)
    return r


def test_the_demo_model_has_a_local_layer_that_loads(run: Path) -> None:
    rd = RunDir(run)
    model = DBKRegressor.load(rd.model_dir("download"), device="cpu")
    effect, layer = load_map_layers(rd, "download", model)
    assert layer is not None and layer.effect is effect
    assert layer.params.to_dict() == model.metadata_["local_layer"]
    p = layer.params
    assert p.sigma2 >= 0 and p.range_km > 0
    assert p.val_nll is not None and p.val_nll_without is not None
    assert p.val_nll <= p.val_nll_without + 1e-9  # the fit can always take sigma² -> 0


def test_a_foreign_or_missing_layer_file_is_refused(run: Path, tmp_path: Path) -> None:
    rd = RunDir(run)
    model = DBKRegressor.load(rd.model_dir("download"), device="cpu")
    effect, _ = load_map_layers(rd, "download", model)
    folder = tmp_path / "model"
    folder.mkdir()
    expected = model.metadata_["local_layer"]
    with pytest.raises(ModelFileError, match="missing or unreadable"):
        load_local_layer(folder, effect, expected=expected)
    (folder / LAYER_FILE).write_text(json.dumps({**expected, "sigma2": 123.0}))
    with pytest.raises(ModelFileError, match="does not belong"):
        load_local_layer(folder, effect, expected=expected)
    (folder / LAYER_FILE).write_text("{not json")
    with pytest.raises(ModelFileError, match="retrain"):
        load_local_layer(folder, effect, expected=expected)
    assert load_local_layer(folder, effect, expected=None) is None


def test_no_local_layer_keeps_the_tile_effect_alone(run: Path) -> None:
    cfg = demo_config(quick=True).replace(epochs=2)
    run_train(run, target="upload", config=cfg, progress=False, local_layer="off")
    folder = RunDir(run).model_dir("upload")
    assert not (folder / LAYER_FILE).exists()
    md = DBKRegressor.load(folder, device="cpu").metadata_
    assert md["config"]["local_layer"] == "off" and "local_layer" not in md
    assert md["config"]["tile_effect"] == "on"
    run_predict(run, target="upload", max_cells=900)
    with xr.open_dataset(run / "grids" / "upload.nc") as ds:
        assert ds.attrs["local_layer"] == 0 and ds.attrs["tile_effect"] == 1
        assert ds["std"].attrs["quantity"] == "tile: tile effect"
        inside = ds["in_region"].values
        assert np.all(ds["tile_pull"].values[inside] == 0)
