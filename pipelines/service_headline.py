"""Headline shares of a run's service classes with intervals from joint posterior samples.

The class map gives each place's class probabilities; their mean over the region is the
*expected* share of area in each class, the headline's point (exact, over every in-region cell;
over every observed tile for the share of tiles). How sure that share is needs the joint
posterior:
for sample ``s`` and target ``t`` the standardised deviation at place ``c`` is

.. math::

    e_{tcs} = (a_{tc} \\, \\delta_{tcs} + \\sqrt{v_{tc}} \\, z_{tcs}) / s_{tc},

with ``delta`` the correlated latent deviations of target ``t``'s DBK weights (one weight draw
per sample, shared by every place; :class:`geodbk.joint.JointSampler`), ``(a, v)`` of
:func:`geodbk.joint.quantity_parts` (``v``: the tile's own offset, the local layer and the
residual process), ``z`` independent standard normals and ``s_{tc}`` the quantity's sd. The
three models were trained apart, so the ``e_{.cs}`` of the three targets are independent
N(0, 1) at each place; the quantity is ``q_{.cs} = m_{.c} + s_{.c} (L e_{.cs})`` with ``L``
the Cholesky factor of the copula's correlation ``R``. At every place the three quantities are
then ``N(m, S R S)``, as in the class map (:meth:`pipelines.service_classes.Service.predict`),
so the sampled shares' mean is the map's expected share, whatever part of the variance is
the latent GP's; across places each target keeps its posterior's correlation, and the other
targets' through ``L``. A place's class in sample ``s`` is the number of nested tiers it
meets (download and upload at least, latency at most the tier's values), and the share of area
in class ``k`` is ``sum_c w_c 1[class_cs = k] / sum_c w_c`` with ``w_c = cos(lat_c)``; its
90% interval is the 5% and 95% sample quantiles, extended to the mean where the share piles
up at 0 or 1. The same over the run's distinct observed
tiles (weight 1 each) gives the share of tiles.

The shares are estimated on a uniform random subsample of the places (at most
:data:`HEADLINE_PLACES`); the subsample adds a sampling sd of at most
``0.5 / sqrt(places)`` (0.0022 at 50,000) to each share, small beside the intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geodbk.atomic import atomic_write_json
from geodbk.errors import DataError
from geodbk.geo.quadkey import quadkey_centroid
from geodbk.joint import JointSampler, quantity_parts, standard_normal_weights
from pipelines.rundir import RunDir, run_licence
from pipelines.service_classes import SERVICE_TARGETS, Service

__all__ = [
    "HEADLINE_PLACES",
    "HEADLINE_SAMPLES",
    "ShareDraws",
    "class_share_draws",
    "write_headline",
]

#: Joint posterior samples of the headline shares.
HEADLINE_SAMPLES = 500
#: Largest number of places (cells or tiles) the headline is estimated on.
HEADLINE_PLACES = 50_000
#: Central interval of the headline shares.
HEADLINE_LEVEL = 0.90


@dataclass(frozen=True)
class ShareDraws:
    """Sampled shares of each class, (classes, S), and the places they were estimated on."""

    classes: tuple[str, ...]
    draws: np.ndarray
    places: int

    def summary(
        self, *, level: float = HEADLINE_LEVEL, expected: np.ndarray | None = None
    ) -> dict[str, dict[str, float]]:
        """Per class: the expected share (``expected``, one per class, e.g. the class map's
        exact mean probability; default the sampled shares' mean) and the sampled shares'
        central ``level`` interval, extended to it where a share piled up at 0 or 1 leaves it
        outside (as the area summaries do)."""
        lo, hi = np.quantile(self.draws, [(1 - level) / 2, (1 + level) / 2], axis=1)
        mean = self.draws.mean(axis=1) if expected is None else np.asarray(expected, dtype=float)
        return {
            name: {
                "mean": float(mean[k]),
                "lower": float(min(lo[k], mean[k])),
                "upper": float(max(hi[k], mean[k])),
            }
            for k, name in enumerate(self.classes)
        }


def subsample(n: int, *, limit: int = HEADLINE_PLACES, seed: int = 0) -> np.ndarray:
    """Sorted indices of a uniform random subsample of ``min(n, limit)`` of ``n`` places."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))


def class_share_draws(
    service: Service,
    lon: np.ndarray,
    lat: np.ndarray,
    weight: np.ndarray,
    *,
    samples: int = HEADLINE_SAMPLES,
    seed: int = 0,
    chunk: int = 4096,
) -> ShareDraws:
    """Sampled share of the places' total ``weight`` in each service class (module docstring).

    Parameters
    ----------
    service
        The three models, tiers and copula (:func:`pipelines.service_classes.load_service`).
    lon, lat
        The places (degrees), inside the region.
    weight
        Non-negative weight per place (cell area, 1 per tile).
    samples
        Joint posterior samples S.
    seed
        Seed of the weight draws and of the independent normals.
    chunk
        Places evaluated at a time (memory O(chunk x S x 3)).

    Returns
    -------
    ShareDraws
        ``draws[k, s]``: the share of weight in class ``k`` in sample ``s``.
    """
    w = np.asarray(weight, dtype=np.float64)
    if w.size == 0 or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise DataError("the headline shares need places with positive finite weights")
    rng = np.random.default_rng(seed)
    samplers = {}
    for target in SERVICE_TARGETS:
        p = service.predictors[target]
        eps = standard_normal_weights(p.model.model_.rank, samples, rng=rng)
        samplers[target] = JointSampler(p.model, eps)
    thresholds = service.thresholds()  # (tiers, 3): min down, min up, max latency (log10)
    chol = np.linalg.cholesky(service.copula.correlation)
    counts = np.zeros((len(service.classes), samples))
    for start in range(0, len(lon), chunk):
        part = slice(start, start + chunk)
        n = len(lon[part])
        z = rng.standard_normal((3, n, samples))
        e = np.empty((3, n, samples))  # standardised deviations, independent across targets
        mean = np.empty((3, n))
        sd = np.empty((3, n))
        for i, target in enumerate(SERVICE_TARGETS):
            p = service.predictors[target]
            pred = p.predict(lon[part], lat[part], quantity=service.quantity)
            latent = samplers[target].draws(p.inputs(lon[part], lat[part]), chunk_size=chunk)
            a, ind = quantity_parts(pred, latent.residual_var)
            mean[i] = np.asarray(pred.mean, dtype=np.float64)
            sd[i] = np.sqrt(np.asarray(pred.var, dtype=np.float64))
            e[i] = (latent.deviations * a[:, None] + np.sqrt(ind)[:, None] * z[i]) / sd[i][:, None]
        q = np.einsum("ij,jns->ins", chol, e) * sd[:, :, None] + mean[:, :, None]
        if not np.isfinite(q).all():
            raise DataError(
                "a model gave non-finite samples, so no headline was written; the model file "
                "may be damaged: retrain it with `geodbk train`"
            )
        met = (
            (q[0][None] >= thresholds[:, 0, None, None])
            & (q[1][None] >= thresholds[:, 1, None, None])
            & (q[2][None] <= thresholds[:, 2, None, None])
        )  # (tiers, n, S)
        level = np.cumprod(met, axis=0).sum(axis=0)  # nested tiers: the highest met in a row
        wc = w[part]
        for k in range(len(service.classes)):
            counts[k] += wc @ (level == k)
    return ShareDraws(classes=service.classes, draws=counts / w.sum(), places=len(w))


def region_cells(
    grid_path: Path, classes: tuple[str, ...] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``(lon, lat, weight, probs)`` of the in-region cells of a class grid (weight
    ``cos(lat)``; ``probs``: each of ``classes``' ``p_<class>`` at the cells)."""
    import xarray as xr

    with xr.open_dataset(grid_path) as ds:
        inside = np.asarray(ds["in_region"].values, dtype=bool)
        rows, cols = np.nonzero(inside)
        lat = np.asarray(ds["y"].values, dtype=np.float64)[rows]
        lon = np.asarray(ds["x"].values, dtype=np.float64)[cols]
        probs = {c: np.asarray(ds[f"p_{c}"].values, dtype=np.float64)[inside] for c in classes}
    return lon, lat, np.cos(np.radians(lat)), probs


def expected_shares(probs: dict[str, np.ndarray], weight: np.ndarray | None) -> np.ndarray:
    """Exact expected share of each class, ``sum_c w_c p_kc / sum_c w_c``, from the class
    probabilities ``p_<class>`` of the places (weight 1 each without ``weight``)."""
    w = np.ones(len(next(iter(probs.values())))) if weight is None else np.asarray(weight)
    return np.array([float(np.sum(w * p) / np.sum(w)) for p in probs.values()])


def observed_tiles(rd: RunDir) -> tuple[np.ndarray, np.ndarray]:
    """``(lon, lat)`` of the centres of the run's distinct observed tiles (any quarter)."""
    import pyarrow.parquet as pq

    keys = pq.read_table(rd.tiles, columns=["quadkey"]).column("quadkey").to_numpy()
    unique = np.unique(np.asarray(keys, dtype=str))
    lon, lat = quadkey_centroid(unique)
    return np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64)


def write_headline(
    rd: RunDir,
    service: Service,
    grid_path: Path,
    out: Path,
    *,
    samples: int = HEADLINE_SAMPLES,
    seed: int = 0,
    grid_name: Path | None = None,
) -> dict[str, Any]:
    """Write ``out`` (JSON): the share of area (the grid's in-region cells) and of observed
    tiles in each class, each with its mean and 90% interval (:func:`class_share_draws`).
    ``grid_name``: the grid's path to record (default ``grid_path``; a staged grid records
    where it will be)."""
    result: dict[str, Any] = {
        "quantity": service.quantity,
        "quantity_description": service.quantity_description,
        "tiers": service.tier_labels,
        "latency_ms": service.latency_ms,
        "classes": list(service.classes),
        "samples": samples,
        "interval": HEADLINE_LEVEL,
        "quarter": service.quarter,
        **({"quarter_status": service.quarter_status} if service.quarter_status else {}),
        "grid": rd.relative(grid_name or grid_path),
        "method": (
            "joint posterior samples of the three models (independent weight draws), their "
            "standardised deviations at each place correlated by the copula as in the class "
            f"map; shares on a uniform random subsample of at most {HEADLINE_PLACES} places"
        ),
        "data_licence": run_licence(rd),
        "held_out_check": service.held_out_check,
    }
    tile_lon, tile_lat = observed_tiles(rd)
    at_tiles = service.predict(tile_lon, tile_lat)
    for name, (lon, lat, weight, probs) in {
        "area": region_cells(grid_path, service.classes),
        "tiles": (tile_lon, tile_lat, None, {c: at_tiles[f"p_{c}"] for c in service.classes}),
    }.items():
        keep = subsample(len(lon), seed=seed)
        w = np.ones(keep.size) if weight is None else weight[keep]
        draws = class_share_draws(service, lon[keep], lat[keep], w, samples=samples, seed=seed)
        # the point is the class map's exact expected share over every place
        exact = expected_shares(probs, weight)
        result[name] = {
            "places": len(lon),
            "used": int(keep.size),
            **draws.summary(expected=exact),
        }
    atomic_write_json(out, result)
    return result
