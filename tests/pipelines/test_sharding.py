"""Per-rank reading of ``tiles.parquet`` for distributed and streaming training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from geodbk.errors import DataError
from pipelines.config import TrainConfig
from pipelines.rundir import RunDir
from pipelines.sharding import read_time_axis, split_rows, streaming_inputs

N = 60


def _run(root: Path) -> RunDir:
    """60 rows in row groups of 8: every third row val, the rest train; some train targets NaN."""
    i = np.arange(N)
    y = 4.0 + 0.01 * i
    y[[1, 4]] = np.nan
    table = pa.table(
        {
            "x1": i / N,
            "x2": -i / N,
            "log10_download": y,
            "split": np.where(i % 3 == 0, "val", "train"),
            "quarter": np.array(["2023Q1", "2023Q2", "2023Q3"])[i % 3],
            "tests": np.where(i % 5 == 0, 0, i % 7 + 1),
            "urban": i % 2 == 0,
        }
    )
    meta = {b"geodbk": json.dumps({"schema_version": 1, "ingest_id": "x"}).encode()}
    rd = RunDir(root)
    pq.write_table(table.replace_schema_metadata(meta), rd.tiles, row_group_size=8)
    return rd


def test_the_ranks_shards_are_the_whole_split_once(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    whole = split_rows(rd, "download", "train", covariates=("tests", "urban"))
    assert whole[0].shape == (38, 2)  # 40 train rows, 2 without a target
    shards = [
        split_rows(rd, "download", "train", rank=k, world_size=3, covariates=("tests", "urban"))
        for k in range(3)
    ]
    X = np.concatenate([s[0] for s in shards])
    order, want = np.argsort(X[:, 0]), np.argsort(whole[0][:, 0])
    np.testing.assert_array_equal(X[order], whole[0][want])
    y = np.concatenate([s[1] for s in shards])
    np.testing.assert_array_equal(y[order], whole[1][want])
    tests = np.concatenate([s[2]["tests"] for s in shards])
    assert tests.min() >= 1 and tests.dtype == np.float64  # 0 tests read as one
    assert np.concatenate([s[2]["urban"] for s in shards]).dtype == bool


def test_time_aware_rows_carry_t_from_the_training_quarters(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    ts, quarters = read_time_axis(rd)
    assert quarters == ["2023Q1", "2023Q2", "2023Q3"]
    assert (ts.first, ts.last) == ("2023Q2", "2023Q3")  # the training rows' quarters
    X, _, _ = split_rows(rd, "download", "val", time_scaling=ts)
    assert X.shape == (20, 3)
    np.testing.assert_allclose(X[:, 2], ts.scale(np.array(["2023Q1"] * 20)))
    pq.write_table(pq.read_table(rd.tiles).drop_columns(["quarter"]), rd.tiles)
    with pytest.raises(DataError, match="--time needs them"):
        read_time_axis(rd)


def test_streaming_reads_the_validation_split_and_counts_the_training_rows(
    tmp_path: Path,
) -> None:
    rd = _run(tmp_path)
    cfg, meta, ts, _, stream = streaming_inputs(rd, "download", TrainConfig(noise="auto"))
    assert cfg.noise == "tests" and meta["ingest_id"] == "x" and ts is None
    assert stream["n_train"] == 38 and stream["X_val"].shape == (20, 2)
    assert stream["tests_val"].min() >= 1
    with pytest.raises(DataError, match="no \\['log10_upload'\\] column"):
        streaming_inputs(rd, "upload", TrainConfig())
