"""Longitudes by whole turns: into a chosen turn, near a centre, or back to [-180, 180].

Pure numpy, so that quadkeys (and the model code that uses them) need no geometry stack.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["native_longitude", "wrap_longitude", "wrap_near"]

FloatArray = npt.NDArray[np.float64]


def wrap_longitude(lon: npt.ArrayLike, *, west: float) -> FloatArray:
    """Longitudes moved by whole turns into ``[west, west + 360)``; those already inside are
    returned unchanged (bit for bit)."""
    lon_a = np.asarray(lon, dtype=np.float64)
    outside = (lon_a < west) | (lon_a >= west + 360.0)
    if not outside.any():
        return lon_a
    return np.where(outside, west + np.mod(lon_a - west, 360.0), lon_a)


def wrap_near(lon: npt.ArrayLike, *, centre: float) -> FloatArray:
    """Longitudes moved by whole turns into the half-turn either side of ``centre``,
    ``[centre - 180, centre + 180)`` (:func:`wrap_longitude`)."""
    return wrap_longitude(lon, west=float(centre) - 180.0)


def native_longitude(lon: npt.ArrayLike) -> FloatArray:
    """Longitudes outside [-180, 180] moved by whole turns into [-180, 180); 180 stays 180."""
    lon_a = np.asarray(lon, dtype=np.float64)
    outside = (lon_a < -180.0) | (lon_a > 180.0)
    if not outside.any():
        return lon_a
    return np.where(outside, wrap_longitude(lon_a, west=-180.0), lon_a)
