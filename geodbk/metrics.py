"""Predictive-quality metrics for Gaussian predictions (pure numpy).

All functions take arrays of equal length: targets ``y``, predictive means ``mean`` and
predictive variances ``var`` (noise included) or standard deviations, and return floats
(averages over the points) unless stated otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import norm

__all__ = [
    "DEFAULT_LEVELS",
    "coverage",
    "crps_gaussian",
    "gaussian_nll",
    "interval_width",
    "mae",
    "reliability_curve",
    "rmse",
    "summary",
]

#: Nominal levels of the reliability curve.
DEFAULT_LEVELS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def _arrays(*arrays: np.ndarray) -> list[np.ndarray]:
    out = [np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays]
    n = out[0].shape[0]
    if any(a.shape[0] != n for a in out):
        raise ValueError(f"arrays must have equal length, got {[a.shape[0] for a in out]}")
    return out


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return float(norm.ppf(0.5 + 0.5 * level))


def mae(y: np.ndarray, mean: np.ndarray) -> float:
    """Mean absolute error ``mean_i |y_i - mu_i|``."""
    y_, m_ = _arrays(y, mean)
    return float(np.mean(np.abs(y_ - m_)))


def rmse(y: np.ndarray, mean: np.ndarray) -> float:
    """Root mean squared error ``sqrt(mean_i (y_i - mu_i)^2)``."""
    y_, m_ = _arrays(y, mean)
    return float(np.sqrt(np.mean((y_ - m_) ** 2)))


def gaussian_nll(y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> float:
    """Mean Gaussian negative log-likelihood ``1/2 (log 2π + log v_i + (y_i - mu_i)^2 / v_i)``."""
    y_, m_, v_ = _arrays(y, mean, var)
    return float(np.mean(0.5 * (np.log(2.0 * np.pi) + np.log(v_) + (y_ - m_) ** 2 / v_)))


def crps_gaussian(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> float:
    """Mean continuous ranked probability score of ``N(mu, sd^2)`` (closed form).

    ``CRPS = sd (z (2Φ(z) - 1) + 2 φ(z) - 1/sqrt(π))`` with ``z = (y - mu) / sd``
    (Gneiting & Raftery, 2007). Lower is better; in y's units.
    """
    y_, m_, s_ = _arrays(y, mean, std)
    z = (y_ - m_) / s_
    crps = s_ * (z * (2.0 * norm.cdf(z) - 1.0) + 2.0 * norm.pdf(z) - 1.0 / np.sqrt(np.pi))
    return float(np.mean(crps))


def coverage(y: np.ndarray, mean: np.ndarray, var: np.ndarray, *, level: float = 0.95) -> float:
    """Fraction of ``y`` inside the central ``level`` interval ``mu ± Φ^{-1}((1+level)/2) sd``."""
    y_, m_, v_ = _arrays(y, mean, var)
    half = _z(level) * np.sqrt(v_)
    return float(np.mean(np.abs(y_ - m_) <= half))


def interval_width(var: np.ndarray, *, level: float = 0.95) -> float:
    """Mean width of the central ``level`` interval, ``2 Φ^{-1}((1+level)/2) mean_i sd_i``."""
    (v_,) = _arrays(var)
    return float(2.0 * _z(level) * np.mean(np.sqrt(v_)))


def reliability_curve(
    y: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    *,
    levels: Sequence[float] = DEFAULT_LEVELS,
) -> tuple[np.ndarray, np.ndarray]:
    """Observed coverage of the central intervals at each nominal level.

    Returns
    -------
    levels, observed
        Arrays of the nominal levels and the observed coverage; a calibrated model lies on
        the diagonal.
    """
    lv = np.asarray(list(levels), dtype=np.float64)
    obs = np.array([coverage(y, mean, var, level=float(a)) for a in lv])
    return lv, obs


def summary(y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> dict[str, float]:
    """MAE, RMSE, NLL, CRPS, 95% coverage and mean 95% interval width in one dict."""
    std = np.sqrt(np.asarray(var, dtype=np.float64))
    return {
        "mae": mae(y, mean),
        "rmse": rmse(y, mean),
        "nll": gaussian_nll(y, mean, var),
        "crps": crps_gaussian(y, mean, std),
        "coverage95": coverage(y, mean, var, level=0.95),
        "width95": interval_width(var, level=0.95),
    }
