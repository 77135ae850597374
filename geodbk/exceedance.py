"""The probability that a Gaussian quantity is on one side of a threshold: the exceedance
layers of the maps, the report's service shares, the area summaries and the dashboard.

    P(q >= t) = Phi((mean - t) / sd),    P(q <= t) = Phi((t - mean) / sd),    q ~ N(mean, sd²)

with a point mass at ``mean`` where ``sd = 0``; NaN in, NaN out. All in the units of ``q``
(log10 of the target for the maps).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import ndtr

__all__ = ["exceedance_probability"]


def exceedance_probability(mean: Any, sd: Any, threshold: Any, *, above: bool) -> np.ndarray:
    """``P(q >= threshold)`` when ``above`` else ``P(q <= threshold)`` for ``q ~ N(mean,
    sd²)`` (arrays broadcast); a point mass where ``sd = 0``."""
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(sd, dtype=np.float64)
    diff = np.asarray(m - threshold if above else threshold - m, dtype=np.float64)
    s = np.broadcast_to(s, diff.shape)
    at_zero = np.where(diff >= 0, np.inf, -np.inf)
    at_zero[np.isnan(diff)] = np.nan
    z = np.divide(diff, s, out=at_zero, where=s > 0)
    return np.asarray(ndtr(z), dtype=np.float64)
