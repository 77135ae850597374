"""The scikit-learn plumbing: fitted check, feature names and counts, target vectors, tags."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import DataConversionWarning, NotFittedError

from geodbk.errors import DataError
from geodbk.sklearn_api import check_fitted, regressor_tags, validated_X, validated_y


class _Regressor(RegressorMixin, BaseEstimator):
    """The least an estimator needs for the helpers: fitted once ``fitted`` is set."""

    def __init__(self) -> None:
        self.fitted = False

    def fit(self, X: object, y: object) -> _Regressor:
        self.fitted = True
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return self.fitted

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        return regressor_tags(super().__sklearn_tags__())


def test_check_fitted_asks_the_estimator() -> None:
    est = _Regressor()
    with pytest.raises(NotFittedError, match="This _Regressor instance is not fitted yet"):
        check_fitted(est)
    check_fitted(est.fit(None, None))


def test_fit_records_feature_names_and_prediction_checks_them() -> None:
    est = _Regressor()
    frame = pd.DataFrame({"lon": [0.0, 1.0], "lat": [2.0, 3.0]})
    X = validated_X(est, frame, reset=True)
    assert X.dtype == np.float64 and X.shape == (2, 2)
    assert est.n_features_in_ == 2 and list(est.feature_names_in_) == ["lon", "lat"]
    with pytest.raises(ValueError, match="feature names"):
        validated_X(est, frame[["lat", "lon"]], reset=False)
    with (
        pytest.warns(UserWarning, match="does not have valid feature names"),
        pytest.raises(DataError, match=r"X_val has 3 features.*fitted on 2 columns"),
    ):
        validated_X(est, np.zeros((4, 3)), "X_val", reset=False)
    validated_X(est, np.zeros((3, 1)), reset=True)  # refitted on an array: the names go
    assert est.n_features_in_ == 1 and not hasattr(est, "feature_names_in_")


def test_bad_inputs_raise_data_errors_that_say_what_to_do() -> None:
    est = _Regressor()
    one_d = validated_X(est, [1.0, 2.0, 3.0], reset=True)  # one feature per row
    assert one_d.shape == (3, 1)
    validated_X(est, np.zeros((5, 2)), reset=True)
    with pytest.raises(DataError, match=r"1-D and was read as one feature per row"):
        validated_X(est, np.zeros(2), reset=False)
    with pytest.raises(DataError, match="NaN or infinite"):
        validated_X(est, [[1.0, np.nan]], reset=False)
    with pytest.raises(DataError, match="X: "):
        validated_X(est, [["a", "b"]], reset=False)
    with pytest.raises(TypeError):
        validated_X(est, scipy.sparse.csr_matrix(np.eye(2)), reset=False)


def test_validated_y_accepts_a_column_vector_with_a_warning() -> None:
    est = _Regressor()
    with pytest.warns(DataConversionWarning):
        y = validated_y(est, np.array([[1.0], [2.0]]), 2)
    assert y.shape == (2,) and y.dtype == np.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(validated_y(est, [3, 4], 2), [3.0, 4.0])
    with pytest.raises(DataError, match="requires y to be passed"):
        validated_y(est, None, 2)
    with pytest.raises(DataError, match="y: "):
        validated_y(est, np.zeros((2, 2)), 2)
    with pytest.raises(DataError, match="has 3 values but the inputs have 2 rows"):
        validated_y(est, [1.0, 2.0, 3.0], 2)


def test_regressor_tags_require_one_real_target() -> None:
    tags = _Regressor().__sklearn_tags__()
    assert tags.target_tags.required and tags.target_tags.single_output
    assert not tags.target_tags.multi_output and not tags.target_tags.positive_only
    assert tags.estimator_type == "regressor"
    assert not tags.input_tags.allow_nan and not tags.input_tags.sparse


def test_a_nan_in_a_dataframe_is_reported_with_its_column_name() -> None:
    est = _Regressor()
    frame = pd.DataFrame({"lon": [0.0, 1.0, 2.0], "lat": [2.0, np.nan, 3.0]})
    with pytest.raises(DataError, match=r"X contains NaN .* column 'lat' \(1 row, first row 1\)"):
        validated_X(est, frame, reset=True)
    validated_X(est, frame.fillna(0.0), reset=True)
    with pytest.raises(DataError, match=r"X_val contains NaN .* column 'lat'"):
        validated_X(est, frame, "X_val", reset=False)
