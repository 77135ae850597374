"""``torchrun -m pipelines.cli train --distributed``: 2 gloo processes equal 1 process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import make_run
from safetensors.numpy import load_file

from geodbk import DBKRegressor
from geodbk.distributed import ShardPlan
from pipelines.config import TrainConfig, dump_config
from pipelines.rundir import require_run
from pipelines.sharding import split_rows
from pipelines.training_data import noise_columns, resolve_noise

REPO = Path(__file__).resolve().parents[2]
CFG = TrainConfig(rank=16, hidden=8, epochs=2, batch_size=64, patience=5, device="cpu", seed=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_two_processes_match_one_process(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", n=400)
    config = tmp_path / "small.yaml"
    config.write_text(dump_config(CFG))
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to the interpreter")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        str(torchrun),
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        "-m",
        "pipelines.cli",
        "--",  # torchrun's own parser would read `--run` as an abbreviation of `--run-path`
        "train",
        "--run",
        str(run),
        "--target",
        "download",
        "--config",
        str(config),
        "--distributed",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_dir = run / "models" / "download"
    got = load_file(str(model_dir / "weights.safetensors"))

    # the 1-process reference: the same shards, concatenated, the same global batches; the
    # table has `tests` and `devices` columns, so --distributed resolves the noise as in one
    # process (tests+devices) and each rank reads its rows' covariates
    import json

    meta = json.loads((model_dir / "model.json").read_text())["metadata"]
    cfg = resolve_noise(CFG, ["tests", "devices"])
    assert meta["config"]["noise"] == cfg.noise == "tests+devices"
    columns = noise_columns(cfg.noise)
    rd = require_run(run)
    shards = [
        split_rows(rd, "download", "train", rank=k, world_size=2, covariates=columns)
        for k in range(2)
    ]
    sizes = tuple(len(part[1]) for part in shards)
    X = np.concatenate([part[0] for part in shards])
    y = np.concatenate([part[1] for part in shards])
    covs = {c: np.concatenate([part[2][c] for part in shards]) for c in columns}
    Xv, yv, cov_val = split_rows(rd, "download", "val", covariates=columns)
    ref = DBKRegressor(**cfg.estimator_kwargs())
    ref.fit(
        X,
        y,
        Xv,
        yv,
        shards=ShardPlan(sizes, rank=None),
        **covs,
        **{f"{c}_val": v for c, v in cov_val.items()},
    )
    want = {k: v.detach().cpu().numpy() for k, v in ref.model_.state_dict().items()}
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    assert meta["n_train"] == sum(sizes)
    assert meta["noise"]["noise"] == "tests+devices"
    assert meta["history"][-1]["train_loss"] == pytest.approx(
        ref.history_[-1]["train_loss"], rel=1e-5
    )
