"""Input validation shared by every estimator (DBK and the baselines).

Arrays from users are checked once, at the estimator boundary, with errors that say what is wrong
and what to do about it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from geodbk.errors import DataError


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def as_feature_matrix(x: Any, name: str, *, columns: Any = None) -> np.ndarray:
    """``x`` as a finite float64 (n, d) array; a 1-D array is read as one feature per row.

    ``columns``: the column names (a DataFrame's), used to name a column with NaN or infinite
    values (else its index).

    Raises
    ------
    DataError
        If ``x`` is empty, not 1-D/2-D, or holds NaN or infinite values (naming each such
        column, its number of rows and the first, counted from 0).
    """
    arr = np.array(x, dtype=np.float64)  # a writable copy: torch refuses read-only buffers
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise DataError(f"{name} must be a non-empty 2-D array (n, d), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        names = list(columns) if columns is not None else None
        where = []
        for j in np.flatnonzero(bad.any(axis=0)):
            label = repr(str(names[j])) if names is not None and j < len(names) else str(j)
            rows = np.flatnonzero(bad[:, j])
            where.append(f"column {label} ({_rows(rows.size)}, first row {rows[0]})")
        raise DataError(
            f"{name} contains NaN or infinite values in {', '.join(where)}; drop or impute "
            "those rows"
        )
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
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        values = "value" if bad.size == 1 else "values"
        raise DataError(
            f"{name} contains {bad.size} NaN or infinite {values} (first row {bad[0]}); drop "
            "those rows"
        )
    return arr


def as_tests(tests: Any, name: str, n: int) -> np.ndarray:
    """``tests`` as a float64 (n,) array (a scalar is broadcast); every value must be >= 1."""
    return as_counts(tests, name, n, what="speed tests")


def as_devices(devices: Any, name: str, n: int) -> np.ndarray:
    """``devices`` as a float64 (n,) array (a scalar is broadcast); every value must be >= 1.

    ``devices <= tests`` is not required (real tables do not always satisfy it).
    """
    return as_counts(devices, name, n, what="distinct devices")


def as_urban_flags(urban: Any, name: str, n: int) -> np.ndarray:
    """Per-row urban flags (bool, or 0/1 numbers) as a float64 (n,) array of 0.0 and 1.0.

    A scalar is broadcast.

    Raises
    ------
    DataError
        If the length is neither 1 nor ``n``, or a value is not 0/1 (NaN included); the
        message names ``name``.
    """
    arr = np.asarray(urban).reshape(-1)
    if arr.dtype == object:
        raise DataError(f"{name} must be booleans (True = urban), got objects; fill missing values")
    arr = arr.astype(np.float64)
    if arr.shape[0] == 1 and n != 1:
        arr = np.full(n, float(arr[0]))
    if arr.shape[0] != n:
        raise DataError(f"{name} has {arr.shape[0]} values but the inputs have {n} rows")
    if not np.isin(arr, (0.0, 1.0)).all():
        raise DataError(f"{name} must be True/False (1/0) per row: the tile is urban or rural")
    return arr


def as_counts(values: Any, name: str, n: int, *, what: str) -> np.ndarray:
    """Per-row counts (``what``: e.g. ``"speed tests"``) as a float64 (n,) array, each >= 1.

    Raises
    ------
    DataError
        If the length is neither 1 nor ``n``, or a value is NaN, infinite or below 1; the
        message names ``name``.
    """
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.shape[0] == 1 and n != 1:
        arr = np.full(n, float(arr[0]))
    if arr.shape[0] != n:
        raise DataError(f"{name} has {arr.shape[0]} values but the inputs have {n} rows")
    if not np.isfinite(arr).all() or (arr < 1).any():
        raise DataError(f"{name} must be finite and >= 1 (the number of {what} per row)")
    return arr


def counts_or_one(values: Any) -> np.ndarray:
    """Per-row counts read from a table column as float64: missing (NaN) or < 1 set to 1."""
    return np.maximum(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=1.0), 1.0)
