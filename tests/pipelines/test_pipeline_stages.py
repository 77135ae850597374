"""Train -> predict -> export -> report on a small synthetic run, checking every output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import rioxarray
import xarray as xr
import yaml
from pipeline_helpers import REGION, grid_noise_s2, make_run

from geodbk import DBKRegressor
from geodbk.errors import ModelFileError, RunDirectoryError
from geodbk.geo.grids import make_grid, region_mask
from geodbk.hyperparameters import KERNEL_UPDATE_EVERY_DPPGP_RBF
from pipelines.config import demo_config
from pipelines.export import run_export
from pipelines.predict import run_predict
from pipelines.report import run_report
from pipelines.train import run_train

CFG = demo_config(quick=True).replace(epochs=4)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = make_run(tmp_path_factory.mktemp("stages") / "run")
    run_train(r, target="download", config=CFG, progress=False)
    run_predict(r, target="download", resolution=0.02, max_block_cells=200, extent="region")
    run_export(r, target="download", fmt="gtiff")
    run_report(r, target="download")
    return r


def test_model_bundle(run: Path) -> None:
    d = run / "models" / "download"
    for name in ("weights.safetensors", "model.json", "config.yaml", "history.csv"):
        assert (d / name).is_file(), name
    model = DBKRegressor.load(d)
    md = model.metadata_
    assert md["target"] == "download" and md["log_column"] == "log10_download"
    assert set(md["input_scaling"]) == {"lon_min", "lon_max", "lat_min", "lat_max"}
    # noise "auto" is resolved from the tiles (`tests` and `devices` columns) before saving,
    # tile_effect and local_layer "auto" too (off: the table has one quarter), and
    # kernel_update_every 0 (4 for DBK-RBF under dPPGP)
    resolved = CFG.replace(
        noise="tests+devices",
        noise_init=0.5,
        tile_effect="off",
        local_layer="off",
        kernel_update_every=KERNEL_UPDATE_EVERY_DPPGP_RBF,
    ).to_dict()
    assert md["config"] == resolved and md["geodbk_version"]
    noise_keys = {"noise", "s2_floor", "s2_meas", "power", "s2_dev", "power_devices"}
    assert model.tests_aware and set(md["noise"]) == noise_keys
    assert md["timings"]["fit_seconds"] > 0 and len(md["history"]) == 4
    assert yaml.safe_load((d / "config.yaml").read_text()) == resolved
    hist = pd.read_csv(d / "history.csv")
    assert list(hist["epoch"]) == [1, 2, 3, 4] and {"train_loss", "val_nll"} <= set(hist)


def test_grid_contents_and_mask(run: Path) -> None:
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        assert ds.rio.crs.to_epsg() == 4326
        for v in (
            "mean",
            "std",
            "pi_lower",
            "pi_upper",
            "pi_width",
            "mean_natural",
            "pi_lower_natural",
            "pi_upper_natural",
            "pi_width_natural",
            "p_below_25mbps",
            "p_below_100mbps",
            "in_region",
        ):
            assert v in ds, v
        grid = make_grid(REGION.bounds, resolution=0.02)
        mask = region_mask(REGION, grid)
        assert np.array_equal(ds["in_region"].values, mask)
        mean = ds["mean"].values
        assert np.isnan(mean[~mask]).all() and np.isfinite(mean[mask]).all()
        assert np.all(np.diff(ds["y"].values) < 0)
        m = mask
        assert np.allclose(ds["pi_width"].values[m], 3.92 * ds["std"].values[m], rtol=1e-4)
        assert np.allclose(ds["mean_natural"].values[m], 10 ** mean[m] / 1000, rtol=1e-4)
        assert np.all(ds["p_below_100mbps"].values[m] >= ds["p_below_25mbps"].values[m])
        assert ds.attrs["target"] == "download" and ds.attrs["created"]
        # the tile quantity by default (one quarter: no tile effect, so f(x) plus the noise
        # floor); std_f / latent_*: the area quantity f(x); test_sd: one speed test
        assert ds.attrs["quantity"] == "tile" and ds.attrs["tests"] == 1
        assert ds.attrs["license"] == "CC BY-NC-SA 4.0" and "Ookla" in ds.attrs["source"]
        assert ds.attrs["tile_effect"] == 0
        assert (
            ds["std"].attrs["quantity"] == "tile: what the tile here typically gets (noise floor)"
        )
        assert ds["std_f"].attrs["quantity"] == "area: neighbourhood level f(x)"
        assert ds["test_sd"].attrs["quantity"] == "test: single speed test (tests=1)"
        sf = ds["std_f"].values[m]
        np.testing.assert_allclose(ds["std"].values[m], ds["tile_sd"].values[m])
        np.testing.assert_allclose(mean[m], ds["area_mean"].values[m], rtol=1e-6)
        assert np.all(ds["tile_offset"].values[m] == 0) and np.all(
            ds["tile_history"].values[m] == 0
        )
        assert np.all(ds["test_sd"].values[m] > ds["std"].values[m])
        assert np.all(ds["std"].values[m] > sf)
        assert np.allclose(ds["latent_pi_upper"].values[m], mean[m] + 1.96 * sf, atol=1e-5)
        s2 = grid_noise_s2(ds.attrs, 1)
        assert np.allclose(ds["test_sd"].values[m] ** 2, sf**2 + s2, rtol=1e-3)
        floor = ds.attrs["noise_s2_floor"]
        assert np.allclose(ds["tile_sd"].values[m] ** 2, sf**2 + floor, rtol=1e-3)


def test_grid_extent_cut_to_tiles(run: Path, tmp_path: Path) -> None:
    from pipelines.predict import grid_bounds
    from pipelines.rundir import RunDir

    wide = (-170.0, 10.0, -150.0, 30.0)  # a region box much larger than the tiles
    box = grid_bounds(RunDir(run), wide, extent="tiles")
    lon0, lat0, lon1, lat1 = REGION.bounds
    assert box[0] >= lon0 - 0.051 and box[2] <= lon1 + 0.051
    assert box[1] >= lat0 - 0.051 and box[3] <= lat1 + 0.051
    assert grid_bounds(RunDir(run), wide, extent="region") == wide


def test_export_bands_and_sidecar(run: Path) -> None:
    tif = run / "exports" / "download.tif"
    side = json.loads((run / "exports" / "download.json").read_text())
    arr = rioxarray.open_rasterio(tif, masked=True)
    assert isinstance(arr, xr.DataArray)
    names = [str(d).split(":")[0] for d in arr.attrs["long_name"]]
    assert names[0] == "mean" and names == side["bands"]
    assert list(arr.attrs["long_name"]) == side["band_descriptions"]
    desc = dict(zip(side["bands"], side["band_descriptions"], strict=True))
    assert desc["std"] == "std: tile: what the tile here typically gets (noise floor)"
    assert desc["test_sd"] == "test_sd: test: single speed test (tests=1)"
    assert desc["std_f"] == "std_f: area: neighbourhood level f(x)"
    assert arr.rio.encoded_nodata == -9999.0
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        assert np.allclose(arr.values[0], ds["mean"].values, equal_nan=True)
    for key in ("run", "model", "config_hash", "created", "geodbk_version"):
        assert side[key], key
    # tiles.parquet without a recorded licence: Ookla's, on the sidecar and the GeoTIFF tags
    assert side["license"] == "CC BY-NC-SA 4.0" and "Ookla" in side["source"]
    assert arr.attrs["license"] == "CC BY-NC-SA 4.0"
    assert arr.attrs["geodbk_quantity"] == "tile" == side["quantity"]  # named for the file too


def test_report_outputs(run: Path) -> None:
    d = run / "report" / "download"
    preds = pd.read_parquet(d / "predictions.parquet")
    assert {"quadkey", "quarter", "urban", "y", "mean", "std"} <= set(preds.columns)
    meta = pq.read_schema(d / "predictions.parquet").metadata
    assert json.loads(meta[b"geodbk_data_licence"])["license"] == "CC BY-NC-SA 4.0"
    tiles = pd.read_parquet(run / "tiles.parquet", columns=["split"])
    assert len(preds) == int((tiles["split"] == "test").sum())
    metrics = json.loads((d / "metrics.json").read_text())
    assert set(metrics) == {"urban", "rural", "all", "by_tests", "by_quarter", "map_calibration"}
    cal = metrics.pop("map_calibration")
    assert cal["quantity"] == "tile" and cal["min_tests"] == 30
    by_quarter = metrics.pop("by_quarter")
    assert sum(q["n"] for q in by_quarter.values()) == len(preds)
    by_tests = metrics.pop("by_tests")
    assert list(by_tests) == ["1", "2", "3-4", "5-8", "9-16", ">16"]
    assert sum(b["n"] for b in by_tests.values()) == len(preds)
    for b in by_tests.values():
        assert {"n", "nll", "coverage95", "width95", "urban", "rural"} <= set(b)
        assert b["urban"]["n"] + b["rural"]["n"] == b["n"]
    assert (d / "figures" / "reliability_by_tests.png").read_bytes()[:4] == b"\x89PNG"
    assert "By number of speed tests" in (d / "report.md").read_text()
    for g in metrics.values():
        for k in (
            "n",
            "mae",
            "nll",
            "rmse",
            "crps",
            "coverage95",
            "width95",
            "mae_std",
            "nll_std",
            "crps_std",
            "coverage95_std",
            "width95_std",
        ):
            assert k in g, k
    assert metrics["urban"]["n"] + metrics["rural"]["n"] == metrics["all"]["n"] == len(preds)
    summary = json.loads((d / "summary.json").read_text())
    sd = summary["y_train_sd"]
    assert metrics["all"]["nll_std"] == pytest.approx(metrics["all"]["nll"] - np.log(sd))
    assert [r["threshold"] for r in summary["service_coverage"]] == [25.0, 100.0]
    for name in ("pi_width_violin", "reliability", "sd_maps", "service_coverage"):
        png = d / "figures" / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"
    md = (d / "report.md").read_text()
    assert "urban NLL" in md and "figures/sd_maps.png" in md
    assert (d / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_missing_pieces_raise_clear_errors(run: Path, tmp_path: Path) -> None:
    with pytest.raises(RunDirectoryError, match="geodbk ingest"):
        run_train(tmp_path / "nope", target="download", config=CFG)
    with pytest.raises(ModelFileError, match="geodbk train --run"):
        run_predict(run, target="upload")
    with pytest.raises(ModelFileError, match="geodbk train --run"):
        run_export(run, target="upload")
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "grids" / "download.nc").unlink()
    with pytest.raises(RunDirectoryError, match="geodbk predict"):
        run_export(copy)
