"""Parquet files read as record batches and row groups: counting, batches, prediction to a
file, and fit_parquet equal to fitting the same rows held in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from geo_helpers import write_xy_table

from geodbk import DBKRegressor
from geodbk.batches import ArrayRowGroups
from geodbk.geo.parquet_batches import (
    ParquetRowGroups,
    count_rows,
    fit_parquet,
    iter_parquet_batches,
    predict_table,
)


def test_batches_and_streaming_prediction(tmp_path: Path) -> None:
    src = write_xy_table(tmp_path / "t.parquet")
    train = pc.field("split") == "train"
    assert count_rows(src, filters=train) == 900
    got = np.concatenate(
        [b["x1"] for b in iter_parquet_batches(src, columns=["x1"], filters=train, batch_size=77)]
    )
    assert got.shape == (900,)
    table = pq.read_table(src)
    X = np.column_stack([table["x1"].to_numpy(), table["x2"].to_numpy()])
    model = DBKRegressor(rank=8, hidden=8, epochs=1, batch_size=128, device="cpu").fit(
        X, table["y"].to_numpy()
    )
    n = predict_table(model, src, tmp_path / "p.parquet", keep_columns=["y"], batch_size=300)
    out = pq.read_table(tmp_path / "p.parquet")
    assert n == 1000 and out.column_names == ["y", "mean", "std", "std_f"]
    np.testing.assert_allclose(out["mean"].to_numpy(), model.predict_dist(X).mean, rtol=1e-6)


def test_row_group_sources_agree_and_fit_batches_equals_fit_parquet(tmp_path: Path) -> None:
    """Arrays served in groups of the file's row-group size read as the file does, and the
    estimator fitted from them has fit_parquet's target scaling and weights."""
    src = write_xy_table(tmp_path / "t.parquet")
    table = pq.read_table(src)
    cols = {c: table[c].to_numpy() for c in ("x1", "x2", "y")}
    arrays, parquet = ArrayRowGroups(cols, group_size=200), ParquetRowGroups(src)
    assert arrays.num_groups == parquet.num_groups == 5
    assert arrays.count_rows() == parquet.count_rows() == 1000
    for a, b in zip(
        arrays.read([3, 1], ["y", "x1"]).values(),
        parquet.read([3, 1], ["y", "x1"]).values(),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    kw = {
        "rank": 8,
        "hidden": 8,
        "epochs": 2,
        "batch_size": 64,
        "dtype": "float64",
        "device": "cpu",
    }
    by_file = fit_parquet(DBKRegressor(**kw), src, y_column="y")
    by_arrays = DBKRegressor(**kw).fit_batches(arrays, y_column="y")
    assert (by_arrays.y_mean_, by_arrays.y_std_) == (by_file.y_mean_, by_file.y_std_)
    assert by_arrays.n_features_in_ == 2
    for k, v in by_file.model_.state_dict().items():
        torch.testing.assert_close(by_arrays.model_.state_dict()[k], v, rtol=0, atol=0)
