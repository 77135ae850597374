"""Training on tile and block splits: the tile effect's objective, and the GP saved first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geodbk import DBKRegressor
from geodbk.errors import DataError
from pipelines import train as train_stage
from pipelines.config import demo_config
from pipelines.ingest import demo_ingest_kwargs, run_ingest
from pipelines.report import run_report
from pipelines.rundir import RunDir

CFG = demo_config(quick=True).replace(epochs=2)


@pytest.fixture(scope="module", params=["block", "tile"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp(f"split_{request.param}") / "run"
    run_ingest(run=r, **{**demo_ingest_kwargs(), "split": request.param})
    return r


def test_default_training_fits_the_tile_effect_on_a_training_holdout(run: Path) -> None:
    """No validation tile has training rows: the tile effect is chosen on held-out training
    rows, the local layer on the validation tiles (predicted from their neighbours), and the
    report runs."""
    folder = train_stage.run_train(run, target="download", config=CFG, progress=False)
    md = DBKRegressor.load(folder, device="cpu").metadata_
    assert md["config"]["tile_effect"] == "on" and md["config"]["local_layer"] == "on"
    assert md["tile_effect"]["objective"] == "training hold-out"
    assert md["tile_effect"]["objective_rows"] > 50
    assert md["local_layer"]["val_nll"] is not None
    run_report(run, target="download")
    metrics = json.loads((run / "report" / "download" / "metrics.json").read_text())
    assert metrics["tile_effect"]["objective"] == "training hold-out"


def test_a_failed_post_fit_step_keeps_the_trained_gp(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0")

    monkeypatch.setattr(train_stage, "fit_run_tile_effect", broken)
    with pytest.raises(DataError, match="trained and saved") as info:
        train_stage.run_train(run, target="upload", config=CFG, progress=False)
    assert "max()" in str(info.value)
    folder = RunDir(run).model_dir("upload")
    model = DBKRegressor.load(folder, device="cpu")  # the GP is there
    assert "tile_effect" not in model.metadata_ and len(model.metadata_["history"]) == 2
    assert (folder / "history.csv").is_file() and (folder / "config.yaml").is_file()
    assert not (folder / "tile_effect.json").exists()
    assert not (folder / "local_layer.json").exists()
