"""Per-area sums of joint posterior draws, accumulated chunk by chunk, and the summaries.

Places (grid cells, observed tiles) arrive in chunks with joint draws ``q`` (n, S) of a
quantity (:func:`geodbk.joint.quantity_draws`), its marginal mean ``m`` and variance ``v``, a
weight ``w`` per place (cell area, a tile's tests) and the areas each place lies in (pairs
``(place, area)``; a place can lie in several overlapping areas). For every area ``A`` and
sample ``s`` :class:`AreaSums` keeps

.. math::

    W_A = \\sum_{c \\in A} w_c, \\quad L_{As} = \\sum_{c \\in A} w_c q_{cs}, \\quad
    E_{tAs} = \\sum_{c \\in A} w_c 1[q_{cs} \\text{ served at tier } t],

plus ``sum w m``, ``sum w² v`` and ``sum w P(served)``: memory O(areas x S x (1 + tiers)),
whatever the number of places. Then the area mean ``L_As / W_A`` is one posterior sample of
the weighted mean over the area, and ``E_tAs / W_A`` one sample of the share served
(:meth:`AreaSums.summary`).

The point of each summary is the exact posterior mean (the expected share
``sum w P(served) / W``, not the median share); its interval is the central interval of the
S sampled values and, where the point lies outside that, is extended to reach it. A share's
distribution is skewed and lumpy near 0 and 1: an area of one cell served with probability
0.986 has share 1 in about 98.6% of samples, so both quantiles are 1 while its mean is 0.986.
The extended interval ``[min(q_lo, mean), max(q_hi, mean)]`` still holds at least ``level``
of the samples, and each bound stays a one-sided ``(1 + level) / 2`` bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.stats import norm

from geodbk.exceedance import exceedance_probability

__all__ = ["AreaSummary", "AreaSums", "pairs_of_layers"]


@dataclass(frozen=True)
class AreaSummary:
    """Summaries per area (NaN where an area has no place).

    Attributes
    ----------
    count
        Places in the area.
    weight
        ``W_A``, the sum of the places' weights.
    mean
        Exact posterior mean of the weighted area mean, ``sum w m / W``.
    lower, upper
        The central interval of the sampled area means (sample quantiles), extended to
        ``mean`` if it lies outside.
    independent_lower, independent_upper
        The interval if the places were independent: ``mean -+ z sqrt(sum w² v) / W``.
    share_mean
        (tiers, areas): exact posterior mean (expected value) of the share served,
        ``sum w P(served) / W``, in [0, 1].
    share_lower, share_upper
        (tiers, areas): the central interval of the sampled shares (each in [0, 1]),
        extended to ``share_mean`` if it lies outside.
    """

    count: np.ndarray
    weight: np.ndarray
    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    independent_lower: np.ndarray
    independent_upper: np.ndarray
    share_mean: np.ndarray
    share_lower: np.ndarray
    share_upper: np.ndarray


class AreaSums:
    """Running per-area, per-sample sums of joint draws (see the module docstring).

    Parameters
    ----------
    n_areas
        Number of areas.
    samples
        Joint samples S per place.
    thresholds
        Tier thresholds on the quantity's scale (e.g. log10 kbps).
    higher_is_better
        A place is served at a tier when ``q >= threshold`` (speeds), else ``q <= threshold``
        (latency).
    """

    def __init__(
        self,
        n_areas: int,
        samples: int,
        *,
        thresholds: tuple[float, ...] = (),
        higher_is_better: bool = True,
    ) -> None:
        self.n_areas = int(n_areas)
        self.samples = int(samples)
        self.thresholds = tuple(float(t) for t in thresholds)
        self.higher_is_better = bool(higher_is_better)
        p, s, t = self.n_areas, self.samples, len(self.thresholds)
        self.count = np.zeros(p, dtype=np.int64)
        self.weight = np.zeros(p)
        self.weighted_mean = np.zeros(p)
        self.weighted_sq_var = np.zeros(p)
        self.level = np.zeros((p, s))
        self.served = np.zeros((t, p, s))
        self.served_mean = np.zeros((t, p))

    def add(
        self,
        places: np.ndarray,
        areas: np.ndarray,
        *,
        weight: np.ndarray,
        draws: np.ndarray,
        mean: np.ndarray,
        var: np.ndarray,
    ) -> None:
        """Add a chunk of n places: ``draws`` (n, S), ``mean``, ``var``, ``weight`` (n,), and
        the pairs ``(places[k], areas[k])`` of a place and an area it lies in."""
        n = int(draws.shape[0])
        if draws.shape != (n, self.samples):
            raise ValueError(f"draws must be (n, {self.samples}), got {draws.shape}")
        pl = np.asarray(places, dtype=np.int64)
        ar = np.asarray(areas, dtype=np.int64)
        if pl.size == 0:
            return
        w = np.asarray(weight, dtype=np.float64)[pl]
        M = sparse.csr_matrix((w, (ar, pl)), shape=(self.n_areas, n))
        M2 = sparse.csr_matrix((w * np.asarray(weight)[pl], (ar, pl)), shape=(self.n_areas, n))
        self.count += np.bincount(ar, minlength=self.n_areas)
        self.weight += np.asarray(M.sum(axis=1)).ravel()
        self.weighted_mean += M @ np.asarray(mean, dtype=np.float64)
        self.weighted_sq_var += M2 @ np.asarray(var, dtype=np.float64)
        self.level += M @ draws
        sd = np.sqrt(np.asarray(var, dtype=np.float64))
        for k, t in enumerate(self.thresholds):
            hit = draws >= t if self.higher_is_better else draws <= t
            self.served[k] += M @ hit.astype(np.float64)
            p = exceedance_probability(mean, sd, t, above=self.higher_is_better)
            self.served_mean[k] += M @ p

    def summary(self, *, level: float = 0.90) -> AreaSummary:
        """Posterior means (exact) and central ``level`` intervals (sample quantiles, extended
        to the mean where it lies outside) of each area's weighted mean and share served; NaN
        for areas without places. Shares are clipped to [0, 1] (their float sums can pass 1 by
        rounding)."""
        lo_q, hi_q = 0.5 - level / 2, 0.5 + level / 2
        z = float(norm.ppf(hi_q))
        has = self.weight > 0
        w = np.where(has, self.weight, 1.0)

        def per_area(values: np.ndarray) -> np.ndarray:
            return np.where(has, values / w, np.nan)

        def interval(
            sums: np.ndarray, point: np.ndarray, *, share: bool
        ) -> tuple[np.ndarray, np.ndarray]:
            lo = np.full(self.n_areas, np.nan)
            hi = np.full(self.n_areas, np.nan)
            if has.any():
                values = sums[has] / w[has, None]
                if share:
                    np.clip(values, 0.0, 1.0, out=values)
                q = np.quantile(values, [lo_q, hi_q], axis=1)
                lo[has] = np.minimum(q[0], point[has])
                hi[has] = np.maximum(q[1], point[has])
            return lo, hi

        mean = per_area(self.weighted_mean)
        lower, upper = interval(self.level, mean, share=False)
        half = z * np.sqrt(self.weighted_sq_var) / w
        tiers = len(self.thresholds)
        share_mean = np.full((tiers, self.n_areas), np.nan)
        share_lower = np.full((tiers, self.n_areas), np.nan)
        share_upper = np.full((tiers, self.n_areas), np.nan)
        for k in range(tiers):
            share_mean[k] = np.clip(per_area(self.served_mean[k]), 0.0, 1.0)
            share_lower[k], share_upper[k] = interval(self.served[k], share_mean[k], share=True)
        return AreaSummary(
            count=self.count.copy(),
            weight=self.weight.copy(),
            mean=mean,
            lower=lower,
            upper=upper,
            independent_lower=np.where(has, mean - half, np.nan),
            independent_upper=np.where(has, mean + half, np.nan),
            share_mean=share_mean,
            share_lower=share_lower,
            share_upper=share_upper,
        )

    def memory_bytes(self) -> int:
        """Bytes held by the per-sample sums."""
        return int(self.level.nbytes + self.served.nbytes)


def pairs_of_layers(
    layers: list[np.ndarray] | tuple[np.ndarray, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """``(places, areas)`` pairs from per-layer area indices (n,) (-1: in no area of that
    layer)."""
    places = [np.flatnonzero(ids >= 0) for ids in layers]
    areas = [ids[ids >= 0] for ids in layers]
    if not places:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(places), np.concatenate(areas).astype(np.int64)
