"""Training on tile and block splits: the tile effect's objective, and the GP saved first."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.hyperparameters import KERNEL_UPDATE_EVERY_DPPGP_RBF
from pipelines import cli
from pipelines import train as train_stage
from pipelines.config import TrainConfig, demo_config
from pipelines.ingest import demo_ingest_kwargs, run_ingest
from pipelines.report import run_report
from pipelines.rundir import RunDir

CFG = demo_config(quick=True).replace(epochs=2)


@pytest.fixture(scope="module", params=["block", "tile"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp(f"split_{request.param}") / "run"
    run_ingest(run=r, **{**demo_ingest_kwargs(), "split": request.param})
    return r


def test_the_tile_effect_is_fitted_on_a_training_holdout(run: Path) -> None:
    """No validation tile has training rows: the tile effect is chosen on held-out training
    rows, the local layer on the validation tiles (predicted from their neighbours), and the
    report runs; the layer kriges with the config's number of neighbours."""
    folder = train_stage.run_train(
        run,
        target="download",
        config=CFG.replace(tile_effect="on", local_layer_neighbours=5),
        progress=False,
    )
    md = DBKRegressor.load(folder, device="cpu").metadata_
    assert md["config"]["tile_effect"] == "on" and md["config"]["local_layer"] == "on"
    assert md["tile_effect"]["objective"] == "training hold-out"
    assert md["tile_effect"]["objective_rows"] > 50
    assert md["local_layer"]["val_nll"] is not None
    # the unmeasured validation tiles chose between the two priors, and the choice is saved
    scores = md["local_layer"]["val_nll_unseen"]
    assert set(scores) == {"gp", "tile effect"}
    saved = json.loads((folder / "local_layer.json").read_text())
    assert saved["neighbours"] == 5
    assert saved["unseen_prior"] == md["local_layer"]["unseen_prior"]
    gp_wins = scores["gp"] < scores["tile effect"] - 1e-3
    assert saved["unseen_prior"] == ("gp" if gp_wins else "tile effect")
    run_report(run, target="download")
    metrics = json.loads((run / "report" / "download" / "metrics.json").read_text())
    assert metrics["tile_effect"]["objective"] == "training hold-out"
    # the map check counts the held-out blocks its tiles lie in on a block split only
    split = md["tiles_metadata"]["split"]
    cal = metrics["map_calibration"]
    if split["kind"] == "block":
        assert (
            0 < cal["held_out_blocks"] <= min(split["blocks"]["test"], cal["tile"]["all"]["tiles"])
        )
    else:
        assert "held_out_blocks" not in cal


def test_by_default_a_tile_model_worse_than_the_gp_gives_way_to_it(
    run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``tile_effect: auto`` keeps the tile effect and local layer only when their validation
    NLL is no worse than the GP alone's on the same rows; else the maps use the GP alone, the
    reason is logged and saved, and no tile-effect file is left."""
    asked = train_stage.run_train(
        run, target="download", config=CFG.replace(tile_effect="on"), progress=False
    )
    layer = DBKRegressor.load(asked, device="cpu").metadata_["local_layer"]
    worse = layer["val_nll"] > layer["val_nll_gp"]
    with caplog.at_level(logging.WARNING, logger="geodbk"):
        folder = train_stage.run_train(run, target="download", config=CFG, progress=False)
    md = DBKRegressor.load(folder, device="cpu").metadata_
    assert ("tile_effect_off" in md) == worse == ("worse than the GP alone" in caplog.text)
    assert ("tile_effect" in md) == (not worse)
    assert (folder / "tile_effect.json").is_file() == (not worse)
    if worse:  # the saved config says what the maps are
        saved = yaml.safe_load((folder / "config.yaml").read_text())
        assert saved["tile_effect"] == saved["local_layer"] == "off"
        run_report(run, target="download")  # and the report says why there is none
        text = (run / "report" / "download" / "report.md").read_text()
        assert "worse than the GP alone" in text and "kept the GP alone" in text


def test_the_place_share_counts_the_split_s_held_out_units(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a block split each validation row carries its block (the place share counts blocks,
    not tiles); on a tile split each tile is its own unit."""
    from geodbk.geo.table import read_table_metadata

    seen = {}
    real = train_stage.fit_run_local_layer

    def spy(model: object, effect: object, *, n_train: int, val: object, **kw: object) -> object:
        seen["val"] = val
        return real(model, effect, n_train=n_train, val=val, **kw)

    monkeypatch.setattr(train_stage, "fit_run_local_layer", spy)
    train_stage.run_train(run, target="download", config=CFG, progress=False)
    val = seen["val"]
    split = read_table_metadata(RunDir(run).tiles)["split"]
    if split["kind"] == "tile":
        assert val.units is None
        return
    assert val.units is not None and val.units.shape == val.tiles.shape
    assert 0 < np.unique(val.units).size <= split["blocks"]["val"]
    per_tile = pd.Series(val.units).groupby(val.tiles).nunique()
    assert (per_tile == 1).all()  # a tile lies in one block


def test_a_failed_post_fit_step_keeps_the_trained_gp(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0")

    monkeypatch.setattr(train_stage, "fit_run_tile_effect", broken)
    folder = RunDir(run).model_dir("upload")
    folder.mkdir(parents=True, exist_ok=True)  # an earlier run's tile effect and layer
    for stale in ("tile_effect.json", "tile_effect_rows.parquet", "local_layer.json"):
        (folder / stale).write_text("{}")
    with pytest.raises(DataError, match="trained and saved") as info:
        train_stage.run_train(run, target="upload", config=CFG, progress=False)
    assert "max()" in str(info.value)
    folder = RunDir(run).model_dir("upload")
    model = DBKRegressor.load(folder, device="cpu")  # the GP is there
    assert "tile_effect" not in model.metadata_ and len(model.metadata_["history"]) == 2
    assert (folder / "history.csv").is_file() and (folder / "config.yaml").is_file()
    assert not (folder / "tile_effect.json").exists()
    assert not (folder / "tile_effect_rows.parquet").exists()
    assert not (folder / "local_layer.json").exists()


def _table(train_tiles: list[int], val_tiles: list[int], quarters: int) -> pd.DataFrame:
    """One row per tile and quarter; every quarter of a val tile is val (leave-tile-out)."""
    rows = [
        (f"{t:016d}", f"2023Q{q + 1}", "train" if t in train_tiles else "val")
        for t in train_tiles + val_tiles
        for q in range(quarters)
    ]
    n = len(rows)
    return pd.DataFrame(
        {
            "quadkey": [r[0] for r in rows],
            "quarter": [r[1] for r in rows],
            "split": [r[2] for r in rows],
            "x1": np.zeros(n),
            "x2": np.zeros(n),
            "log10_download": np.ones(n),
            "urban": np.arange(n) % 2 == 0,
        }
    )


def test_auto_resolves_to_what_a_leave_tile_out_split_allows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    auto = CFG.replace(tile_effect="auto")
    on = CFG.replace(tile_effect="on")
    enough = _table(list(range(100)), list(range(100, 120)), quarters=2)  # 50 held-out rows
    resolved = train_stage.resolve_tile_effect(auto, enough, target="download", n_val=40)
    assert resolved.tile_effect == "on"
    assert train_stage.resolve_tile_effect(on, enough, target="download", n_val=40) == on
    kind, mask = train_stage.tile_effect_objective(enough, "download")
    assert kind == "training hold-out" and mask.sum() == 50
    few = _table(list(range(12)), list(range(12, 20)), quarters=2)  # 6 held-out rows
    with caplog.at_level(logging.INFO, logger="geodbk"):
        resolved = train_stage.resolve_tile_effect(auto, few, target="download", n_val=16)
    assert resolved.tile_effect == "off" and "tile effect off" in caplog.text
    with pytest.raises(DataError, match=r"6 rows of measured tiles \(training hold-out\)"):
        train_stage.resolve_tile_effect(on, few, target="download", n_val=16, source="t.parquet")
    one_quarter = _table(list(range(100)), list(range(100, 120)), quarters=1)
    with pytest.raises(DataError, match="1 quarter"):
        train_stage.resolve_tile_effect(on, one_quarter, target="download", n_val=20)


def test_groups_are_counted_on_the_training_holdout() -> None:
    cfg = CFG.replace(tile_effect="on", tile_effect_groups="auto")
    table = _table(list(range(600)), list(range(600, 700)), quarters=2)  # 200 held-out rows
    table["urban"] = table["split"] == "val"  # every training row rural, every val row urban
    resolved = train_stage.resolve_tile_effect_groups(cfg, table, "download")
    assert resolved.tile_effect_groups == "none"  # the objective rows are all rural
    with pytest.raises(DataError, match="no training hold-out rows"):
        train_stage.resolve_tile_effect_groups(
            cfg.replace(tile_effect_groups="urban"), table, "download"
        )


def test_explicit_on_is_refused_before_training(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_ingest(run=run, **{**demo_ingest_kwargs(), "split": "tile", "quarters": "2023Q4"})
    with pytest.raises(DataError, match="--tile-effect learns from a tile's other quarters"):
        train_stage.run_train(run, target="download", config=CFG, tile_effect="on", progress=False)
    assert not (RunDir(run).model_dir("download") / "model.json").exists()


def test_a_held_kernel_trains_from_the_config(tmp_path: Path) -> None:
    """``kernel_update_every: 3`` in the YAML file trains (recorded in the model's config);
    the default ``0`` is saved resolved (4 for DBK-RBF under dPPGP)."""
    from pipelines import cli
    from pipelines.config import dump_config

    run = tmp_path / "run"
    run_ingest(run=run, **demo_ingest_kwargs())
    cfg_file = tmp_path / "held.yaml"
    held = CFG.replace(kernel_update_every=3, tile_effect="off", local_layer="off")
    cfg_file.write_text(dump_config(held))
    argv = ["train", "--run", str(run), "--target", "download", "--config", str(cfg_file)]
    assert cli.main([*argv, "--no-progress"]) == 0
    md = DBKRegressor.load(RunDir(run).model_dir("download"), device="cpu").metadata_
    assert md["config"]["kernel_update_every"] == 3
    default = CFG.replace(tile_effect="off", local_layer="off")
    assert default.kernel_update_every == 0
    cfg_file.write_text(dump_config(default))
    assert cli.main([*argv, "--no-progress"]) == 0
    md = DBKRegressor.load(RunDir(run).model_dir("download"), device="cpu").metadata_
    assert md["config"]["kernel_update_every"] == KERNEL_UPDATE_EVERY_DPPGP_RBF
    saved = RunDir(run).model_dir("download") / "config.yaml"
    assert f"kernel_update_every: {KERNEL_UPDATE_EVERY_DPPGP_RBF}" in saved.read_text()


def test_the_help_lists_every_config_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    listed = text.split("any of the keys: ", 1)[1].split(".", 1)[0]
    assert listed.split(", ") == list(TrainConfig().to_dict())
