"""``geodbk train --streaming`` (issue 8): out-of-core training through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import killed_after_checkpoints, make_run
from safetensors.numpy import load_file

from geodbk import DBKRegressor
from geodbk.errors import DataError
from pipelines import cli
from pipelines.config import TrainConfig, demo_config, dump_config
from pipelines.ingest import demo_ingest_kwargs, run_ingest
from pipelines.rundir import model_inputs
from pipelines.train import run_train

CFG = demo_config(quick=True).replace(epochs=4, patience=4)


def _weights(run: Path) -> dict[str, np.ndarray]:
    return load_file(str(run / "models" / "download" / "weights.safetensors"))


def test_streaming_cli_time_aware_tests_aware(tmp_path: Path) -> None:
    """The embedded region (4 quarters, a `tests` column) trained out of core with --time:
    the bundle is time-aware and tests-aware, counts every finite training row, and its
    validation NLL improves on the first epoch's."""
    run = tmp_path / "run"
    run_ingest(run=run, **demo_ingest_kwargs())
    config = tmp_path / "cfg.yaml"
    config.write_text(dump_config(CFG.replace(epochs=6, patience=6, lr=1e-2)))
    args = ["--run", str(run), "--target", "download", "--config", str(config)]
    code = cli.main(["train", *args, "--streaming", "--time", "--no-progress"])
    assert code == 0
    model = DBKRegressor.load(run / "models" / "download", device="cpu")
    md = model.metadata_
    assert md["config"]["streaming"] is True and md["config"]["noise"] == "tests"
    assert md["inputs"] == ["x1", "x2", "t"] and model.n_features_in_ == 3
    table = pq.read_table(run / "tiles.parquet", columns=["split", "log10_download"]).to_pandas()
    train_y = table.loc[table["split"] == "train", "log10_download"].to_numpy()
    assert md["n_train"] == int(np.isfinite(train_y).sum())
    np.testing.assert_allclose(md["y_train_mean"], np.nanmean(train_y), rtol=1e-10)
    np.testing.assert_allclose(md["y_train_sd"], np.nanstd(train_y), rtol=1e-10)
    vals = [h["val_nll"] for h in model.history_]
    assert len(vals) == 6 and min(vals) < vals[0]
    test = pq.read_table(
        run / "tiles.parquet",
        columns=["x1", "x2", "quarter", "tests"],
        filters=[("split", "=", "test")],
    ).to_pandas()
    X = model_inputs(
        test[["x1", "x2"]].to_numpy(), md, quarter=test["quarter"].astype(str).to_numpy()
    )
    pred = model.predict_dist(X, tests=test["tests"].to_numpy(dtype=float))
    assert np.isfinite(pred.mean).all() and (pred.var > pred.var_f).all()


def test_streaming_killed_run_resumes_to_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after epoch 2's checkpoint and resumed with --resume, a streaming run ends with
    the weights and history of an uninterrupted streaming run."""
    cfg = CFG.replace(streaming=True)
    full = make_run(tmp_path / "full")
    run_train(full, target="download", config=cfg, progress=False)

    killed = make_run(tmp_path / "killed")
    with killed_after_checkpoints(monkeypatch, 2):
        run_train(killed, target="download", config=cfg, progress=False)
    assert not (killed / "models" / "download" / "model.json").exists()
    run_train(killed, target="download", config=cfg, resume=True, progress=False)
    a, b = _weights(full), _weights(killed)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    ha = DBKRegressor.load(full / "models" / "download").history_
    hb = DBKRegressor.load(killed / "models" / "download").history_
    assert [h["train_loss"] for h in ha] == [h["train_loss"] for h in hb] and len(hb) == 4


def test_streaming_refusals(tmp_path: Path) -> None:
    """--streaming with --distributed, and streaming with the exact objective, are refused with
    a message naming the conflict (exit code 3 through the CLI)."""
    run = make_run(tmp_path / "run")
    code = cli.main(
        ["train", "--run", str(run), "--target", "download", "--streaming", "--distributed"]
    )
    assert code == 3
    with pytest.raises(DataError, match="streaming"):
        TrainConfig(objective="exact", streaming=True)
