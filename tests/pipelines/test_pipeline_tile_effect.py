"""The tile effect through the pipelines: train --tile-effect, report, stale files, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import xarray as xr

from geodbk.errors import DataError, ModelFileError
from geodbk.geo.table import read_tile_table, write_tile_table
from geodbk.geo.tile_effect_files import has_tile_effect
from geodbk.tile_effect import TileEffect, urban_groups
from pipelines import cli
from pipelines.config import TrainConfig, demo_config, dump_config
from pipelines.ingest import demo_ingest_kwargs, run_ingest
from pipelines.predict import run_predict
from pipelines.report import run_report
from pipelines.train import run_train

CFG = demo_config(quick=True).replace(epochs=2)
OFFSET_SD = 0.3


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The embedded region (2023Q1..Q4) with a persistent N(0, 0.3²) offset per tile added to
    log10 download in every quarter; trained without and with the tile effect, both
    reported."""
    base = tmp_path_factory.mktemp("tile") / "plain"
    run_ingest(run=base, **demo_ingest_kwargs())
    gdf, meta = read_tile_table(base / "tiles.parquet")
    codes = np.unique(gdf["quadkey"].astype(str), return_inverse=True)[1]
    offset = np.random.default_rng(7).normal(0.0, OFFSET_SD, codes.max() + 1)
    gdf["log10_download"] = gdf["log10_download"] + offset[codes]
    write_tile_table(gdf, base / "tiles.parquet", meta)
    tiled = base.with_name("tiled")
    shutil.copytree(base, tiled)
    run_train(base, target="download", config=CFG, progress=False, tile_effect="off")
    run_train(tiled, target="download", config=CFG, progress=False)  # auto: 4 quarters, val
    run_report(base, target="download")
    run_report(tiled, target="download")
    return {"plain": base, "tiled": tiled}


def _metrics(run: Path) -> dict:
    return json.loads((run / "report" / "download" / "metrics.json").read_text())


def test_tile_effect_is_saved_and_lowers_the_test_nll(runs: dict[str, Path]) -> None:
    model_dir = runs["tiled"] / "models" / "download"
    assert has_tile_effect(model_dir)
    assert not has_tile_effect(runs["plain"] / "models" / "download")
    md = json.loads((model_dir / "model.json").read_text())["metadata"]
    params = md["tile_effect"]
    assert params["components"] == ["floor", "meas", "dev"]  # tests+devices, the default noise
    # auto: the demo has urban and rural tiles, each with 100+ val rows: a tau² per class
    assert md["config"]["tile_effect_groups"] == "urban"
    assert list(params["tau2"]) == ["rural", "urban"]
    # the injected offset has variance 0.09 in both classes; the GP's smooth misfit adds to it
    assert min(params["tau2"].values()) > 0.03
    assert params["val_nll"] < params["val_nll_without"] - 0.1
    plain, tiled = _metrics(runs["plain"]), _metrics(runs["tiled"])
    assert "tile_effect" not in plain
    assert tiled["tile_effect"] == params
    assert tiled["all"]["nll"] < plain["all"]["nll"] - 0.1
    assert 0.85 < tiled["all"]["coverage95"] < 1.0
    text = (runs["tiled"] / "report" / "download" / "report.md").read_text()
    assert "## Tile effect" in text
    assert f"{params['tau2']['rural']:.4f} for rural tiles" in text
    assert f"{params['tau2']['urban']:.4f} for urban tiles" in text


def test_report_predictions_are_the_gp_plus_the_offset(runs: dict[str, Path]) -> None:
    """predictions.parquet of the tiled run = the plain GP of the same model + the offset of
    its local layer (the tile effect plus its neighbours' pull, on by default) + each row's
    own tests shift."""
    from geodbk import DBKRegressor
    from geodbk.geo.timeaxis import quarter_indices
    from pipelines.layers import load_map_layers
    from pipelines.rundir import RunDir

    run = runs["tiled"]
    model = DBKRegressor.load(run / "models" / "download", device="cpu")
    effect, layer = load_map_layers(RunDir(run), "download", model)
    assert layer is not None
    pred = pq.read_table(run / "report" / "download" / "predictions.parquet").to_pandas()
    tiles, _ = read_tile_table(run / "tiles.parquet")
    rows = tiles.set_index(["quadkey", "quarter"]).loc[
        list(zip(pred["quadkey"], pred["quarter"], strict=True))
    ]
    X = rows[["x1", "x2"]].to_numpy(dtype=np.float64)
    kw = {"tests": pred["tests"].to_numpy(), "devices": pred["devices"].to_numpy()}
    gp = model.predict_dist(X, quantity="latent", **kw)
    _, comp = model.noise_components(**kw)
    rows_kw = {
        "tiles": pred["quadkey"].to_numpy(),
        "times": quarter_indices(pred["quarter"]).astype(float),
        "var_f": gp.var_f,
        "components": comp,
        "groups": urban_groups(pred["urban"]),
    }
    full = layer.predict(**rows_kw)
    assert full.tests_shift is not None and np.abs(full.tests_shift).max() > 1e-3
    np.testing.assert_allclose(
        pred["mean"], gp.mean + full.shift + full.tests_shift, rtol=1e-6, atol=1e-8
    )
    np.testing.assert_allclose(pred["std"], np.sqrt(full.tile_var + full.noise_var), rtol=1e-5)
    # the tile effect's own part: history narrows a seen tile below its class prior
    part = effect.predict(**rows_kw)
    # the demo's tiles are not in every quarter: some test rows' tiles are seen, some are not
    assert 0.2 < part.seen.mean() < 1.0
    assert (part.shift[~part.seen] == 0).all()
    tau2 = np.where(pred["urban"], effect.params.tau2["urban"], effect.params.tau2["rural"])
    prior = tau2 + effect.params.latent_scale * gp.var_f
    np.testing.assert_allclose(part.tile_var[~part.seen], prior[~part.seen])
    # a tile's history narrows its variance below the prior of its class
    assert (part.tile_var[part.seen] < prior[part.seen]).all()


def test_retraining_without_removes_the_tile_effect(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "again"
    shutil.copytree(runs["tiled"], run)
    run_train(
        run, target="download", config=CFG.replace(epochs=1), progress=False, tile_effect=False
    )
    assert not has_tile_effect(run / "models" / "download")
    run_report(run, target="download")
    assert "tile_effect" not in _metrics(run)


def test_a_foreign_tile_effect_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "foreign"
    shutil.copytree(runs["tiled"], run)
    path = run / "models" / "download" / "tile_effect.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "tau2": {k: 2 * v for k, v in doc["tau2"].items()}}))
    with pytest.raises(ModelFileError, match="do not belong to this model"):
        run_report(run, target="download")
    (run / "models" / "download" / "tile_effect_rows.parquet").unlink()
    with pytest.raises(ModelFileError, match="--tile-effect"):
        run_report(run, target="download")


def test_an_area_map_does_not_read_the_tile_effect(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "area"
    shutil.copytree(runs["tiled"], run)
    (run / "models" / "download" / "tile_effect_rows.parquet").unlink()
    grid = run_predict(run, target="download", quantity="area", resolution=0.05)
    with xr.open_dataset(grid) as ds:
        assert ds.attrs["quantity"] == "area" and ds.attrs["tile_parts_omitted"] == 1
        assert ds.attrs["tile_effect"] == 0 and "tile_offset" not in ds
    with pytest.raises(ModelFileError, match=r"tile_effect_rows\.parquet"):
        run_predict(run, target="download", quantity="tile", resolution=0.05)


def test_a_map_without_a_tile_effect_says_its_tile_parts_are_unused(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "plain"
    shutil.copytree(runs["plain"], run)
    grid = run_predict(run, target="download", resolution=0.05)
    with xr.open_dataset(grid) as ds:
        assert ds.attrs["tile_effect"] == 0
        # the measured tiles' history is not used, so no cell is flagged as having it ...
        assert float(ds["tile_history"].max()) == 0.0 and float(ds["tile_offset"].max()) == 0.0
        # ... and the variables say why, rather than that no tile was measured
        for name in ("tile_offset", "tile_pull", "tile_history"):
            assert (
                ds[name].attrs["long_name"].endswith("0 everywhere: the model has no tile effect")
            )
    shutil.copytree(runs["tiled"], tmp_path / "tiled")
    tiled = run_predict(tmp_path / "tiled", target="download", resolution=0.05, force=True)
    with xr.open_dataset(tiled) as ds:
        assert float(ds["tile_history"].max()) == 1.0
        assert "0 everywhere" not in ds["tile_history"].attrs["long_name"]
        assert "0 everywhere" not in ds["tile_pull"].attrs["long_name"]  # the layer is on


def test_a_model_trained_before_the_persistent_share_still_loads(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Model metadata and tile_effect.json written without ``persistent_scale`` (older runs)
    read as a zero share, not as a foreign tile effect."""
    run = tmp_path / "older"
    shutil.copytree(runs["tiled"], run)
    folder = run / "models" / "download"
    for name in ("model.json", "tile_effect.json"):
        doc = json.loads((folder / name).read_text())
        params = doc["metadata"]["tile_effect"] if name == "model.json" else doc
        assert params.pop("persistent_scale") == [0.0] * len(params["components"])
        (folder / name).write_text(json.dumps(doc))
    run_report(run, target="download")
    assert _metrics(run)["tile_effect"]["persistent_scale"] == [0.0] * 3


def test_cli_flags_config_and_refusals(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "cli"
    shutil.copytree(runs["plain"], run)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(dump_config(CFG.replace(epochs=1)))
    argv = ["train", "--run", str(run), "--target", "download", "--config", str(cfg)]
    model_json = run / "models" / "download" / "model.json"
    assert cli.main([*argv, "--no-progress", "--no-tile-effect"]) == 0
    md = json.loads(model_json.read_text())["metadata"]
    assert md["config"]["tile_effect"] == "off" and "tile_effect" not in md
    assert cli.main([*argv, "--no-progress", "--tile-effect"]) == 0
    md = json.loads(model_json.read_text())["metadata"]
    assert md["config"]["tile_effect"] == "on" and "tile_effect" in md
    # one tau² for every tile on request
    assert cli.main([*argv, "--no-progress", "--tile-effect-groups", "none"]) == 0
    md = json.loads(model_json.read_text())["metadata"]
    assert md["config"]["tile_effect_groups"] == "none" and list(md["tile_effect"]["tau2"]) == [
        "all"
    ]
    run_report(run, target="download")
    assert list(_metrics(run)["tile_effect"]["tau2"]) == ["all"]
    # YAML booleans work; a typo names the key
    cfg.write_text(dump_config(CFG.replace(epochs=1)) + "\ntile_effect: false\n")
    assert cli.main([*argv, "--no-progress"]) == 0
    assert json.loads(model_json.read_text())["metadata"]["config"]["tile_effect"] == "off"
    with pytest.raises(DataError, match="tile_effect"):
        TrainConfig(tile_effect="yes")
    with pytest.raises(DataError, match="tile_effect"):
        TrainConfig(streaming=True, tile_effect=True)
    with pytest.raises(DataError, match="tile_effect_groups"):
        TrainConfig(tile_effect_groups="tracts")
    with pytest.raises(DataError, match="--distributed"):
        run_train(run, target="download", config=CFG, tile_effect=True, distributed=True)
    # fitted after training: not a key a resumed run must match
    from pipelines.train import _resume_keys

    assert _resume_keys(CFG.replace(tile_effect="on")) == _resume_keys(
        CFG.replace(tile_effect="off", tile_effect_groups="none")
    )


def test_auto_is_off_for_one_quarter_and_out_of_core(tmp_path: Path) -> None:
    """auto: a one-quarter table has no other quarters to learn from; --streaming is off."""
    from pipeline_helpers import make_run

    run = make_run(tmp_path / "one", n=300)
    cfg = CFG.replace(epochs=1)
    run_train(run, target="download", config=cfg, progress=False)
    md = json.loads((run / "models" / "download" / "model.json").read_text())["metadata"]
    assert md["config"]["tile_effect"] == "off"
    run_train(run, target="download", config=cfg.replace(streaming=True), progress=False)
    md = json.loads((run / "models" / "download" / "model.json").read_text())["metadata"]
    assert md["config"]["tile_effect"] == "off" and md["config"]["streaming"] is True


def test_tile_coverage_uses_each_tiles_offset(runs: dict[str, Path]) -> None:
    """Two tiles at the same place: the one whose history is 2.5 log10 above the GP is served
    at a threshold far above the GP's prediction; the unseen one is not."""
    import pyarrow as pa

    from geodbk import DBKRegressor
    from geodbk.tile_effect import TileEffectParameters
    from pipelines.report import service_coverage
    from pipelines.rundir import RunDir, target_spec

    run = runs["tiled"]
    model = DBKRegressor.load(run / "models" / "download", device="cpu")
    params = TileEffectParameters(
        tau2=4.0, rho=1.0, noise_scale=(1.0, 1.0, 1.0), components=("floor", "meas", "dev")
    )
    effect = TileEffect(
        params,
        tiles=["A"] * 4,
        times=[8092.0, 8093.0, 8094.0, 8095.0],  # 2023Q1..Q4
        residual=[2.5] * 4,
        var_f=[0.0] * 4,
        components=[[0.001, 0.0, 0.0]] * 4,
    )
    tiles = pa.table({"quadkey": ["A", "B"], "x1": [0.0, 0.0], "x2": [0.0, 0.0], "urban": [1, 0]})
    spec = target_spec("download")
    gp_mbps = 10 ** float(model.predict_dist(np.zeros((1, 2))).mean[0]) / 1000
    threshold = 30 * gp_mbps
    md = model.metadata_
    args = (RunDir(run), spec, model, tiles, (threshold,), 1024)
    rows = service_coverage(*args, metadata=md, tile_effect=effect, tile_quarter="2023Q4")
    assert rows[0]["urban"] == 1.0 and rows[0]["rural"] == 0.0
    plain = service_coverage(*args, metadata=md)
    assert plain[0]["urban"] == 0.0 and plain[0]["rural"] == 0.0


def test_groups_are_resolved_from_the_urban_column() -> None:
    """auto: urban when each class has 100+ val rows, else none; urban without the column or
    without val rows in a class is refused."""
    import pandas as pd

    from pipelines.train import resolve_tile_effect_groups

    def table(n_urban_val: int, n_rural_val: int) -> pd.DataFrame:
        n = n_urban_val + n_rural_val + 50
        return pd.DataFrame(
            {
                "x1": np.zeros(n),
                "x2": np.zeros(n),
                "log10_download": np.ones(n),
                "split": ["val"] * (n_urban_val + n_rural_val) + ["train"] * 50,
                "urban": [True] * n_urban_val + [False] * n_rural_val + [True] * 50,
            }
        )

    auto = CFG.replace(tile_effect="on")
    resolved = resolve_tile_effect_groups(auto, table(100, 100), "download")
    assert resolved.tile_effect_groups == "urban"
    assert resolve_tile_effect_groups(auto, table(100, 99), "download").tile_effect_groups == "none"
    assert (
        resolve_tile_effect_groups(
            auto, table(100, 100).drop(columns="urban"), "download"
        ).tile_effect_groups
        == "none"
    )
    urban = auto.replace(tile_effect_groups="urban")
    assert resolve_tile_effect_groups(urban, table(5, 3), "download").tile_effect_groups == "urban"
    with pytest.raises(DataError, match="no validation rows"):
        resolve_tile_effect_groups(urban, table(5, 0), "download")
    with pytest.raises(DataError, match=r"'urban' column in t\.parquet"):
        resolve_tile_effect_groups(
            urban, table(5, 5).drop(columns="urban"), "download", source="t.parquet"
        )
