"""Pipelines with the ``tests+devices`` noise: train --noise tests+devices, predict --devices M,
report scoring each test row with its own tests and devices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import xarray as xr
from pipeline_helpers import grid_noise_s2, make_run

from geodbk import DBKRegressor
from geodbk.errors import DataError
from pipelines import cli
from pipelines.config import TrainConfig, dump_config
from pipelines.train import run_train
from pipelines.training_data import resolve_noise

TINY = {"rank": 8, "hidden": 8, "epochs": 2, "patience": 2, "batch_size": 128, "device": "cpu"}


def test_train_predict_report_with_devices(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=300)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(dump_config(TrainConfig(**TINY)))
    base = ["--run", str(run), "--target", "download"]
    argv = ["train", *base, "--config", str(cfg), "--noise", "tests+devices", "--no-progress"]
    assert cli.main(argv) == 0
    model = DBKRegressor.load(run / "models" / "download")
    assert model.devices_aware and model.noise == "tests+devices"
    md = model.metadata_
    assert md["config"]["noise"] == "tests+devices" and md["config"]["noise_init"] == 0.5
    assert md["noise"]["noise"] == "tests+devices" and md["noise"]["s2_dev"] > 0

    args = ["--resolution", "0.05", "--tests", "4", "--devices", "2", "--quantity", "test"]
    assert cli.main(["predict", *base, *args]) == 0
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        a = ds.attrs
        assert a["noise_model"] == "tests+devices" and a["tests"] == 4 and a["devices"] == 2
        assert a["quantity"] == "test"
        text = "tile average of 4 speed tests from 2 devices (tests=4, devices=2)"
        assert a["quantity_description"] == text
        assert ds["std"].attrs["quantity"] == f"test: {text}"
        s2 = grid_noise_s2(a, 4, 2)
        m = ds["in_region"].values
        assert np.allclose(ds["std"].values[m] ** 2, ds["std_f"].values[m] ** 2 + s2, rtol=1e-3)
        attrs = dict(a)
    # the app's K-tests layers of a tests+devices grid: devices = tests = K
    from app import loaders, maps

    grid = loaders.Grid("download", np.zeros(1), np.zeros(1), {}, attrs)
    assert maps.noise_variance(grid, 3.0) == pytest.approx(model.noise_variance(3.0)[0], rel=1e-4)

    assert cli.main(["report", *base]) == 0
    out = run / "report" / "download"
    preds = pq.read_table(out / "predictions.parquet").to_pandas()
    assert list(preds.columns)[-2:] == ["tests", "devices"]
    tiles = pq.read_table(run / "tiles.parquet", columns=["quadkey", "devices"]).to_pandas()
    merged = preds.merge(tiles, on="quadkey", suffixes=("", "_tile"))
    np.testing.assert_allclose(merged["devices"], np.maximum(merged["devices_tile"], 1))
    # each row is scored with its own tests and devices
    X = (
        merged[["quadkey"]]
        .merge(pq.read_table(run / "tiles.parquet", columns=["quadkey", "x1", "x2"]).to_pandas())[
            ["x1", "x2"]
        ]
        .to_numpy()
    )
    pred = model.predict_dist(
        X, tests=merged["tests"].to_numpy(), devices=merged["devices"].to_numpy()
    )
    np.testing.assert_allclose(merged["std"], pred.std, rtol=1e-5)
    assert "by_tests" in json.loads((out / "metrics.json").read_text())
    assert "/ devices^" in (out / "report.md").read_text()


def test_devices_column_required_and_refusals(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=80)
    table = pq.read_table(run / "tiles.parquet")
    pq.write_table(table.drop_columns(["devices"]), run / "tiles.parquet")
    cfg = TrainConfig(**TINY)
    # the tile-table reader already names the file and the missing column
    with pytest.raises(DataError, match=r"tiles\.parquet.*devices"):
        run_train(run, target="download", config=cfg, noise="tests+devices", progress=False)
    # a schema without `devices` (the --streaming / --distributed readers' check)
    with pytest.raises(DataError, match=r"`devices` column in T\.parquet.*--noise tests"):
        resolve_noise(cfg.replace(noise="tests+devices"), ["x1", "tests"], source="T.parquet")
    # the default: auto = tests+devices in memory and with --distributed when the table has
    # both columns, tests under --streaming or without `devices`
    assert resolve_noise(TrainConfig(), ["tests", "devices"]).noise == "tests+devices"
    assert (
        resolve_noise(TrainConfig(), ["tests", "devices"], devices_supported=False).noise == "tests"
    )
    assert resolve_noise(TrainConfig(), ["tests"]).noise == "tests"
    with pytest.raises(DataError, match=r"streaming.*tests\+devices"):
        run_train(run, target="download", config=cfg, noise="tests+devices", streaming=True)
    # --distributed takes tests+devices, but this table has no `devices` column: named
    with pytest.raises(DataError, match=r"`devices` column in .*tiles\.parquet"):
        run_train(run, target="download", config=cfg, noise="tests+devices", distributed=True)
