"""Predictive-quality metrics for Gaussian predictions (pure numpy).

All functions take arrays of equal length: targets ``y``, predictive means ``mean`` and
predictive variances ``var`` (noise included) or standard deviations, and return floats
(averages over the points) unless stated otherwise.

The module also names the metrics: the constants below are the keys under which the report's
``metrics.json``, the benchmark's JSON and the dashboard store and read each metric
(``docs/decisions/metric_names.md``), and :func:`canonical_keys` renames the keys of files
written before the names were unified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import betaincinv, ndtr, ndtri, stdtrit

__all__ = [
    "COVERAGE95",
    "COVERAGE95_INTERVAL",
    "COVERAGE95_INTERVAL_BY_PLACE",
    "CRPS",
    "DEFAULT_LEVELS",
    "LEGACY_KEYS",
    "MAE",
    "MEDIAN_ABS_ERROR",
    "NLL",
    "OFF_BY_2X",
    "PLACES",
    "RMSE",
    "STD_SUFFIX",
    "SUMMARY_KEYS",
    "THRESHOLD_CHECK_HEADER",
    "WIDTH95",
    "WIDTH_IQR",
    "WIDTH_SD",
    "canonical_keys",
    "clustered_checks_caveat",
    "coverage",
    "coverage_verdict",
    "crps_gaussian",
    "gaussian_nll",
    "interval_width",
    "mae",
    "reliability_curve",
    "rmse",
    "share_interval",
    "share_interval_by_place",
    "summary",
    "tests_range",
    "threshold_check_rows",
]

#: Mean absolute error of the predictive mean.
MAE = "mae"
#: Root mean squared error of the predictive mean.
RMSE = "rmse"
#: Mean Gaussian negative log-likelihood.
NLL = "nll"
#: Mean continuous ranked probability score.
CRPS = "crps"
#: Share of targets inside the central 95% predictive interval.
COVERAGE95 = "coverage95"
#: The 95% confidence interval ``[low, high]`` of a ``coverage95`` measured on few items
#: (:func:`share_interval`).
COVERAGE95_INTERVAL = "coverage95_interval"
#: The same interval with the items of one place counted together, as one cluster
#: (:func:`share_interval_by_place`).
COVERAGE95_INTERVAL_BY_PLACE = "coverage95_interval_by_place"
#: How many places (clusters of items) a ``coverage95`` was measured in.
PLACES = "places"
#: Mean width of the central 95% predictive interval.
WIDTH95 = "width95"
#: Standard deviation of the per-point 95% interval widths.
WIDTH_SD = "width_sd"
#: Interquartile range of the per-point 95% interval widths.
WIDTH_IQR = "width_iqr"
#: Median absolute error (the map calibration's tile levels).
MEDIAN_ABS_ERROR = "median_abs_error"
#: Share of absolute errors above log10 2, a factor of 2 (the map calibration's tile levels).
OFF_BY_2X = "off_by_2x"
#: Suffix of a metric on the standardised scale (target, mean and sd divided by the training
#: sd): ``nll_std``, ``coverage95_std``.
STD_SUFFIX = "_std"
#: The keys of :func:`summary`, in its order.
SUMMARY_KEYS: tuple[str, ...] = (MAE, RMSE, NLL, CRPS, COVERAGE95, WIDTH95)
#: Keys of older report files and the canonical key each stands for.
LEGACY_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "coverage": COVERAGE95,
        "pi_width": WIDTH95,
        "coverage" + STD_SUFFIX: COVERAGE95 + STD_SUFFIX,
        "pi_width" + STD_SUFFIX: WIDTH95 + STD_SUFFIX,
    }
)

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
    return float(ndtri(0.5 + 0.5 * level))


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
    pdf = np.exp(-0.5 * z**2) / np.sqrt(2.0 * np.pi)
    crps = s_ * (z * (2.0 * ndtr(z) - 1.0) + 2.0 * pdf - 1.0 / np.sqrt(np.pi))
    return float(np.mean(crps))


def coverage(y: np.ndarray, mean: np.ndarray, var: np.ndarray, *, level: float = 0.95) -> float:
    """Fraction of ``y`` inside the central ``level`` interval ``mu ± Φ^{-1}((1+level)/2) sd``."""
    y_, m_, v_ = _arrays(y, mean, var)
    half = _z(level) * np.sqrt(v_)
    return float(np.mean(np.abs(y_ - m_) <= half))


def share_interval(hits: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) ``confidence`` interval of the share ``hits / n``:
    ``[B^{-1}(a/2; k, n-k+1), B^{-1}(1-a/2; k+1, n-k)]`` with ``a = 1 - confidence`` and
    ``B^{-1}`` the inverse regularised incomplete beta function; 0 and 1 at ``k = 0`` and
    ``k = n``. It treats the items as independent."""
    k, n = int(hits), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= hits <= n and n >= 1, got hits={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return _clopper_pearson(k, n, confidence)


def _clopper_pearson(k: float, n: float, confidence: float) -> tuple[float, float]:
    """``[B^{-1}(a/2; k, n-k+1), B^{-1}(1-a/2; k+1, n-k)]``, 0 and 1 at ``k = 0`` and ``k = n``
    (``k``, ``n`` may be fractional: an effective size)."""
    tail = 0.5 * (1.0 - confidence)
    low = float(betaincinv(k, n - k + 1.0, tail)) if k > 0 else 0.0
    high = float(betaincinv(k + 1.0, n - k, 1.0 - tail)) if k < n else 1.0
    return low, high


def share_interval_by_place(
    hits: npt.ArrayLike, places: npt.ArrayLike, *, confidence: float = 0.95
) -> tuple[float, float] | None:
    """Confidence interval of the share of true ``hits`` (n,) when items of one place (labels
    ``places``, n) share their outcome's chance: Clopper-Pearson at the Korn-Graubard
    effective size.

    With ``p`` the share, ``h_g`` and ``n_g`` the hits and items of place ``g`` and ``C`` the
    places, the share's cluster variance is ``V = C / (C - 1) sum_g (h_g - p n_g)² / n²``,
    the effective size ``n* = min(n, p (1 - p) / V (t_{n-1} / t_{C-1})²)`` (``t_d`` the
    ``(1 + confidence) / 2`` quantile of Student's t with ``d`` degrees of freedom; the factor
    accounts for the few places the variance was estimated from), and the interval
    ``[B^{-1}(a/2; p n*, (1 - p) n* + 1), B^{-1}(1 - a/2; p n* + 1, (1 - p) n*)]``. Where the
    places agree (``V = 0``, every ``p`` of 0 or 1 included) ``n* = n``: the exact binomial
    interval of :func:`share_interval`. ``None`` with fewer than two places, whose spread
    cannot be measured.
    """
    h = np.asarray(hits, dtype=bool).reshape(-1)
    labels = np.asarray(places).reshape(-1)
    if h.size != labels.size:
        raise ValueError(f"hits and places differ in length: {h.size} and {labels.size}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    n = h.size
    _, code = np.unique(labels, return_inverse=True)
    n_places = int(code.max()) + 1 if n else 0
    if n_places < 2:
        return None
    share = float(h.mean())
    per_place_n = np.bincount(code, minlength=n_places).astype(np.float64)
    per_place_hits = np.bincount(code, weights=h.astype(np.float64), minlength=n_places)
    spread = float(np.sum((per_place_hits - share * per_place_n) ** 2))
    variance = n_places / (n_places - 1) * spread / n**2
    if variance <= 0.0:  # every place agrees (a share of 0 or 1 among them)
        return share_interval(int(h.sum()), n, confidence=confidence)
    q = 0.5 * (1.0 + confidence)
    t_ratio2 = float(stdtrit(n - 1, q) / stdtrit(n_places - 1, q)) ** 2  # n >= places >= 2
    size = min(float(n), share * (1.0 - share) / variance * t_ratio2)
    return _clopper_pearson(share * size, size, confidence)


def tests_range(block: Mapping[str, Any], *, dash: str = "–") -> str:
    """The tests a map calibration block scored its tiles from: ``30+``, or ``5–29`` for a
    block with ``max_tests`` 30 (``dash`` between the two)."""
    low, high = block.get("min_tests"), block.get("max_tests")
    return f"{low}+" if high is None else f"{low}{dash}{int(high) - 1}"


#: Columns of :func:`threshold_check_rows`.
THRESHOLD_CHECK_HEADER = (
    "served at",
    "tests",
    "tiles",
    "expected share served",
    "observed share (95% CI by place)",
    "sure served: tiles, right",
    "sure not served: tiles, right",
)


def threshold_check_rows(block: Mapping[str, Any]) -> list[list[str]]:
    """Table rows of a report's threshold check (``metrics.json``
    ``map_calibration.thresholds``, ``pipelines.threshold_check``): per threshold and group of
    test tiles (well, then less measured), the expected and observed share served (the
    latter marked ``(outside)`` when its interval leaves out the expected one) and, for the
    tiles the map is sure of, how many and the share it was right about (``–`` for none)."""
    rows = []
    for row in block.get("rows", []):
        for part in ("well_measured", "less_measured"):
            c = row.get(part)
            if not c:
                continue
            low, high = c["observed_interval"]
            well = {"min_tests": block.get("min_tests")}
            less = {"min_tests": block.get("less_min_tests"), "max_tests": block.get("min_tests")}
            tests = tests_range(well if part == "well_measured" else less)
            rows.append(
                [
                    str(row["label"]),
                    tests,
                    str(c["tiles"]),
                    f"{100 * c['expected_share']:.1f}%",
                    f"{100 * c['observed_share']:.1f}% ({100 * low:.1f}–{100 * high:.1f}%)"
                    + ("" if c["consistent"] else " (outside)"),
                    _sure_text(c["sure_served"]),
                    _sure_text(c["sure_not_served"]),
                ]
            )
    return rows


def _sure_text(part: Mapping[str, Any]) -> str:
    """``15, 100.0%`` (tiles the map was sure of, the share it was right about) or ``0``."""
    if not part.get("tiles"):
        return "0"
    return f"{part['tiles']}, {100 * part['held']:.1f}%"


def coverage_verdict(interval: Sequence[float], *, nominal: float = 0.95) -> str:
    """``"consistent"`` when ``nominal`` lies inside the measured coverage's confidence
    ``interval``; ``"too narrow"`` when the whole interval is below it (the predictive
    intervals miss too often), ``"too wide"`` when above."""
    low, high = float(interval[0]), float(interval[1])
    if high < nominal:
        return "too narrow"
    if low > nominal:
        return "too wide"
    return "consistent"


def clustered_checks_caveat(tiles: int | None, blocks: int | None) -> str:
    """A sentence for a coverage measured on ``tiles`` that lie in fewer ``blocks`` held out
    together: their errors are shared within a block, so the check is nearer ``blocks``
    independent places and an interval over the tiles is too narrow. Empty otherwise."""
    if tiles is None or blocks is None or blocks >= tiles:
        return ""
    return (
        f" These {tiles} tiles lie in {blocks} held-out block{'' if blocks == 1 else 's'}, and "
        "tiles of one block share their errors: the check is nearer "
        f"{blocks} independent place{'' if blocks == 1 else 's'} than {tiles}, so an "
        "interval counted by tile is too narrow."
    )


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
    """MAE, RMSE, NLL, CRPS, 95% coverage and mean 95% interval width, keyed by
    :data:`SUMMARY_KEYS`."""
    std = np.sqrt(np.asarray(var, dtype=np.float64))
    return {
        MAE: mae(y, mean),
        RMSE: rmse(y, mean),
        NLL: gaussian_nll(y, mean, var),
        CRPS: crps_gaussian(y, mean, std),
        COVERAGE95: coverage(y, mean, var, level=0.95),
        WIDTH95: interval_width(var, level=0.95),
    }


def canonical_keys(doc: Any) -> Any:
    """``doc`` (a loaded metrics or benchmark JSON) with legacy metric keys renamed.

    Walks dicts and lists recursively and renames each key of :data:`LEGACY_KEYS` whose value
    is a number or ``None`` (a metric); a list under such a key, like a reliability curve's
    observed coverages, keeps its name. A canonical key already present is kept over its legacy
    twin. Returns a new object; ``doc`` is not changed.
    """
    if isinstance(doc, list):
        return [canonical_keys(v) for v in doc]
    if not isinstance(doc, dict):
        return doc
    out: dict[Any, Any] = {}
    for key, value in doc.items():
        new = LEGACY_KEYS.get(key) if isinstance(key, str) else None
        is_metric = value is None or (
            isinstance(value, int | float) and not isinstance(value, bool)
        )
        if new is not None and is_metric:
            if new not in doc:
                out[new] = value
            continue
        out[key] = canonical_keys(value)
    return out
