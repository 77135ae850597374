"""Pipelines with a noise floor per urban/rural class: train --noise ...+urban, predict with each
cell's class from RUN/urban_areas.geojson, report scoring each test row with its own class."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely
import xarray as xr
from pipeline_helpers import grid_noise_s2, make_run, urban_polygon

from geodbk import DBKRegressor
from geodbk.errors import DataError
from pipelines import cli
from pipelines.config import TrainConfig, dump_config
from pipelines.predict import run_predict
from pipelines.train import run_train
from pipelines.training_data import resolve_noise

TINY = {"rank": 8, "hidden": 8, "epochs": 2, "patience": 2, "batch_size": 128, "device": "cpu"}


def _tiny_config(tmp_path: Path) -> Path:
    """A few fast epochs at a high learning rate, so that the two floors separate (the
    synthetic rural noise sd is 0.35 against 0.15 in town)."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(dump_config(TrainConfig(**{**TINY, "epochs": 8, "patience": 8, "lr": 0.03})))
    return cfg


def test_train_predict_report_export_with_urban_floor(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=300)
    base = ["--run", str(run), "--target", "download"]
    argv = ["train", *base, "--config", str(_tiny_config(tmp_path)), "--no-progress"]
    assert cli.main([*argv, "--noise", "tests+devices+urban"]) == 0
    model = DBKRegressor.load(run / "models" / "download")
    assert model.noise_urban and model.devices_aware and model.noise == "tests+devices"
    md = model.metadata_
    assert md["config"]["noise"] == "tests+devices+urban"
    floor, floor_urban = md["noise"]["s2_floor"], md["noise"]["s2_floor_urban"]
    assert floor > 0 and floor_urban > 0 and abs(floor_urban - floor) > 0.005 * floor

    assert (
        cli.main(
            [*["predict", *base, "--resolution", "0.02"], "--tests", "4", "--quantity", "test"]
        )
        == 0
    )
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        a = dict(ds.attrs)
        assert a["noise_s2_floor_urban"] == pytest.approx(md["noise"]["s2_floor_urban"])
        assert "urban/rural noise floor" in a["quantity_description"]
        inside = ds["in_region"].values
        urban = ds["urban"].values
        lon, lat = np.meshgrid(ds["x"].values, ds["y"].values)
        std, std_f = ds["std"].values, ds["std_f"].values
    # each cell's class is its centre inside the run's urban layer; both classes occur
    expect = shapely.intersects_xy(urban_polygon(), lon, lat)
    np.testing.assert_array_equal(urban[inside] == 1.0, expect[inside])
    assert 0 < expect[inside].mean() < 1 and np.isnan(urban[~inside]).all()
    # std^2 = std_f^2 + the cell's class floor + s2_meas / K + s2_dev / K
    s2 = grid_noise_s2(a, 4, urban=expect[inside])
    np.testing.assert_allclose(std[inside] ** 2, std_f[inside] ** 2 + s2, rtol=1e-3)
    town = expect[inside]
    s2_grid = std[inside] ** 2 - std_f[inside] ** 2
    lower, higher = (
        (s2_grid[town], s2_grid[~town]) if floor_urban < floor else (s2_grid[~town], s2_grid[town])
    )
    assert lower.max() < higher.min()

    # the app's K-tests layer uses each cell's floor too
    from app import loaders, maps

    grid = loaders.Grid("download", np.zeros(1), np.zeros(1), {"urban": urban}, a)
    got = maps.noise_variance(grid, 3.0)
    want = model.noise_variance(3.0, n=int(inside.sum()), urban=expect[inside])
    np.testing.assert_allclose(np.asarray(got)[inside], want, rtol=1e-4)
    # through the dashboard's loader: the K = 4 layer is the stored (K = 4) sd, cell by cell
    path = run / "grids" / "download.nc"
    loaded = loaders.load_grid(str(path), loaders.stamp(path), "download")
    four = maps.layer_values(loaded, maps.LayerSpec("std", quantity="average", tests=4))
    keep = loaded.in_region
    np.testing.assert_allclose(four[keep], loaded.arrays["std"][keep], rtol=1e-3)

    assert cli.main(["report", *base]) == 0
    out = run / "report" / "download"
    preds = pq.read_table(out / "predictions.parquet").to_pandas()
    tiles = pq.read_table(
        run / "tiles.parquet", columns=["quadkey", "x1", "x2", "devices"]
    ).to_pandas()
    merged = preds.merge(tiles, on="quadkey")
    pred = model.predict_dist(
        merged[["x1", "x2"]].to_numpy(),
        tests=merged["tests"].to_numpy(),
        devices=merged["devices_y"].clip(lower=1).to_numpy(),
        urban=merged["urban"].to_numpy(),
    )
    np.testing.assert_allclose(merged["std"], pred.std, rtol=1e-5)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["urban"]["n"] > 0 and metrics["rural"]["n"] > 0
    assert f"({floor_urban:.4f} urban | {floor:.4f} rural) + " in (out / "report.md").read_text()

    assert cli.main(["export", *base]) == 0
    sidecar = json.loads(next((run / "exports").glob("download*.json")).read_text())
    assert "urban" in sidecar["bands"]


def test_urban_floor_needs_classes_and_layer(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=120)
    cfg = TrainConfig(**TINY)
    # the train split must hold both classes
    for classes in (0, 1):
        with pytest.raises(DataError, match=r"urban and rural tiles.*--urban-areas"):
            resolve_noise(cfg.replace(noise="tests+urban"), ["tests"], urban_classes=classes)
    assert resolve_noise(cfg.replace(noise="tests+urban"), ["tests"], urban_classes=2).noise == (
        "tests+urban"
    )
    # opt-in: the default does not add the class floor (no cross-validated gain)
    auto = resolve_noise(TrainConfig(), ["tests", "devices"], urban_classes=2)
    assert auto.noise == "tests+devices" and not auto.estimator_kwargs()["noise_urban"]
    assert cfg.replace(noise="tests+devices+urban").estimator_kwargs()["noise_urban"] is True
    with pytest.raises(DataError, match=r"streaming.*tests\+urban"):
        run_train(run, target="download", config=cfg, noise="tests+urban", streaming=True)
    # --distributed reads every rank's urban flags (one process here: the launcher's defaults)
    run_train(
        run, target="download", config=cfg, noise="tests+urban", distributed=True, progress=False
    )
    meta = json.loads((run / "models" / "download" / "model.json").read_text())["metadata"]
    assert "s2_floor_urban" in meta["noise"]
    # a single-class table (no urban layer at ingest) cannot train it
    table = pq.read_table(run / "tiles.parquet")
    all_rural = pa.array(np.zeros(table.num_rows, dtype=bool))
    table = table.set_column(table.schema.get_field_index("urban"), "urban", all_rural)
    pq.write_table(table, run / "tiles.parquet")
    with pytest.raises(DataError, match="urban and rural"):
        run_train(run, target="download", config=cfg, noise="tests+urban", progress=False)


def test_predict_without_urban_layer_names_the_file(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=150)
    cfg = TrainConfig(**TINY)
    run_train(run, target="download", config=cfg, noise="tests+urban", progress=False)
    (run / "urban_areas.geojson").unlink()
    with pytest.raises(DataError, match=r"urban_areas\.geojson is missing.*--noise tests"):
        run_predict(run, target="download", resolution=0.05)
