"""Service classes: the probability that a place meets nested speed tiers with low latency.

A place meets tier ``j`` (``d_j`` Mbps down, ``u_j`` Mbps up) when its download ``D``, upload
``U`` and latency ``L`` satisfy ``D >= d_j``, ``U >= u_j`` and ``L <= l`` (``l`` ms, the same
for every tier). With tiers nested (each at least as strict as the previous one in both
directions) the events are nested, and the ``k`` tiers give ``k + 1`` classes::

    P(class 0) = 1 - P(tier 1)                      (unserved)
    P(class j) = P(tier j) - P(tier j + 1)          (0 < j < k; underserved for k = 2)
    P(class k) = P(tier k)                          (served)

Default tiers: the BEAD programme's, unserved below 25/3 Mbps, underserved below 100/20 Mbps,
and latency of at most 100 ms needed to count as served at any tier.

Each target's model gives a Gaussian ``N(m_t, s_t²)`` for ``log10`` of the target at a place.
The three are joined by a Gaussian copula with correlation ``R``, estimated from the models'
standardised residuals (:func:`gaussian_copula_correlation`), so that ``(log10 D, log10 U,
log10 L)`` is trivariate normal with those marginals and correlation ``R``. Then::

    P(tier j) = P(W_1 <= b_1, W_2 <= b_2, W_3 <= b_3),   W ~ N(0, S R S),  S = diag(-1, -1, 1)
    b = ((m_D - log10 d_j) / s_D, (m_U - log10 u_j) / s_U, (log10 l - m_L) / s_L)

(:func:`tier_probabilities`), a trivariate normal orthant probability computed by
:func:`orthant_probability`. Pure numpy/scipy; no file I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import rankdata

from geodbk.metrics import tests_range

__all__ = [
    "BEAD_TIERS",
    "DEFAULT_LATENCY_MS",
    "HELD_OUT_CLASS_HEADER",
    "MIN_COPULA_ROWS",
    "Tier",
    "bivariate_normal_cdf",
    "check_correlation",
    "check_tiers",
    "class_colours",
    "class_definitions",
    "class_names",
    "class_probabilities",
    "gaussian_copula_correlation",
    "held_out_class_rows",
    "held_out_group_text",
    "level_classes",
    "most_probable_class",
    "orthant_probability",
    "parse_tiers",
    "tier_probabilities",
]


@dataclass(frozen=True)
class Tier:
    """A speed tier: at least ``down_mbps`` download and ``up_mbps`` upload (Mbps)."""

    down_mbps: float
    up_mbps: float

    @property
    def label(self) -> str:
        """``"25/3"``."""
        return f"{self.down_mbps:g}/{self.up_mbps:g}"


#: The BEAD tiers: below 25/3 Mbps unserved, below 100/20 Mbps underserved.
BEAD_TIERS: tuple[Tier, ...] = (Tier(25.0, 3.0), Tier(100.0, 20.0))
#: Latency (ms) a place must not exceed to count as served at any tier (BEAD: 100 ms).
DEFAULT_LATENCY_MS = 100.0
#: Fewest residual rows :func:`gaussian_copula_correlation` accepts.
MIN_COPULA_ROWS = 30


def check_tiers(tiers: Sequence[Tier]) -> tuple[Tier, ...]:
    """``tiers`` as a tuple if each speed is positive and finite and the tiers are nested:
    each at least the previous one in both download and upload and stricter in one of them.

    Raises
    ------
    ValueError
        Naming the tier at fault and what a valid list looks like.
    """
    out = tuple(tiers)
    if not out:
        raise ValueError("give at least one tier, e.g. 25/3,100/20 (Mbps down/up)")
    for t in out:
        if not all(math.isfinite(v) and v > 0 for v in (t.down_mbps, t.up_mbps)):
            raise ValueError(f"tier {t.label}: speeds must be positive finite Mbps (e.g. 25/3)")
    for prev, cur in itertools.pairwise(out):
        weaker = cur.down_mbps < prev.down_mbps or cur.up_mbps < prev.up_mbps
        if weaker or cur == prev:
            raise ValueError(
                f"tiers must be nested, from the lowest to the highest: {cur.label} after "
                f"{prev.label} is not stricter in download and upload (e.g. 25/3,100/20)"
            )
    return out


def parse_tiers(text: str) -> tuple[Tier, ...]:
    """``"25/3,100/20"`` -> ``(Tier(25, 3), Tier(100, 20))``, checked by :func:`check_tiers`.

    Raises
    ------
    ValueError
        On an empty list, an item that is not ``DOWN/UP`` numbers, or tiers that are not
        nested.
    """
    items = [s.strip() for s in str(text).split(",")]
    if not any(items):
        raise ValueError("give at least one tier DOWN/UP in Mbps, e.g. 25/3,100/20")
    tiers = []
    for item in items:
        parts = item.split("/")
        try:
            if len(parts) != 2:
                raise ValueError
            down, up = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(
                f"tier {item!r} is not DOWN/UP in Mbps; write the tiers like 25/3,100/20"
            ) from None
        tiers.append(Tier(down, up))
    return check_tiers(tiers)


def class_names(n_tiers: int) -> tuple[str, ...]:
    """Names of the ``n_tiers + 1`` classes, lowest first: ``unserved``, ``underserved``,
    ``served`` for two tiers; ``unserved``, ``served`` for one; ``unserved``,
    ``underserved_1`` ... ``underserved_{k-1}``, ``served`` for ``k >= 3`` (class ``j``
    meets tier ``j`` but not tier ``j + 1``)."""
    if n_tiers < 1:
        raise ValueError("at least one tier is needed")
    if n_tiers == 1:
        return ("unserved", "served")
    if n_tiers == 2:
        return ("unserved", "underserved", "served")
    middle = tuple(f"underserved_{j}" for j in range(1, n_tiers))
    return ("unserved", *middle, "served")


def class_definitions(tiers: Sequence[Tier], latency_ms: float) -> tuple[str, ...]:
    """What each class of :func:`class_names` means, lowest first: ``"meets no tier: below 25/3
    Mbps, or latency above 100 ms"``, ``"meets 25/3 but not 100/20 Mbps (latency at most 100
    ms)"``, ``"meets 100/20 Mbps with latency at most 100 ms"``."""
    t, lat = check_tiers(tiers), f"{latency_ms:g} ms"
    first = f"meets no tier: below {t[0].label} Mbps, or latency above {lat}"
    middle = tuple(
        f"meets {a.label} but not {b.label} Mbps (latency at most {lat})"
        for a, b in itertools.pairwise(t)
    )
    return (first, *middle, f"meets {t[-1].label} Mbps with latency at most {lat}")


def check_correlation(corr: np.ndarray, *, tol: float = 1e-8) -> np.ndarray:
    """``corr`` as a float64 array if it is a symmetric positive definite correlation matrix
    (unit diagonal, Cholesky factor with every pivot above ``sqrt(tol)``), else ``ValueError``."""
    R = np.asarray(corr, dtype=np.float64)
    if R.ndim != 2 or R.shape[0] != R.shape[1]:
        raise ValueError(f"a correlation matrix must be square, got shape {R.shape}")
    if not np.isfinite(R).all():
        raise ValueError("the correlation matrix has non-finite entries")
    if not np.allclose(R, R.T, atol=1e-10) or not np.allclose(np.diag(R), 1.0, atol=1e-10):
        raise ValueError("a correlation matrix must be symmetric with a unit diagonal")
    try:
        L = np.linalg.cholesky(R)
    except np.linalg.LinAlgError:
        raise ValueError("the correlation matrix is not positive definite") from None
    if np.min(np.diag(L)) ** 2 < tol:
        raise ValueError("the correlation matrix is singular (a target is a copy of the others)")
    return R


def gaussian_copula_correlation(residuals: np.ndarray) -> np.ndarray:
    """The Gaussian copula's correlation from an (n, d) array of residuals (one column per
    target): the normal scores of each column's ranks, then their correlation::

        z_it = Phi^-1(rank_it / (n + 1)),   R_st = sum_i z_is z_it / sqrt(sum_i z_is² sum_i z_it²)

    (ties get their mean rank). Ranks make the estimate depend only on the dependence between
    the columns, not on how well each column's marginal is calibrated.

    Raises
    ------
    ValueError
        Fewer than :data:`MIN_COPULA_ROWS` rows, non-finite values, a constant column, or a
        correlation that is not positive definite.
    """
    Z = np.asarray(residuals, dtype=np.float64)
    if Z.ndim != 2 or Z.shape[1] < 2:
        raise ValueError(f"give an (n, d >= 2) array of residuals, got shape {Z.shape}")
    n = Z.shape[0]
    if n < MIN_COPULA_ROWS:
        raise ValueError(f"the copula needs at least {MIN_COPULA_ROWS} rows, got {n}")
    if not np.isfinite(Z).all():
        raise ValueError("residuals must be finite")
    scores = ndtri(rankdata(Z, axis=0) / (n + 1))
    scores -= scores.mean(axis=0)  # 0 up to ties
    norm = np.sqrt((scores**2).sum(axis=0))
    if (norm <= 0).any():
        raise ValueError("a residual column is constant; its correlation is undefined")
    R = (scores.T @ scores) / np.outer(norm, norm)
    R = 0.5 * (R + R.T)
    np.fill_diagonal(R, 1.0)
    return check_correlation(R)


@lru_cache(maxsize=8)
def _legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [-1, 1]."""
    x, w = np.polynomial.legendre.leggauss(n)
    return x, w


def _bvn_nodes(rho: float) -> int:
    """Gauss-Legendre nodes of the bivariate CDF's integral by ``|rho|``: 4, 6, 8, 12 below
    0.3, 0.6, 0.8, 0.925 (each below 1e-10 absolute error against Genz's 20-node rule), 20
    above (Genz's expansion)."""
    a = abs(rho)
    return 4 if a < 0.3 else 6 if a < 0.6 else 8 if a < 0.8 else 12 if a < 0.925 else 20


def bivariate_normal_cdf(h: np.ndarray, k: np.ndarray, rho: float) -> np.ndarray:
    """``P(X <= h, Y <= k)`` for a standard bivariate normal with correlation ``rho`` (one value,
    ``|rho| < 1``), elementwise over ``h`` and ``k``.

    Drezner and Wesolowsky's method as revised by Genz (2004, "Numerical computation of
    rectangular bivariate and trivariate normal and t probabilities", Statistics and Computing
    14: 251-260), vectorised: for ``|rho| < 0.925`` Plackett's formula::

        Phi2(h, k; rho) = Phi(h) Phi(k)
                          + 1/(2 pi) int_0^asin(rho) exp(-(h² + k² - 2hk sin t) / (2 cos² t)) dt

    by Gauss-Legendre (6, 12 or 20 nodes by ``|rho|``); for larger ``|rho|`` Genz's expansion
    around ``|rho| = 1``. Absolute error below 1e-14 (Genz).
    """
    if not abs(rho) < 1.0:
        raise ValueError(f"|rho| must be below 1, got {rho}")
    # P(X > dh, Y > dk) with dh = -h, dk = -k (Genz's bvnu)
    dh = -np.clip(np.asarray(h, dtype=np.float64), -40.0, 40.0)
    dk = -np.clip(np.asarray(k, dtype=np.float64), -40.0, 40.0)
    dh, dk = np.broadcast_arrays(dh, dk)
    if rho == 0.0:
        return np.asarray(ndtr(-dh) * ndtr(-dk))
    x, w = _legendre(_bvn_nodes(rho))
    u, wu = (x + 1.0) / 2.0, w / 2.0  # nodes on [0, 1]
    hk = dh * dk
    two_pi = 2.0 * math.pi
    if abs(rho) < 0.925:
        hs = (dh * dh + dk * dk) / 2.0
        asr = math.asin(rho)
        acc = np.zeros(dh.shape)
        term = np.empty(dh.shape)
        scratch = np.empty(dh.shape)
        for ui, wi in zip(u, wu, strict=True):  # acc += w exp((sn hk - hs) / (1 - sn²))
            sn = math.sin(asr * ui)
            inv = 1.0 / (1.0 - sn * sn)
            np.multiply(hk, sn * inv, out=term)
            np.multiply(hs, inv, out=scratch)
            term -= scratch
            term += math.log(wi)
            np.exp(term, out=term)
            acc += term
        acc *= asr / two_pi
        acc += ndtr(-dh) * ndtr(-dk)
        return np.asarray(np.clip(acc, 0.0, 1.0, out=acc))
    with np.errstate(over="ignore", invalid="ignore"):  # terms np.where drops may overflow
        return _bvn_high(dh, -dk if rho < 0 else dk, rho)


def _bvn_high(dh: np.ndarray, kk: np.ndarray, rho: float) -> np.ndarray:
    """Genz's ``bvnu`` for ``|rho| >= 0.925`` (``kk``: ``dk`` with the sign of ``rho``)."""
    x, w = _legendre(_bvn_nodes(rho))
    u, wu = (x + 1.0) / 2.0, w / 2.0
    two_pi = 2.0 * math.pi
    hk = dh * kk
    a_s = 1.0 - rho * rho
    a = math.sqrt(a_s)
    bs = (dh - kk) ** 2
    c = (4.0 - hk) / 8.0
    d = (12.0 - hk) / 80.0
    asr = -(bs / a_s + hk) / 2.0
    bvn = np.where(
        asr > -100.0,
        a
        * np.exp(np.maximum(asr, -100.0))
        * (1 - c * (bs - a_s) * (1 - d * bs) / 3 + c * d * a_s**2),
        0.0,
    )
    b = np.sqrt(bs)
    sp = math.sqrt(two_pi) * ndtr(-b / a)
    tail = np.exp(-np.maximum(hk, -100.0) / 2.0) * sp * b * (1 - c * bs * (1 - d * bs) / 3)
    bvn = bvn - np.where(hk > -100.0, tail, 0.0)
    acc = np.zeros(dh.shape)
    for ui, wi in zip(u, wu, strict=True):  # the integral over s in [0, a], s = a u
        xs = (a * ui) ** 2
        arg = -(bs / xs + hk) / 2.0
        sp2 = 1.0 + c * xs * (1.0 + 5.0 * d * xs)
        rs = math.sqrt(1.0 - xs)
        ep = np.exp(-(hk / 2.0) * xs / (1.0 + rs) ** 2) / rs
        acc += wi * np.where(arg > -100.0, np.exp(np.maximum(arg, -100.0)) * (sp2 - ep), 0.0)
    bvn = (a * acc - bvn) / two_pi
    if rho > 0:
        bvn = bvn + ndtr(-np.maximum(dh, kk))
    else:
        gap = np.where(dh < 0, ndtr(kk) - ndtr(dh), ndtr(-dh) - ndtr(-kk))
        bvn = np.where(dh >= kk, -bvn, gap - bvn)
    return np.asarray(np.clip(bvn, 0.0, 1.0))


#: Beyond this many sds the conditioning variable's tail is dropped (Phi(-8.5) ~ 1e-17).
_TAIL = 8.5


def _outer_nodes(slope: float) -> int:
    """Gauss-Legendre nodes of the outer integral: 16, more when the inner limits move
    steeply with the conditioning variable (``slope`` = max |r| / sqrt(1 - r²)), up to 96."""
    return int(min(96, max(16, math.ceil(12.0 * (1.0 + slope)))))


def orthant_probability(
    upper: np.ndarray, corr: np.ndarray, *, chunk_size: int = 8192
) -> np.ndarray:
    """``P(W <= upper)`` row by row for ``W ~ N(0, corr)`` trivariate (``upper``: (n, 3)).

    One variable ``W_i`` is integrated out numerically and the other two by the bivariate CDF
    (:func:`bivariate_normal_cdf`)::

        P = int_{-inf}^{b_i} phi(x) Phi2(h(x), k(x); rho) dx,
        h(x) = (b_j - r_ij x) / sqrt(1 - r_ij²),  k(x) = (b_k - r_ik x) / sqrt(1 - r_ik²),
        rho  = (r_jk - r_ij r_ik) / sqrt((1 - r_ij²)(1 - r_ik²))

    (``rho``: the partial correlation of ``W_j, W_k`` given ``W_i``). ``W_i`` is the variable
    least correlated with the others, so ``h`` and ``k`` move least with ``x``. For ``b_i >= 0``
    the complement ``Phi2(b_j, b_k; r_jk) - int_{b_i}^{inf}`` is used, so the integral runs over
    at most 8.5 sds (``[-8.5, b_i]`` or ``[b_i, 8.5]``), by a fixed Gauss-Legendre rule of 16
    to 96 nodes (more when ``max |r| / sqrt(1 - r²)`` is larger). The integrand is smooth, and
    ``R`` is shared by every row, so the nodes and constants are set once;
    the work is ``n x nodes x (4-20 exp + 2 ndtr)``, chunked by ``chunk_size`` rows. Measured
    error: see ``docs/decisions/service_classes.md`` (below 1e-6 against
    ``scipy.stats.multivariate_normal.cdf`` for correlations up to 0.9).
    """
    R = check_correlation(corr)
    if R.shape != (3, 3):
        raise ValueError(f"orthant_probability is trivariate: corr must be 3 x 3, got {R.shape}")
    b = np.asarray(upper, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != 3:
        raise ValueError(f"upper must be (n, 3), got shape {b.shape}")
    if np.isnan(b).any():
        raise ValueError("upper limits must not be NaN")
    off = np.abs(R - np.eye(3))
    i = int(np.argmin(off.max(axis=1)))
    j, k = (v for v in range(3) if v != i)
    rij, rik, rjk = R[i, j], R[i, k], R[j, k]
    sj, sk = math.sqrt(1.0 - rij * rij), math.sqrt(1.0 - rik * rik)
    rho = (rjk - rij * rik) / (sj * sk)
    rho = float(np.clip(rho, -1.0 + 1e-12, 1.0 - 1e-12))
    t, wt = _legendre(_outer_nodes(max(abs(rij) / sj, abs(rik) / sk)))
    out = np.empty(b.shape[0])
    for s in range(0, b.shape[0], chunk_size):
        part = b[s : s + chunk_size]
        bi = np.clip(part[:, i], -_TAIL, _TAIL)
        lower_half = bi < 0
        lo = np.where(lower_half, -_TAIL, bi)
        hi = np.where(lower_half, bi, _TAIL)
        half = ((hi - lo) / 2.0)[:, None]
        x = lo[:, None] + half * (t[None, :] + 1.0)
        h = (part[:, j : j + 1] - rij * x) / sj
        kx = (part[:, k : k + 1] - rik * x) / sk
        dens = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        integral = (half[:, 0]) * ((dens * bivariate_normal_cdf(h, kx, rho)) @ wt)
        whole = bivariate_normal_cdf(part[:, j], part[:, k], float(rjk))
        out[s : s + chunk_size] = np.where(lower_half, integral, whole - integral)
    return np.clip(out, 0.0, 1.0)


def tier_probabilities(
    mean: np.ndarray,
    sd: np.ndarray,
    thresholds: np.ndarray,
    corr: np.ndarray,
    *,
    chunk_size: int = 8192,
) -> np.ndarray:
    """``P(tier j)`` at n places, (n, k): ``P(X_1 >= t_j1, X_2 >= t_j2, X_3 <= t_j3)`` for
    ``X ~ N(mean, diag(sd) R diag(sd))`` (log10 download, upload, latency).

    Parameters
    ----------
    mean, sd
        (n, 3) means and sds of log10 download, upload and latency at each place.
    thresholds
        (k, 3) log10 thresholds of each tier: minimum download, minimum upload, maximum
        latency, in the units of ``mean``.
    corr
        (3, 3) copula correlation R of (download, upload, latency).

    The events are made nested whatever rounding does: ``P(tier j)`` never exceeds
    ``P(tier j - 1)`` when the tiers are nested (checked on ``thresholds``).
    """
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(sd, dtype=np.float64)
    thr = np.atleast_2d(np.asarray(thresholds, dtype=np.float64))
    if m.ndim != 2 or m.shape[1] != 3 or s.shape != m.shape:
        raise ValueError(f"mean and sd must both be (n, 3), got {m.shape} and {s.shape}")
    if thr.shape[1] != 3 or not np.isfinite(thr).all():
        raise ValueError("thresholds must be a finite (k, 3) array")
    if not (np.isfinite(m).all() and np.isfinite(s).all() and (s > 0).all()):
        raise ValueError("means must be finite and sds positive and finite")
    R = check_correlation(corr)
    flip = np.array([-1.0, -1.0, 1.0])
    R_w = R * np.outer(flip, flip)  # W = S Z, S = diag(-1, -1, 1): every event is W <= b
    out = np.empty((m.shape[0], thr.shape[0]))
    for j, (t_down, t_up, t_lat) in enumerate(thr):
        b = np.column_stack(
            [(m[:, 0] - t_down) / s[:, 0], (m[:, 1] - t_up) / s[:, 1], (t_lat - m[:, 2]) / s[:, 2]]
        )
        out[:, j] = orthant_probability(b, R_w, chunk_size=chunk_size)
    nested = (np.diff(thr[:, :2], axis=0) >= 0).all() and np.ptp(thr[:, 2]) == 0
    if nested:
        out = np.minimum.accumulate(out, axis=1)
    return out


def class_probabilities(tier_p: np.ndarray) -> np.ndarray:
    """(n, k + 1) class probabilities from (n, k) nested tier probabilities::

        P(class 0) = 1 - P_1,  P(class j) = P_j - P_{j+1},  P(class k) = P_k

    with the ``P_j`` made non-increasing and clipped to [0, 1], so each row lies in [0, 1] and
    sums to 1."""
    p = np.clip(np.atleast_2d(np.asarray(tier_p, dtype=np.float64)), 0.0, 1.0)
    p = np.minimum.accumulate(p, axis=1)
    n = p.shape[0]
    upper = np.column_stack([np.ones(n), p])
    lower = np.column_stack([p, np.zeros(n)])
    return np.clip(upper - lower, 0.0, 1.0)


def most_probable_class(class_p: np.ndarray) -> np.ndarray:
    """Index of each row's most probable class (the lower class on a tie), int8."""
    return np.argmax(np.asarray(class_p), axis=1).astype(np.int8)


def level_classes(levels: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """The class of known (n, 3) log10 levels of download, upload and latency: the number of
    leading tiers met, tier ``j`` met when ``L_D >= t_j1``, ``L_U >= t_j2`` and
    ``L_L <= t_j3`` (``thresholds`` (k, 3) as for :func:`tier_probabilities`), int8."""
    L = np.asarray(levels, dtype=np.float64)
    thr = np.atleast_2d(np.asarray(thresholds, dtype=np.float64))
    if L.ndim != 2 or L.shape[1] != 3 or thr.shape[1] != 3:
        raise ValueError(f"levels must be (n, 3) and thresholds (k, 3), got {L.shape}, {thr.shape}")
    met = (
        (L[:, None, 0] >= thr[None, :, 0])
        & (L[:, None, 1] >= thr[None, :, 1])
        & (L[:, None, 2] <= thr[None, :, 2])
    )
    return np.cumprod(met, axis=1).sum(axis=1).astype(np.int8)


#: Columns of :func:`held_out_class_rows`.
HELD_OUT_CLASS_HEADER = (
    "class",
    "expected share",
    "observed share (95% CI by place)",
    "tiles where it is most probable",
    "of those, in it",
)


def held_out_group_text(part: Mapping[str, Any]) -> str:
    """``116 test tiles with 30+ tests of each target, in 40 places: the map's most probable
    class was the tile's own at 69.0% of them`` for one group of a service classes' held-out
    check (its ``min_tests``/``max_tests`` and ``all``), without a full stop."""
    whole = part["all"]
    return (
        f"{whole['tiles']} test tiles with {tests_range(part)} tests of each target, in "
        f"{whole['places']} places: the map's most probable class was the tile's own at "
        f"{100 * whole['most_probable_agrees']:.1f}% of them"
    )


def held_out_class_rows(group: Mapping[str, Any], classes: Sequence[str]) -> list[list[str]]:
    """Table rows of one group of a service classes' held-out check
    (``pipelines.service_check``): per class, the expected and the observed share of the
    held-out tiles (the latter with its interval, marked ``(outside)`` when the expected share
    lies outside it), the tiles whose most probable class it is and the share of those in it,
    lowest class first (``classes``: the check's class names, lowest first)."""
    rows = []
    for name in classes:
        c = group["classes"][name]
        low, high = c["observed_interval"]
        called = group["map_class"][name]
        same = called["observed_same"]
        rows.append(
            [
                name,
                f"{100 * c['expected_share']:.1f}%",
                f"{100 * c['observed_share']:.1f}% ({100 * low:.1f}–{100 * high:.1f}%)"
                + ("" if c["consistent"] else " (outside)"),
                str(called["tiles"]),
                "–" if same is None else f"{100 * same:.1f}%",
            ]
        )
    return rows


#: Colours of the lowest (unserved), middle and highest (served) classes; the classes between
#: are interpolated (ColorBrewer RdYlGn ends and middle).
CLASS_COLOUR_ANCHORS = ((215, 48, 39), (254, 224, 139), (26, 152, 80))


def class_colours(n_classes: int, *, alpha: int = 255) -> dict[int, tuple[int, int, int, int]]:
    """Class code -> RGBA, red (unserved) through yellow to green (served): the one palette of
    the class raster and the dashboard."""
    anchors = np.asarray(CLASS_COLOUR_ANCHORS, dtype=np.float64)
    where = np.linspace(0.0, len(anchors) - 1.0, n_classes)
    out: dict[int, tuple[int, int, int, int]] = {}
    for code, x in enumerate(where):
        lo = min(int(np.floor(x)), len(anchors) - 2)
        rgb = anchors[lo] + (x - lo) * (anchors[lo + 1] - anchors[lo])
        r, g, b = (round(float(v)) for v in rgb)
        out[code] = (r, g, b, alpha)
    return out
