"""Pipelines with the tests-aware noise (issue 9): --noise, predict --tests K, report by_tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from pipeline_helpers import grid_noise_s2, make_run

from geodbk import DBKRegressor
from geodbk.errors import DataError
from pipelines.config import TrainConfig, demo_config
from pipelines.predict import run_predict
from pipelines.report import run_report
from pipelines.scoring import bucket_masks, by_tests_scores
from pipelines.train import run_train
from pipelines.training_data import resolve_noise

CFG = demo_config(quick=True).replace(epochs=2)


def test_tests_buckets_edges() -> None:
    t = np.array([1, 2, 3, 4, 5, 8, 9, 16, 17, 600, 0.4])
    masks = bucket_masks(t)
    assert list(masks) == ["1", "2", "3-4", "5-8", "9-16", ">16"]
    assert [int(m.sum()) for m in masks.values()] == [2, 1, 2, 2, 2, 2]
    y = np.zeros(len(t))
    scores = by_tests_scores(y, y, np.ones(len(t)), np.arange(len(t)) % 2 == 0, t)
    assert scores["1"]["n"] == 2 and scores["1"]["urban"]["n"] + scores["1"]["rural"]["n"] == 2
    assert scores["1"]["coverage95"] == 1.0


def test_resolve_noise() -> None:
    auto = TrainConfig()
    assert resolve_noise(auto, ["x1", "tests"]).noise == "tests"
    assert resolve_noise(auto, ["x1", "tests"]).noise_init == 0.5
    assert resolve_noise(auto, ["x1"]).noise_init == 0.01
    assert resolve_noise(auto, ["x1"]).noise == "constant"
    assert resolve_noise(auto.replace(noise="constant"), ["tests"]).noise == "constant"
    with pytest.raises(DataError, match="tests"):
        resolve_noise(auto.replace(noise="tests"), ["x1"])
    assert resolve_noise(auto, ["tests"]).noise == "tests"  # also under --distributed
    assert auto.estimator_kwargs()["noise"] == "constant"
    # noise_init 0 = the noise model's default: the seed's 0.01, or 0.5 for tests
    assert auto.estimator_kwargs()["noise_init"] == 0.01
    assert auto.replace(noise="tests").estimator_kwargs()["noise_init"] == 0.5
    assert auto.replace(noise="tests", noise_init=0.2).estimator_kwargs()["noise_init"] == 0.2


def test_constant_noise_run_and_predict_tests(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=300)
    run_train(run, target="download", config=CFG, progress=False, noise="constant")
    model = DBKRegressor.load(run / "models" / "download")
    assert not model.tests_aware and model.metadata_["noise"]["noise"] == "constant"
    run_predict(run, target="download", resolution=0.05, extent="region", tests=4, quantity="test")
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        assert ds.attrs["quantity"] == "test"
        assert ds.attrs["quantity_description"] == "observation (constant noise)"
        assert ds.attrs["noise_model"] == "constant"
    run_report(run, target="download")
    metrics = json.loads((run / "report" / "download" / "metrics.json").read_text())
    assert "by_tests" in metrics  # the tiles have `tests`, whatever the noise model

    run_train(run, target="download", config=CFG, progress=False)  # auto -> tests+devices
    run_predict(run, target="download", resolution=0.05, extent="region", tests=4, quantity="test")
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        assert ds.attrs["noise_model"] == "tests+devices"
        assert ds.attrs["quantity_description"] == "tile average of 4 speed tests (tests=4)"
        m = ds["in_region"].values
        s2 = grid_noise_s2(ds.attrs, 4)
        assert np.allclose(ds["std"].values[m] ** 2, ds["std_f"].values[m] ** 2 + s2, rtol=1e-3)
    with pytest.raises(DataError, match="tests"):
        run_predict(run, target="download", resolution=0.05, tests=0.5)
