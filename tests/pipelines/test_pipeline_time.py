"""Time as an input (issue 10): train --time, predict --quarter / --trend, export, lazy grids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rioxarray
import xarray as xr

from geodbk import DBKRegressor
from geodbk.errors import DataError, RunDirectoryError
from geodbk.geo.grids import make_grid
from geodbk.geo.table import read_tile_table
from geodbk.geo.timeaxis import TimeScaling
from pipelines import cli
from pipelines.config import TrainConfig, demo_config, dump_config
from pipelines.export import run_export
from pipelines.ingest import demo_ingest_kwargs, run_ingest
from pipelines.predict import TREND_VARS, parse_trend, run_predict
from pipelines.rundir import RunDir, model_inputs, scale_lonlat, target_spec
from pipelines.train import _check_resume, _resume_keys, run_train
from pipelines.training_data import split_arrays, time_axis

REPO = Path(__file__).resolve().parents[2]
CFG = demo_config(quick=True).replace(epochs=2)
GRID = {"max_cells": 900}
TREND = ("2023Q1", "2023Q4")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded synthetic region (2023Q1..Q4): a time-aware download model (with its
    2023Q4, 2023Q1, 2023Q2 and 2024Q2 grids and the 2023Q1:2023Q4 trend) and a pooled upload
    model."""
    r = tmp_path_factory.mktemp("time") / "run"
    run_ingest(run=r, **demo_ingest_kwargs())
    run_train(r, target="download", config=CFG, time=True, progress=False)
    run_train(r, target="upload", config=CFG.replace(epochs=1), progress=False)
    run_predict(r, target="download", **GRID)
    run_predict(r, target="download", quarter="2023Q1:2023Q2", **GRID)
    run_predict(r, target="download", quarter="2024Q2", **GRID)
    run_predict(r, target="download", trend=f"{TREND[0]}:{TREND[1]}", **GRID)
    run_predict(r, target="upload", **GRID)
    return r


def _model(run: Path, target: str = "download") -> DBKRegressor:
    return DBKRegressor.load(run / "models" / target, device="cpu")


def test_time_aware_metadata(run: Path) -> None:
    md = _model(run).metadata_
    assert md["inputs"] == ["x1", "x2", "t"]
    # random split: the train split holds every quarter
    assert md["time_scaling"] == {"first": "2023Q1", "last": "2023Q4"}
    assert md["quarters"] == ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
    assert md["config"]["time"] is True and _model(run).n_features_in_ == 3
    pooled = _model(run, "upload").metadata_
    assert pooled["inputs"] == ["x1", "x2"] and "time_scaling" not in pooled
    assert pooled["config"]["time"] is False


def test_split_arrays_time_column_aligned(run: Path) -> None:
    gdf, _ = read_tile_table(run / "tiles.parquet")
    ts = TimeScaling("2023Q1", "2023Q4")
    pooled = split_arrays(gdf, "download", source=run)
    timed = split_arrays(gdf, "download", source=run, time_scaling=ts)
    for name in ("train", "val", "test"):
        X2, y2 = pooled[name]
        X3, y3 = timed[name]
        assert X3.shape == (len(y2), 3)
        np.testing.assert_array_equal(X3[:, :2], X2)
        np.testing.assert_array_equal(y3, y2)
    part = gdf[gdf["split"] == "train"]
    want = ts.scale(part["quarter"].to_numpy())  # every row is finite here
    np.testing.assert_allclose(timed["train"][0][:, 2], want)
    assert set(np.round(timed["train"][0][:, 2], 6)) == {
        -1.0,
        round(-1 / 3, 6),
        round(1 / 3, 6),
        1.0,
    }


def test_distributed_shards_read_the_time_input(run: Path) -> None:
    from pipelines.sharding import read_time_axis, split_rows

    rd = RunDir(run)
    gdf, _ = read_tile_table(rd.tiles)
    ts, quarters = read_time_axis(rd)
    assert (ts, quarters) == time_axis(gdf["quarter"], gdf["split"], source=rd.tiles)
    shards = [
        split_rows(rd, "download", "train", rank=k, world_size=2, time_scaling=ts) for k in (0, 1)
    ]
    X = np.concatenate([s[0] for s in shards])
    want = split_arrays(gdf, "download", source=rd.tiles, time_scaling=ts)["train"][0]
    assert X.shape == want.shape
    order = np.lexsort(X.T)
    np.testing.assert_array_equal(X[order], want[np.lexsort(want.T)])


def test_time_is_a_resume_key(tmp_path: Path) -> None:
    assert "time" in _resume_keys(TrainConfig())
    assert _resume_keys(TrainConfig(time=True)) != _resume_keys(TrainConfig())
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text(dump_config(TrainConfig()))
    (ckpt / "last.pt").write_bytes(b"x")
    assert _check_resume(ckpt, TrainConfig(), True)
    with pytest.raises(DataError, match="different config"):
        _check_resume(ckpt, TrainConfig(time=True), True)
    with pytest.raises(DataError, match="'time' must be bool"):
        TrainConfig(time="yes")  # type: ignore[arg-type]


def test_default_quarter_grid_is_the_latest(run: Path) -> None:
    grids = run / "grids"
    assert (grids / "download.nc").is_file()
    assert not (grids / "download_2023Q4.nc").exists()
    with xr.open_dataset(grids / "download.nc") as ds:
        assert ds.attrs["time_aware"] == 1 and ds.attrs["quarter"] == "2023Q4"
        assert ds.attrs["quarter_status"] == "observed"
        assert np.isfinite(ds["mean"].values[ds["in_region"].values]).all()


def test_other_quarters_differ_and_future_is_flagged(run: Path) -> None:
    grids = run / "grids"
    with (
        xr.open_dataset(grids / "download.nc") as q4,
        xr.open_dataset(grids / "download_2023Q2.nc") as q2,
        xr.open_dataset(grids / "download_2024Q2.nc") as fut,
    ):
        assert q2.attrs["quarter"] == "2023Q2" and q2.attrs["quarter_status"] == "observed"
        inside = q4["in_region"].values
        np.testing.assert_array_equal(q2["in_region"].values, inside)
        diff = np.abs(q2["mean"].values - q4["mean"].values)[inside]
        assert diff.max() > 1e-4
        assert fut.attrs["quarter"] == "2024Q2"
        assert fut.attrs["quarter_status"] == "extrapolation beyond 2023Q4"
        # the same grid and model: only t differs, so the map at 2023Q2 is the model at t=-1/3
        model = _model(run)
        lon2, lat2 = np.meshgrid(q2["x"].values, q2["y"].values)
        X2 = scale_lonlat(lon2[inside], lat2[inside], model.metadata_["input_scaling"])
        X = model_inputs(X2, model.metadata_, quarter="2023Q2")
        np.testing.assert_allclose(
            q2["area_mean"].values[inside], model.predict_dist(X).mean, rtol=1e-5
        )


def test_trend_grid(run: Path) -> None:
    path = run / "grids" / f"download_trend_{TREND[0]}_{TREND[1]}.nc"
    with (
        xr.open_dataset(path) as tr,
        xr.open_dataset(run / "grids" / "download_2023Q1.nc") as q1,
        xr.open_dataset(run / "grids" / "download.nc") as q4,
    ):
        for v in (*TREND_VARS, "in_region"):
            assert v in tr, v
        a = tr.attrs
        assert a["product"] == "trend" and a["time_aware"] == 1
        assert (a["first_quarter"], a["last_quarter"]) == TREND and a["years"] == 0.75
        inside = tr["in_region"].values
        ch = tr["change_per_year"].values[inside]
        lo, hi = tr["change_lower"].values[inside], tr["change_upper"].values[inside]
        p = tr["p_improved"].values[inside]
        assert np.isfinite(ch).all() and np.all(lo < ch) and np.all(ch < hi)
        assert np.all((p >= 0) & (p <= 1))
        # download: improved = higher; an interval above 0 means P(improved) > 0.975
        assert np.all(p[lo > 0] > 0.97) and np.all(p[hi < 0] < 0.03)
        assert np.all((p > 0.5) == (ch > 0))
        np.testing.assert_allclose(tr["ratio_per_year"].values[inside], 10.0**ch, rtol=1e-5)
        np.testing.assert_allclose(tr["ratio_lower"].values[inside], 10.0**lo, rtol=1e-5)
        # the change of the latent mean is the difference of the two quarters' maps
        want = (q4["area_mean"].values - q1["area_mean"].values)[inside] / 0.75
        np.testing.assert_allclose(ch, want, atol=2e-5)
        assert np.isnan(tr["change_per_year"].values[~inside]).all()


def test_trend_block_formulas() -> None:
    from scipy.stats import norm

    from pipelines.predict import trend_block

    class Fake:  # change mean m and variance v of f(Q2) - f(Q1)
        def predict_change(self, a: np.ndarray, b: np.ndarray, *, chunk_size: int) -> tuple:
            return np.array([0.0, 0.1, -0.1, 0.1]), np.array([0.0, 0.0, 0.0, 0.04])

    X = np.zeros((4, 3))
    for target, sign in (("download", 1.0), ("latency", -1.0)):
        out = trend_block(Fake(), target_spec(target), X, X, years=0.5, chunk_size=8)
        np.testing.assert_allclose(out["change_per_year"], [0.0, 0.2, -0.2, 0.2])
        np.testing.assert_allclose(out["change_upper"][3], (0.1 + norm.ppf(0.975) * 0.2) / 0.5)
        want_p = [0.5, (1 + sign) / 2, (1 - sign) / 2, norm.cdf(sign * 0.1 / 0.2)]
        np.testing.assert_allclose(out["p_improved"], want_p)
        np.testing.assert_allclose(out["ratio_lower"], 10 ** out["change_lower"])
    with pytest.raises(DataError, match="later"):
        trend_block(Fake(), target_spec("download"), X, X, years=0.0, chunk_size=8)


def test_trend_spec_checks() -> None:
    assert parse_trend("2019q4:2023Q4") == ("2019Q4", "2023Q4")
    for bad in ("2023Q4:2023Q1", "2023Q4:2023Q4", "2023Q4", "2023Q1:2023Q2:2023Q3"):
        with pytest.raises(DataError):
            parse_trend(bad)


def test_pooled_grid_attributes(run: Path) -> None:
    with xr.open_dataset(run / "grids" / "upload.nc") as ds:
        assert ds.attrs["time_aware"] == 0
        assert ds.attrs["quarter"] == "pooled 2023Q1:2023Q4"
        # the tile quantity of a pooled model: one surface, measured tiles' latest offsets
        want = "pooled; tile offsets at 2023Q4" if ds.attrs["tile_effect"] else "pooled"
        assert ds.attrs["quarter_status"] == want


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pipelines.cli", *argv]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_pooled_model_refuses_quarter_and_trend_via_cli(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ("--run", str(run), "--target", "upload")
    proc = _cli("predict", *base, "--quarter", "2023Q2")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "--time" in proc.stderr and "retrain" in proc.stderr
    for stage, extra in (
        ("predict", ("--trend", "2023Q1:2023Q4")),
        ("export", ("--quarter", "2023Q2")),
        ("export", ("--trend", "2023Q1:2023Q4")),
    ):
        assert cli.main([stage, *base, *extra]) == 3, (stage, extra)
        err = capsys.readouterr().err
        assert "--time" in err and "retrain" in err
    assert not (run / "grids" / "upload_2023Q2.nc").exists()
    # a trend whose second quarter is not later: bad data too
    assert (
        cli.main(["predict", "--run", str(run), "--target", "download", "--trend", "2023Q4:2023Q1"])
        == 3
    )
    assert "must be after" in capsys.readouterr().err


def test_cli_flags_parse() -> None:
    parser = cli.build_parser()
    argv = ["train", "--run", "r", "--target", "download"]
    assert parser.parse_args(argv).time is None  # the config file decides
    assert parser.parse_args([*argv, "--time"]).time is True
    args = parser.parse_args(["predict", "--run", "r", "--target", "download", "--quarter", "all"])
    assert args.quarter == "all" and args.trend is None
    with pytest.raises(SystemExit):
        parser.parse_args(
            ["export", "--run", "r", "--quarter", "2023Q1", "--trend", "2023Q1:2023Q4"]
        )


def test_export_quarter_and_trend(run: Path) -> None:
    tifs = run_export(run, target="download", quarter="2023Q2")
    tifs += run_export(run, target="download", trend=f"{TREND[0]}:{TREND[1]}")
    tifs += run_export(run, target="download", quarter="2023Q4")  # from grids/download.nc
    exports = run / "exports"
    assert [t.name for t in tifs] == [
        "download_2023Q2.tif",
        f"download_trend_{TREND[0]}_{TREND[1]}.tif",
        "download_2023Q4.tif",
    ]
    arr = rioxarray.open_rasterio(exports / "download_2023Q2.tif", masked=True)
    assert isinstance(arr, xr.DataArray)
    desc = list(arr.attrs["long_name"])
    assert all(d.endswith(", 2023Q2") for d in desc), desc
    side = json.loads((exports / "download_2023Q2.json").read_text())
    assert side["quarter"] == "2023Q2" and side["time_aware"] == 1
    assert side["band_descriptions"] == desc
    with xr.open_dataset(run / "grids" / "download_2023Q2.nc") as ds:
        np.testing.assert_allclose(arr.values[0], ds["mean"].values, equal_nan=True)
    tr = rioxarray.open_rasterio(exports / f"download_trend_{TREND[0]}_{TREND[1]}.tif")
    assert isinstance(tr, xr.DataArray)
    tdesc = list(tr.attrs["long_name"])
    assert tdesc[0] == "change_per_year: latent mean f(x), change per year 2023Q1→2023Q4"
    assert all(d.endswith("change per year 2023Q1→2023Q4") for d in tdesc) and len(tdesc) == 7
    tside = json.loads((exports / f"download_trend_{TREND[0]}_{TREND[1]}.json").read_text())
    assert tside["product"] == "trend"
    assert (tside["first_quarter"], tside["last_quarter"]) == TREND
    side4 = json.loads((exports / "download_2023Q4.json").read_text())
    assert side4["quarter"] == "2023Q4" and side4["grid"].endswith("download.nc")
    with pytest.raises(RunDirectoryError, match="--quarter 2023Q3"):
        run_export(run, target="download", quarter="2023Q3")  # never predicted


def test_export_all_keeps_working(run: Path) -> None:
    tifs = run_export(run, fmt="gtiff")
    assert sorted(t.name for t in tifs) == ["download.tif", "upload.tif"]
    up = json.loads((run / "exports" / "upload.json").read_text())
    assert up["quarter"] == "pooled 2023Q1:2023Q4" and up["time_aware"] == 0
    assert "test_sd: test: single speed test (tests=1)" in up["band_descriptions"]
    assert "std_f: area: neighbourhood level f(x)" in up["band_descriptions"]
    down = json.loads((run / "exports" / "download.json").read_text())
    assert down["quarter"] == "2023Q4"
    assert all(d.endswith(", 2023Q4") for d in down["band_descriptions"])
    # --all with --quarter skips the pooled target
    assert [t.name for t in run_export(run, quarter="2023Q2")] == ["download_2023Q2.tif"]


def test_lazy_grid_of_a_quarter(run: Path) -> None:
    from pipelines.lazygrid import grid_dataset
    from pipelines.predict import predict_block

    model = _model(run)
    md = model.metadata_
    spec = target_spec("download")
    sc = md["input_scaling"]
    grid = make_grid((sc["lon_min"], sc["lat_min"], sc["lon_max"], sc["lat_max"]), max_cells=400)
    ds = grid_dataset(
        model, spec, grid, scaling=sc, thresholds=(25,), quarter="2023Q2", chunks=(8, 8)
    )
    assert ds.attrs["quarter"] == "2023Q2" and ds.attrs["time_aware"] == 1
    lon2, lat2 = np.meshgrid(grid.x, grid.y)
    X = model_inputs(scale_lonlat(lon2.ravel(), lat2.ravel(), sc), md, quarter="2023Q2")
    eager = predict_block(model, spec, X, (25.0,), chunk_size=4096)
    np.testing.assert_allclose(ds["mean"].values.ravel(), eager["mean"], rtol=1e-5)
    default = grid_dataset(model, spec, grid, scaling=sc, thresholds=(25,))
    assert default.attrs["quarter"] == "2023Q4"
    with pytest.raises(DataError, match="--time"):
        grid_dataset(
            _model(run, "upload"), spec, grid, scaling=sc, thresholds=(25,), quarter="2023Q2"
        )


@pytest.mark.parametrize("target", ["download", "upload"])
def test_tile_quantity_maps_use_the_local_layer(run: Path, target: str) -> None:
    """The default map is the tile quantity of the local layer (tile effect plus spatial
    field): each cell is its zoom-16 tile at the map's quarter (time-aware) or the table's
    latest (pooled), the same numbers as :func:`geodbk.quantities.predict_quantity`."""
    import geopandas as gpd

    from geodbk.geo.quadkey import lonlat_to_tile, tile_to_quadkey
    from geodbk.geo.timeaxis import quarter_index
    from geodbk.quantities import predict_quantity
    from pipelines.layers import load_map_layers
    from pipelines.predict import PART_VARS

    rd = RunDir(run)
    model = _model(run, target)
    effect, layer = load_map_layers(rd, target, model)
    assert effect is not None and layer is not None
    assert model.metadata_["config"]["local_layer"] == "on"
    table = gpd.read_parquet(rd.tiles, columns=["quadkey", "split", "geometry"])
    measured = set(table["quadkey"][table["split"] != "test"])  # the test split stays held out
    with xr.open_dataset(run / "grids" / f"{target}.nc") as ds:
        assert ds.attrs["quantity"] == "tile" and ds.attrs["tile_effect"] == 1
        assert ds.attrs["local_layer"] == 1
        assert (
            ds["std"].attrs["quantity"] == "tile: what the tile here typically gets (local layer)"
        )
        for v in PART_VARS:
            assert v in ds, v
        inside = ds["in_region"].values
        lon, lat = np.meshgrid(ds["x"].values, ds["y"].values)
        lon, lat = lon[inside], lat[inside]
        v = {n: ds[n].values[inside].astype(np.float64) for n in (*PART_VARS, "mean", "std")}
        urban = ds["urban"].values[inside] == 1 if "urban" in ds else None
    keys = tile_to_quadkey(*lonlat_to_tile(lon, lat, 16), 16)
    has = np.isin(keys, list(measured))
    assert has.any() and (~has).any()
    np.testing.assert_array_equal(v["tile_history"] == 1, has)
    np.testing.assert_allclose(v["mean"], v["tile_mean"], rtol=1e-6)
    np.testing.assert_allclose(v["tile_mean"], v["area_mean"] + v["tile_offset"], atol=1e-5)
    np.testing.assert_allclose(v["std"], v["tile_sd"], rtol=1e-6)
    assert np.all(v["test_sd"] >= v["tile_sd"])
    # a tile without history is all neighbours' pull
    np.testing.assert_allclose(v["tile_offset"][~has], v["tile_pull"][~has], atol=1e-6)
    assert np.abs(v["tile_offset"][has]).max() > 0.01
    md = model.metadata_
    quarter = md["quarters"][-1] if md.get("time_scaling") else None
    if urban is None and effect.grouped:
        geom = gpd.read_file(rd.urban_areas).geometry.union_all()
        import shapely

        urban = np.asarray(shapely.intersects_xy(geom, lon, lat), dtype=bool)
    q = predict_quantity(
        model,
        model_inputs(scale_lonlat(lon, lat, md["input_scaling"]), md, quarter=quarter),
        quantity="tile",
        effect=effect,
        layer=layer,
        tiles=keys,
        times=float(quarter_index(quarter or md["tiles_metadata"]["quarters"][-1])),
        urban=urban,
    )
    np.testing.assert_allclose(v["tile_mean"], q.mean, atol=1e-5)
    np.testing.assert_allclose(v["tile_sd"], q.sd, rtol=1e-5)


def test_area_and_test_quantities_on_request(run: Path, tmp_path: Path) -> None:
    import shutil

    r = tmp_path / "copy"
    shutil.copytree(run, r)
    run_predict(r, target="upload", quantity="area", **GRID)
    with xr.open_dataset(r / "grids" / "upload.nc") as ds:
        inside = ds["in_region"].values
        assert ds.attrs["quantity"] == "area" and ds.attrs["tile_effect"] == 0
        np.testing.assert_allclose(ds["std"].values[inside], ds["std_f"].values[inside])
        np.testing.assert_allclose(ds["mean"].values[inside], ds["area_mean"].values[inside])
        # the tile and test parts need the tile effect, which an area map does not evaluate
        assert ds.attrs["tile_parts_omitted"] == 1
        assert not {"tile_mean", "tile_sd", "tile_history", "test_sd"} & set(ds.data_vars)
    run_predict(r, target="upload", quantity="test", **GRID)
    with xr.open_dataset(r / "grids" / "upload.nc") as ds:
        inside = ds["in_region"].values
        assert ds.attrs["quantity"] == "test" and ds.attrs["tile_effect"] == 1
        np.testing.assert_allclose(ds["std"].values[inside], ds["test_sd"].values[inside])
        # one test's mean: the tile's moved by the tile effect's tests shift, recorded
        shift = ds.attrs["test_mean_shift"]
        assert shift != 0.0
        np.testing.assert_allclose(
            ds["mean"].values[inside], ds["tile_mean"].values[inside] + shift, atol=1e-5
        )
    with pytest.raises(DataError, match="--quantity"):
        run_predict(r, target="upload", quantity="latent", **GRID)
