"""scikit-learn plumbing shared by ``DBKRegressor`` and the torch baselines.

Both estimators derive from :class:`sklearn.base.RegressorMixin` and
:class:`sklearn.base.BaseEstimator` (parameters from the ``__init__`` signature, ``score`` = R²).
The helpers here check the inputs the scikit-learn way (``feature_names_in_``,
``n_features_in_``, :class:`~sklearn.exceptions.NotFittedError`) and then with geodbk's own
messages (:mod:`geodbk.validation`), so that every bad input still raises a
:class:`~geodbk.errors.DataError` (a ``ValueError``) that names the problem and the fix.

One difference from scikit-learn's conventions is deliberate: a 1-D ``X`` is read as one feature
per row, as everywhere in geodbk (scikit-learn's ``check_fit1d`` expects a ``ValueError``; the
``one_d_array`` tag is not set because scikit-learn's checks read it as "1-D input only").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from sklearn.utils import Tags
from sklearn.utils.validation import (
    _check_feature_names,
    _check_n_features,
    _get_feature_names,
    check_array,
    check_is_fitted,
    column_or_1d,
)

from geodbk.errors import DataError
from geodbk.validation import as_feature_matrix, as_target_vector

__all__ = [
    "NOT_FITTED",
    "check_fitted",
    "kept_on_failure",
    "regressor_tags",
    "validated_X",
    "validated_y",
]

_Fit = TypeVar("_Fit", bound=Callable[..., Any])

#: Message of the :class:`~sklearn.exceptions.NotFittedError` an unfitted estimator raises.
NOT_FITTED = "This %(name)s instance is not fitted yet; call fit() or load() first."


def check_fitted(estimator: Any) -> None:
    """Raise :class:`sklearn.exceptions.NotFittedError` unless ``estimator`` is fitted (or
    loaded): scikit-learn's :func:`~sklearn.utils.validation.check_is_fitted`, which asks the
    estimator's ``__sklearn_is_fitted__`` (its trained torch module is there)."""
    check_is_fitted(estimator, msg=NOT_FITTED)


def kept_on_failure(fit: _Fit) -> _Fit:
    """Wrap a ``fit`` method so that a fit that fails (bad input, divergence, an interrupt)
    leaves the estimator as it was: still fitted to its last data, or still unfitted, never
    with the new data's ``n_features_in_`` beside the old model."""

    @functools.wraps(fit)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = dict(self.__dict__)
        try:
            return fit(self, *args, **kwargs)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    return wrapper  # type: ignore[return-value]


def validated_X(estimator: Any, X: Any, name: str = "X", *, reset: bool) -> np.ndarray:
    """``X`` as a finite float64 (n, d) array, checked against what ``estimator`` was fitted on.

    ``reset=True`` (in ``fit``) records ``n_features_in_`` and, for a table with string column
    names (a pandas DataFrame), ``feature_names_in_`` (deleted when fitted on an array).
    ``reset=False`` (prediction, validation data) raises a ``ValueError`` when a DataFrame's
    columns are not those of ``fit`` in the same order (swapped or renamed columns), warns when
    only one of the two had names, and raises a :class:`~geodbk.errors.DataError` for a different
    number of columns. Sparse input raises ``TypeError``; complex, empty, 3-D, non-numeric
    or non-finite input a ``DataError``.
    """
    _check_feature_names(estimator, X, reset=reset)
    try:
        arr = check_array(
            X,
            accept_sparse=False,
            dtype="numeric",
            ensure_2d=False,
            ensure_all_finite=False,  # geodbk's message below says what to do about it
            estimator=estimator,
            input_name=name,
        )
    except ValueError as exc:
        raise DataError(f"{name}: {exc}") from exc
    one_d = arr.ndim == 1
    x_np = as_feature_matrix(arr, name, columns=_get_feature_names(X))
    if reset:
        _check_n_features(estimator, x_np, reset=True)
        return x_np
    try:
        _check_n_features(estimator, x_np, reset=False)
    except ValueError as exc:
        msg = str(exc) if name == "X" else str(exc).replace("X has", f"{name} has", 1)
        msg = msg.rstrip(".") + f" (the model was fitted on {estimator.n_features_in_} columns)."
        if one_d:
            msg += (
                f" {name} is 1-D and was read as one feature per row; Reshape your data with "
                f"{name}.reshape(1, -1) if it is a single sample."
            )
        raise DataError(msg) from exc
    return x_np


def validated_y(estimator: Any, y: Any, n: int, name: str = "y") -> np.ndarray:
    """``y`` as a finite float64 (n,) array; a column vector (n, 1) is accepted with scikit-learn's
    ``DataConversionWarning``, ``None`` and several columns raise a ``DataError``."""
    if y is None:
        raise DataError(
            f"{type(estimator).__name__} requires y to be passed, but the target y is None"
        )
    try:
        arr = column_or_1d(y, warn=True)
    except ValueError as exc:
        raise DataError(f"{name}: {exc}") from exc
    return as_target_vector(arr, name, n)


def regressor_tags(tags: Tags) -> Tags:
    """The scikit-learn tags every geodbk regressor shares (``tags`` from ``super()``).

    Dense numeric 2-D input, no NaN (the defaults: ``allow_nan``, ``sparse`` and ``one_d_array``
    stay ``False`` although a 1-D ``X`` is accepted as one feature per row); a single real-valued
    target (``requires_positive_y`` stays ``False``). Training is seeded by the ``seed``
    parameter, so two fits with the same seed on the same device agree: the estimators are not
    tagged ``non_deterministic``.
    """
    tags.target_tags.required = True
    tags.target_tags.single_output = True
    tags.target_tags.multi_output = False
    return tags
