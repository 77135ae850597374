"""Scores of Gaussian predictions by urban/rural group, as written to ``metrics.json``.

Formulas (``docs/methods.md``, Metrics; computed and named by :mod:`geodbk.metrics`): MAE, RMSE;
Gaussian NLL = mean(0.5 log(2π var) + (y-mu)²/(2 var)); closed-form Gaussian CRPS; 95% PI
coverage (``coverage95``) = share with |y-mu| ≤ 1.96 sd; mean 95% PI width (``width95``) =
3.92 sd. Each group is scored on the log10 scale (plain keys) and on the standardised scale
(keys with ``_std``: y, mu and sd divided by the training sd, so ``nll_std = nll − ln
sd_train``; coverage is scale-free). :func:`by_tests_scores` and
:func:`by_quarter_scores` score subsets of the rows (buckets of speed tests per tile, quarters)
with the same functions (:func:`grouped_scores`). :func:`clustered_coverage_interval` gives a
coverage rate's 95% interval by a bootstrap over tiles.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from geodbk import metrics
from geodbk.geo.timeaxis import format_quarter, quarter_indices


def gaussian_scores(y: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> dict[str, float]:
    """:func:`geodbk.metrics.summary` of N(mu, sd²) predictions of ``y`` (MAE, RMSE, NLL, CRPS,
    95% coverage and mean 95% PI width under :data:`geodbk.metrics.SUMMARY_KEYS`).

    An empty group gives NaN (written as ``null``).
    """
    y, mu, sd = (np.asarray(a, dtype=np.float64) for a in (y, mu, sd))
    if len(y) == 0:
        return {k: math.nan for k in metrics.SUMMARY_KEYS}
    return metrics.summary(y, mu, sd**2)


def group_scores(
    y: np.ndarray, mu: np.ndarray, sd: np.ndarray, *, sd_train: float
) -> dict[str, Any]:
    """Scores on the log10 scale plus ``*_std`` keys on the standardised scale, and ``n``."""
    out: dict[str, Any] = {"n": len(y)}
    out.update(gaussian_scores(y, mu, sd))
    std = gaussian_scores(y / sd_train, mu / sd_train, sd / sd_train)
    out.update({k + metrics.STD_SUFFIX: v for k, v in std.items()})
    return out


def urban_rural_scores(
    y: np.ndarray, mu: np.ndarray, sd: np.ndarray, urban: np.ndarray, *, sd_train: float
) -> dict[str, dict[str, Any]]:
    """``{"urban": ..., "rural": ..., "all": ...}`` of :func:`group_scores`."""
    urban = np.asarray(urban, dtype=bool)
    groups = {"urban": urban, "rural": ~urban, "all": np.ones_like(urban)}
    return {g: group_scores(y[m], mu[m], sd[m], sd_train=sd_train) for g, m in groups.items()}


def reliability(
    y: np.ndarray, mu: np.ndarray, sd: np.ndarray, levels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Empirical coverage of central Gaussian intervals at nominal ``levels`` (default 0.50–0.99)."""
    if levels is None:
        levels = np.round(np.arange(0.50, 0.991, 0.01), 2)
    sd = np.asarray(sd, dtype=np.float64)
    return metrics.reliability_curve(y, mu, sd**2, levels=[float(v) for v in levels])


def clean_json(obj: Any) -> Any:
    """Replace NaN/inf floats by ``None`` recursively (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


#: Buckets of the number of speed tests per tile: ``(label, lowest, highest)`` (inclusive).
TESTS_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("1", 1, 1),
    ("2", 2, 2),
    ("3-4", 3, 4),
    ("5-8", 5, 8),
    ("9-16", 9, 16),
    (">16", 17, math.inf),
)


def bucket_masks(tests: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean masks of :data:`TESTS_BUCKETS` (``1``, ``2``, ``3-4``, ``5-8``, ``9-16``, ``>16``).

    Counts are rounded to integers and values below 1 count as 1.
    """
    t = np.maximum(np.rint(np.asarray(tests, dtype=np.float64)), 1.0)
    return {label: (t >= lo) & (t <= hi) for label, lo, hi in TESTS_BUCKETS}


#: Keys of each group of :func:`grouped_scores` (``by_tests``, ``by_quarter``).
GROUP_KEYS: tuple[str, ...] = (metrics.NLL, metrics.COVERAGE95, metrics.WIDTH95, metrics.MAE)


def grouped_scores(
    y: np.ndarray,
    mu: np.ndarray,
    sd: np.ndarray,
    urban: np.ndarray,
    masks: dict[str, np.ndarray],
) -> dict[str, dict[str, Any]]:
    """``{label: {"n", "nll", "coverage95", "width95", "mae", "urban": {...}, "rural": {...}}}``.

    Scores (log10 scale, :func:`gaussian_scores`: NLL = mean(0.5 log(2π sd²) +
    (y − mu)²/(2 sd²)), coverage95 = share with |y − mu| ≤ 1.96 sd, width95 = 3.92 mean(sd),
    MAE = mean |y − mu|) of the rows of each boolean mask, overall and split urban / rural
    (same keys, no nesting). An empty group gives ``n = 0`` and NaN scores.
    """
    y, mu, sd = (np.asarray(a, dtype=np.float64) for a in (y, mu, sd))
    urban = np.asarray(urban, dtype=bool)
    out: dict[str, dict[str, Any]] = {}
    for label, m in masks.items():
        row: dict[str, Any] = {"n": int(m.sum())}
        s = gaussian_scores(y[m], mu[m], sd[m])
        row.update({k: s[k] for k in GROUP_KEYS})
        for g, gm in (("urban", m & urban), ("rural", m & ~urban)):
            sg = gaussian_scores(y[gm], mu[gm], sd[gm])
            row[g] = {"n": int(gm.sum()), **{k: sg[k] for k in GROUP_KEYS}}
        out[label] = row
    return out


def by_tests_scores(
    y: np.ndarray,
    mu: np.ndarray,
    sd: np.ndarray,
    urban: np.ndarray,
    tests: np.ndarray,
) -> dict[str, dict[str, Any]]:
    """``{bucket: {"n", "nll", "coverage95", "width95", "mae", "urban": {...}, "rural": {...}}}``.

    :func:`grouped_scores` of the rows whose number of tests falls in each bucket of
    :data:`TESTS_BUCKETS`.
    """
    return grouped_scores(y, mu, sd, urban, bucket_masks(tests))


def quarter_masks(quarters: Any, *, codes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Boolean masks of each distinct quarter, keyed ``2023Q4`` (canonical), in time order.

    ``quarters`` holds one quarter string per row; with ``codes`` (one integer per row) it holds
    the distinct values instead and row ``i`` has quarter ``quarters[codes[i]]`` (a dictionary
    encoding, so that many rows need no string each).
    """

    idx = quarter_indices(np.asarray(quarters, dtype=object).astype(str))
    if codes is not None:
        idx = idx[np.asarray(codes, dtype=np.intp)] if idx.size else np.zeros(0, dtype=np.int64)
    return {format_quarter(int(i)): idx == i for i in np.unique(idx)}


def by_quarter_scores(
    y: np.ndarray,
    mu: np.ndarray,
    sd: np.ndarray,
    urban: np.ndarray,
    quarters: Any,
    *,
    codes: np.ndarray | None = None,
) -> dict[str, dict[str, Any]]:
    """``{quarter: {"n", "nll", "coverage95", "width95", "mae", "urban": {...}, "rural": {...}}}``.

    :func:`grouped_scores` of the rows of each quarter present in ``quarters`` (one quarter
    string per row, or the distinct quarters indexed by ``codes``, see :func:`quarter_masks`),
    keyed and ordered by quarter (``2023Q1`` before ``2023Q2``).
    """
    return grouped_scores(y, mu, sd, urban, quarter_masks(quarters, codes=codes))


def clustered_coverage_interval(
    hit: np.ndarray, tile: np.ndarray, *, reps: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of a coverage rate by a bootstrap over tiles (clusters), not rows.

    A tile appears once per quarter, and its quarters' misses are correlated (a tile whose
    speed the smooth field cannot follow misses in many quarters), so the binomial sd over rows
    understates the uncertainty. Each replicate draws the distinct tiles with replacement
    (multinomial counts ``c_t``) and takes ``sum_t c_t hits_t / sum_t c_t rows_t``; returns the
    2.5% and 97.5% quantiles.
    """
    _, inverse = np.unique(tile, return_inverse=True)
    hits = np.bincount(inverse, weights=hit.astype(np.float64))
    rows = np.bincount(inverse).astype(np.float64)
    k = rows.size
    counts = np.random.default_rng(seed).multinomial(k, np.full(k, 1.0 / k), size=reps)
    rates = (counts @ hits) / np.maximum(counts @ rows, 1.0)
    lo, hi = np.quantile(rates, [0.025, 0.975])
    return float(lo), float(hi)
