"""Row groups held in memory, the streaming mean and sd, and the prediction of one batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from geodbk.batches import (
    ArrayRowGroups,
    columns_read,
    iter_groups,
    mean_std,
    predict_columns,
    stack_inputs,
)


def test_array_row_groups_are_consecutive_rows_like_a_parquet_file() -> None:
    cols = {"a": np.arange(10), "b": np.arange(10) * 2.0}
    source = ArrayRowGroups(cols, group_size=4)
    assert (source.num_groups, source.count_rows()) == (3, 10)
    np.testing.assert_array_equal(source.read([2], ["a"])["a"], [8, 9])  # the last one short
    got = source.read([2, 0], ["b", "a"])
    assert list(got) == ["b", "a"]
    np.testing.assert_array_equal(got["a"], [8, 9, 0, 1, 2, 3])
    np.testing.assert_array_equal(got["b"], [16.0, 18.0, 0.0, 2.0, 4.0, 6.0])
    assert source.read([], ["a"])["a"].size == 0
    whole = np.concatenate([g["a"] for g in iter_groups(source, ["a"])])
    np.testing.assert_array_equal(whole, cols["a"])
    with pytest.raises(ValueError, match="different lengths"):
        ArrayRowGroups({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="group_size"):
        ArrayRowGroups(cols, group_size=0)


def test_mean_std_of_a_stream_equals_numpy_on_the_finite_values() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(3.0, 2.0, size=n) for n in (1, 7, 0, 50, 3)]
    parts[1][2] = np.nan
    parts[3][:4] = [np.inf, -np.inf, np.nan, np.nan]
    finite = np.concatenate(parts)
    finite = finite[np.isfinite(finite)]
    mean, sd, n = mean_std(iter(parts))
    assert n == finite.size == 56
    assert mean == pytest.approx(float(finite.mean()), rel=1e-12)
    assert sd == pytest.approx(float(finite.std()), rel=1e-12)
    empty = mean_std([np.array([np.nan]), np.zeros(0)])
    assert np.isnan(empty[0]) and np.isnan(empty[1]) and empty[2] == 0


class _Model:
    """A model whose predictive mean is x1 + x2 and whose sds depend on the tests given."""

    tests_aware = True
    devices_aware = False
    noise_urban = False

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def predict_dist(self, X: np.ndarray, *, chunk_size: int, **kw: Any) -> SimpleNamespace:
        self.calls.append({"n": len(X), **kw})
        tests = kw.get("tests", np.ones(len(X)))
        var_f = np.full(len(X), 0.25)
        return SimpleNamespace(mean=X.sum(axis=1), std=np.sqrt(var_f + 1.0 / tests), var_f=var_f)


def test_predict_columns_stacks_inputs_and_leaves_non_finite_rows_nan() -> None:
    cols = {
        "x1": np.array([1.0, np.nan, 3.0, 4.0]),
        "x2": np.array([1, 2, 3, np.inf]),
        "tests": np.array([4, 1, 0, 9]),  # 0 tests is read as one
    }
    X = stack_inputs(["x2", "x1"])(cols)
    assert X.dtype == np.float64 and X.shape == (4, 2)
    np.testing.assert_array_equal(X[:, 0], cols["x2"])
    model = _Model()
    out = predict_columns(model, cols, inputs=stack_inputs(["x1", "x2"]), tests_column="tests")
    assert model.calls[0]["n"] == 2  # only the finite rows reach the model
    np.testing.assert_array_equal(model.calls[0]["tests"], [4, 1])
    np.testing.assert_array_equal(out["mean"], [2.0, np.nan, 6.0, np.nan])
    np.testing.assert_allclose(out["std"], [np.sqrt(0.5), np.nan, np.sqrt(1.25), np.nan])
    np.testing.assert_allclose(out["std_f"], [0.5, np.nan, 0.5, np.nan])
    predict_columns(model, cols, inputs=stack_inputs(["x1", "x2"]))
    assert "tests" not in model.calls[1]  # no tests column: the model's single-test default


def test_columns_read_names_the_covariates_and_the_tile_columns_of_an_effect() -> None:
    assert columns_read({}) == []
    assert columns_read({"tests_column": "tests", "devices_column": None}) == ["tests"]
    effect = object()
    assert columns_read({"urban_column": "urban", "tile_effect": effect}) == [
        "urban",
        "quadkey",
        "quarter",
    ]
    assert columns_read({"tile_effect": effect, "tile_column": "qk", "time_column": None}) == ["qk"]
    assert columns_read({"tile_column": "qk"}) == []  # no effect: the tile is not read
