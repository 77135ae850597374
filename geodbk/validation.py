"""Input validation shared by every estimator (DBK and the baselines).

Arrays from users are checked once, at the estimator boundary, with errors that say what is wrong
and what to do about it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geodbk.errors import DataError


def as_feature_matrix(x: Any, name: str) -> np.ndarray:
    """``x`` as a finite float64 (n, d) array; a 1-D array is read as one feature per row.

    Raises
    ------
    DataError
        If ``x`` is empty, not 1-D/2-D, or holds NaN or infinite values.
    """
    arr = np.array(x, dtype=np.float64)  # a writable copy: torch refuses read-only buffers
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise DataError(f"{name} must be a non-empty 2-D array (n, d), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise DataError(f"{name} contains NaN or infinite values; drop or impute those rows")
    return arr


def as_target_vector(y: Any, name: str, n: int) -> np.ndarray:
    """``y`` as a finite float64 (n,) array matching ``n`` input rows.

    Raises
    ------
    DataError
        If the length differs from ``n`` or a value is NaN or infinite.
    """
    arr = np.array(y, dtype=np.float64).reshape(-1)
    if arr.shape[0] != n:
        raise DataError(f"{name} has {arr.shape[0]} values but the inputs have {n} rows")
    if not np.isfinite(arr).all():
        raise DataError(f"{name} contains NaN or infinite values; drop those rows")
    return arr


def as_tests(tests: Any, name: str, n: int) -> np.ndarray:
    """``tests`` as a float64 (n,) array (a scalar is broadcast); every value must be >= 1."""
    arr = np.asarray(tests, dtype=np.float64).reshape(-1)
    if arr.shape[0] == 1 and n != 1:
        arr = np.full(n, float(arr[0]))
    if arr.shape[0] != n:
        raise DataError(f"{name} has {arr.shape[0]} values but the inputs have {n} rows")
    if not np.isfinite(arr).all() or (arr < 1).any():
        raise DataError(f"{name} must be finite and >= 1 (the number of speed tests per row)")
    return arr
