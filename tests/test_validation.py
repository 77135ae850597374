"""Input validation at the estimator boundary: feature matrices, targets, counts, urban flags."""

from __future__ import annotations

import numpy as np
import pytest

from geodbk.errors import DataError
from geodbk.validation import (
    as_devices,
    as_feature_matrix,
    as_target_vector,
    as_tests,
    as_urban_flags,
    counts_or_one,
)


def test_feature_matrix_is_a_writable_float64_copy_and_1d_is_one_feature() -> None:
    source = np.arange(6, dtype=np.int64).reshape(3, 2)
    source.setflags(write=False)
    x = as_feature_matrix(source, "X")
    assert x.dtype == np.float64 and x.flags.writeable and not np.shares_memory(x, source)
    assert as_feature_matrix([1, 2, 3], "X").shape == (3, 1)
    for bad, match in (
        (np.zeros((0, 2)), "non-empty 2-D"),
        (np.zeros((2, 2, 2)), "non-empty 2-D"),
        ([[1.0, np.inf]], "X_val contains NaN or infinite"),
    ):
        with pytest.raises(DataError, match=match):
            as_feature_matrix(bad, "X_val" if isinstance(bad, list) else "X")


def test_target_vector_matches_the_rows() -> None:
    np.testing.assert_array_equal(as_target_vector([[1], [2]], "y", 2), [1.0, 2.0])
    with pytest.raises(DataError, match="y has 3 values but the inputs have 2 rows"):
        as_target_vector([1, 2, 3], "y", 2)
    with pytest.raises(DataError, match="y_val contains 1 NaN or infinite value"):
        as_target_vector([1.0, np.nan], "y_val", 2)


def test_counts_broadcast_a_scalar_and_must_be_at_least_one() -> None:
    np.testing.assert_array_equal(as_tests(3, "tests", 4), [3.0] * 4)
    np.testing.assert_array_equal(as_devices([1, 2], "devices", 2), [1.0, 2.0])
    with pytest.raises(DataError, match=r"tests must be finite and >= 1 \(the number of speed"):
        as_tests([1, 0.5], "tests", 2)
    with pytest.raises(DataError, match="distinct devices"):
        as_devices([1, np.nan], "devices", 2)
    with pytest.raises(DataError, match="tests has 2 values but the inputs have 3 rows"):
        as_tests([1, 2], "tests", 3)
    np.testing.assert_array_equal(counts_or_one([np.nan, 0, 0.5, 7]), [1.0, 1.0, 1.0, 7.0])


def test_urban_flags_are_zero_or_one() -> None:
    np.testing.assert_array_equal(as_urban_flags([True, False], "urban", 2), [1.0, 0.0])
    np.testing.assert_array_equal(as_urban_flags(1, "urban", 3), [1.0, 1.0, 1.0])
    with pytest.raises(DataError, match="urban must be True/False"):
        as_urban_flags([0, 2], "urban", 2)
    with pytest.raises(DataError, match="got objects"):
        as_urban_flags(np.array([True, None], dtype=object), "urban", 2)
    with pytest.raises(DataError, match="urban_val has 2 values"):
        as_urban_flags([1, 0], "urban_val", 3)


def test_non_finite_inputs_name_the_column_and_the_rows() -> None:
    X = np.zeros((6, 2))
    X[[2, 4], 1] = np.nan
    X[5, 0] = np.inf
    with pytest.raises(DataError) as err:
        as_feature_matrix(X, "X", columns=["lon", "lat"])
    msg = str(err.value)
    assert "X contains NaN or infinite values" in msg
    assert "column 'lon' (1 row, first row 5)" in msg
    assert "column 'lat' (2 rows, first row 2)" in msg
    assert msg.endswith("drop or impute those rows")
    with pytest.raises(DataError, match=r"column 1 \(2 rows, first row 2\)"):
        as_feature_matrix(X[:5], "X")
    with pytest.raises(DataError, match=r"y_val contains 2 NaN or infinite values \(first row 1\)"):
        as_target_vector([1.0, np.nan, 3.0, np.inf], "y_val", 4)
