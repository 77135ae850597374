"""The arrays a training stage reads from a tile table: time axis, noise model and covariates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geodbk.errors import DataError
from geodbk.geo.timeaxis import TimeScaling
from pipelines.config import NOISE_INIT, TrainConfig
from pipelines.training_data import (
    noise_columns,
    noise_covariates,
    resolve_noise,
    smaller_class_rows,
    split_arrays,
    split_tests,
    time_axis,
    urban_classes,
    urban_groups_supported,
)


def test_time_axis_from_train_split_and_forecast() -> None:
    q = np.array(["2023Q1", "2023Q2", "2023Q3", "2023Q4"] * 3)
    split = np.array(["train", "train", "val", "test"] * 3)  # a forecast split
    ts, quarters = time_axis(q, split, source=Path("t.parquet"))
    assert (ts.first, ts.last) == ("2023Q1", "2023Q2")
    assert quarters == ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
    assert ts.describe("2023Q4") == "extrapolation beyond 2023Q2" and ts.scale("2023Q4") > 1
    with pytest.raises(DataError, match="at least 2 quarters"):
        time_axis(q, np.where(q == "2023Q1", "train", "test"), source=Path("t.parquet"))


def _table() -> pd.DataFrame:
    """Seven rows: three train rows (one with a missing target), two val and two test rows."""
    return pd.DataFrame(
        {
            "x1": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
            "x2": [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7],
            "log10_download": [4.0, np.nan, 4.1, 4.2, 4.3, 4.4, 4.5],
            "split": ["train", "train", "train", "val", "val", "test", "test"],
            "tests": [3, 5, 4, 0, 2, 1, 9],
            "devices": [1, 2, 2, np.nan, 2, 1, 4],
            "urban": [True, False, False, True, True, False, False],
            "quarter": ["2023Q1", "2023Q2", "2023Q2", "2023Q1", "2023Q2", "2023Q3", "2023Q3"],
        }
    )


def test_auto_noise_follows_the_table_and_explicit_noise_needs_its_columns() -> None:
    cfg = TrainConfig(noise="auto", noise_init=0)
    assert resolve_noise(cfg, ["tests", "devices"]).noise == "tests+devices"
    streaming = resolve_noise(cfg, ["tests", "devices"], devices_supported=False)
    assert streaming.noise == "tests" and streaming.noise_init == NOISE_INIT["tests"]
    assert resolve_noise(cfg, ["x1"]).noise == "constant"
    with pytest.raises(DataError, match=r"needs a `devices` column in t\.parquet.*--noise tests"):
        resolve_noise(TrainConfig(noise="tests+devices"), ["tests"], source="t.parquet")
    with pytest.raises(DataError, match=r"both urban and rural.*--noise tests$"):
        resolve_noise(TrainConfig(noise="tests+urban"), ["tests", "urban"], urban_classes=1)
    both = resolve_noise(TrainConfig(noise="tests+urban"), ["tests", "urban"], urban_classes=2)
    assert both.noise == "tests+urban"


def test_noise_covariates_are_row_aligned_with_the_split_arrays() -> None:
    gdf = _table()
    arrays = split_arrays(gdf, "download", source=Path("t.parquet"))
    assert [len(arrays[s][1]) for s in ("train", "val", "test")] == [2, 2, 2]
    assert noise_columns("constant") == [] and noise_columns("tests") == ["tests"]
    assert noise_columns("tests+devices+urban") == ["tests", "devices", "urban"]
    cov = noise_covariates(gdf, "download", "tests+devices+urban")
    assert sorted(cov) == sorted(
        ["tests", "tests_val", "devices", "devices_val", "urban", "urban_val"]
    )
    np.testing.assert_array_equal(cov["tests"], [3.0, 4.0])  # the NaN-target row is dropped
    np.testing.assert_array_equal(cov["tests_val"], [1.0, 2.0])  # 0 tests read as one
    np.testing.assert_array_equal(cov["devices_val"], [1.0, 2.0])  # missing read as one
    assert cov["urban_val"].dtype == bool and cov["urban_val"].tolist() == [True, True]
    assert split_tests(gdf, "download", column="quarter")["test"].tolist() == ["2023Q3"] * 2
    timed = split_arrays(
        gdf, "download", source=Path("t.parquet"), time_scaling=TimeScaling("2023Q1", "2023Q2")
    )
    assert timed["val"][0].shape == (2, 3)
    np.testing.assert_allclose(
        timed["val"][0][:, 2], TimeScaling("2023Q1", "2023Q2").scale(np.array(["2023Q1", "2023Q2"]))
    )
    with pytest.raises(DataError, match="no 'log10_upload' column"):
        split_arrays(gdf, "upload", source=Path("t.parquet"))
    with pytest.raises(DataError, match="fewer than 2 usable training rows for download"):
        split_arrays(gdf.drop(index=2), "download", source=Path("t.parquet"))


def test_urban_classes_and_the_groups_they_support() -> None:
    gdf = _table()
    assert urban_classes(gdf["urban"], gdf["split"]) == 2
    assert urban_classes(gdf["urban"], np.where(gdf["urban"], "train", "val")) == 1
    assert smaller_class_rows(np.array([True] * 3 + [False] * 120)) == 3
    assert not urban_groups_supported(np.array([True] * 99 + [False] * 500))
    assert urban_groups_supported(np.array([True] * 100 + [False] * 100))
