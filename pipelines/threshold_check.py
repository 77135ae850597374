"""The map's thresholds on held-out tiles: are its "90% sure" statements right?

A broadband office reads a tile map at a threshold: "P(download >= 25 Mbps) is below 10%
here". For held-out (test) tiles scored as the report's map calibration scores them
(:func:`pipelines.map_calibration.tile_level_errors`: each tile's tests-weighted level, the
map's prediction of it and that prediction's sd with the level's own noise), at a threshold
``t`` on the good side of which a tile counts as served (``level >= t`` for speeds,
``<= t`` for latency):

- the **expected share** served, the mean of ``p_i = P(served)``, against the **observed
  share** (the tiles whose level is on the good side), with the observed share's 95%
  interval counted by place (:func:`geodbk.metrics.share_interval_by_place`);
- the tiles the map is **sure are served** (``p_i >= SURE_PROB``) and the share of them that
  are; the same for the tiles it is **sure are not** (``p_i <= 1 - SURE_PROB``). A calibrated
  map is right about such tiles at least ``SURE_PROB`` of the time; each part also gives the
  mean probability the map stated for its tiles (``stated``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from geodbk.exceedance import exceedance_probability
from geodbk.metrics import share_interval, share_interval_by_place

__all__ = ["SURE_PROB", "threshold_check"]

#: The probability from which the map is "sure" a place is (or is not) served; the report's
#: service coverage counts tiles served with this probability.
SURE_PROB = 0.9


def threshold_check(
    levels: pd.DataFrame, *, threshold: float, above: bool, sure: float = SURE_PROB
) -> dict[str, Any] | None:
    """The module docstring's scores at ``threshold`` (log10; ``above``: served at or above
    it) of ``levels`` (:func:`pipelines.map_calibration.tile_level_errors`' frame); ``None``
    without tiles.

    Returns
    -------
    dict
        ``{"tiles", "expected_share", "observed_share", "observed_interval", "consistent",
        "sure_served", "sure_not_served"}``; each ``sure_*`` ``{"tiles", "stated", "held"}``
        (``stated`` and ``held`` ``None`` without such tiles).
    """
    if levels.empty:
        return None
    level = levels["level"].to_numpy(np.float64)
    p = exceedance_probability(
        level + levels["error"].to_numpy(np.float64),
        levels["sd"].to_numpy(np.float64),
        threshold,
        above=above,
    )
    served = level >= threshold if above else level <= threshold
    interval = share_interval_by_place(served, levels["place"].to_numpy()) or share_interval(
        int(served.sum()), served.size
    )
    expected = float(p.mean())
    return {
        "tiles": int(served.size),
        "expected_share": expected,
        "observed_share": float(served.mean()),
        "observed_interval": [float(v) for v in interval],
        "consistent": bool(interval[0] <= expected <= interval[1]),
        "sure_served": _sure(p >= sure, p, served),
        "sure_not_served": _sure(p <= 1.0 - sure, 1.0 - p, ~served),
    }


def _sure(mask: np.ndarray, stated: np.ndarray, right: np.ndarray) -> dict[str, Any]:
    """How many tiles ``mask`` holds, the mean probability stated for them and the share of
    them the statement was ``right`` about."""
    if not mask.any():
        return {"tiles": 0, "stated": None, "held": None}
    return {
        "tiles": int(mask.sum()),
        "stated": float(stated[mask].mean()),
        "held": float(right[mask].mean()),
    }
