"""A killed training run resumed with --resume ends where an uninterrupted run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import killed_after_checkpoints, make_run
from safetensors.numpy import load_file

from geodbk import DBKRegressor
from geodbk.errors import DataError
from pipelines import cli
from pipelines.config import demo_config, dump_config
from pipelines.rundir import RunDir
from pipelines.train import run_train

CFG = demo_config(quick=True).replace(epochs=6, patience=6)


def _weights(run: Path) -> dict[str, np.ndarray]:
    return load_file(str(run / "models" / "download" / "weights.safetensors"))


def _strip(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


def test_killed_run_resumes_to_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "quick.yaml"
    config.write_text(dump_config(CFG))

    full = make_run(tmp_path / "full")
    run_train(full, target="download", config_path=config, progress=False)

    killed = make_run(tmp_path / "killed")
    # the process is killed right after epoch 3's checkpoint
    with killed_after_checkpoints(monkeypatch, 3):
        run_train(killed, target="download", config_path=config, progress=False)
    model_dir = killed / "models" / "download"
    assert (model_dir / "checkpoints" / "last.pt").is_file()
    assert not (model_dir / "model.json").exists()

    code = cli.main(
        [
            "train",
            "--run",
            str(killed),
            "--target",
            "download",
            "--config",
            str(config),
            "--resume",
            "--no-progress",
        ]
    )
    assert code == 0
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)

    from geodbk import DBKRegressor

    ha = DBKRegressor.load(full / "models" / "download").history_
    hb = DBKRegressor.load(model_dir).history_
    assert _strip(ha) == _strip(hb) and len(hb) == 6


def test_resume_with_a_different_config_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    run_train(run, target="download", config=CFG.replace(epochs=1), progress=False)
    with pytest.raises(DataError, match="different config") as refused:
        run_train(run, target="download", config=CFG.replace(rank=8), resume=True, progress=False)
    assert f"rank: {CFG.rank} there, 8 now" in str(refused.value)
    # a config conflict is bad input (exit 3), not a missing run directory (exit 5)
    argv = ["train", "--run", str(run), "--target", "download", "--resume", "--no-progress"]
    changed = tmp_path / "changed.yaml"
    changed.write_text(dump_config(CFG.replace(rank=8)))
    assert cli.main([*argv, "--config", str(changed)]) == 3
    # the message's fix, the checkpoint's own config file, resumes
    saved = RunDir(run).checkpoint_dir("download") / "config.yaml"
    assert f"`--config {saved} --resume`" in str(refused.value)
    assert "predict_chunk_size" in str(refused.value)  # every key that may change is named
    assert cli.main([*argv, "--config", str(saved), "--epochs", "2"]) == 0


def test_a_checkpoint_from_before_the_held_kernel_resumes_with_every_step(tmp_path: Path) -> None:
    """A checkpoint whose config has no ``kernel_update_every`` was trained with 1: it resumes
    with ``kernel_update_every: 1``, and the default (4 for DBK-RBF under dPPGP) is refused,
    naming the key."""
    run = make_run(tmp_path / "run")
    old = CFG.replace(epochs=1, kernel_update_every=1)
    run_train(run, target="download", config=old, progress=False)
    saved = RunDir(run).checkpoint_dir("download") / "config.yaml"
    lines = saved.read_text().splitlines(keepends=True)
    saved.write_text("".join(x for x in lines if not x.startswith("kernel_update_every")))
    with pytest.raises(DataError, match="kernel_update_every: 1 there, 4 now"):
        run_train(run, target="download", config=CFG.replace(epochs=2), resume=True, progress=False)
    run_train(run, target="download", config=old.replace(epochs=2), resume=True, progress=False)
    assert len(DBKRegressor.load(RunDir(run).model_dir("download")).history_) == 2
