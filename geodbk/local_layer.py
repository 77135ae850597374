"""The local layer: the tile effect plus a short-range spatial field over tile offsets.

On top of a fitted GP (mean ``m``, latent variance ``v_f``) the residual of row ``i`` (tile
``j``, time ``t``) is

.. math::

    r_i = \\delta_j + s(x_j) + u_j(t_i) + \\varepsilon_i, \\qquad
    \\operatorname{Cov}[s(x), s(x')] = \\sigma^2 C(\\lVert x - x' \\rVert / \\ell),

with ``delta_j``, ``u_j`` and the noise of :mod:`geodbk.tile_effect` and ``s`` a Matérn-3/2 field
over tile centres, ``C(h) = (1 + √3 h) exp(-√3 h)``, range ``ell`` in km. ``lambda`` and
``kappa`` come from the tile effect; ``sigma²``, ``ell`` and ``tau²`` per group are refitted by
validation NLL, and ``rho`` with them where validation rows follow training rows of their
tiles (``s`` is constant in time, so ``u`` alone carries a tile's change between quarters).
A place gets ``c_* = delta_* + s(x_*) + u_*(t*)`` from a nearest-neighbour GP in three steps (:meth:`LocalLayer.predict`): each measured tile reduced to the GLS estimate of
``delta_j + s_j``, the field kriged from the ``k`` nearest other measured tiles, then the tile
effect conditioned on the place's own rows around that pull.

A tile without rows has one of two priors, chosen by the validation NLL of unmeasured tiles
(:meth:`LocalLayer.fit`): the tile effect's, ``lambda v_f + tau² + sigma²_nb``, or the GP's own,
``W - min(sigma², W) (1 - sigma²_nb / sigma²)``, ``W = v_f + sum_k max(1 - kappa_k, 0) c_k``
(:func:`gp_unseen_variance`).
``sigma² = 0`` gives the tile effect alone. Distances: km on a local equirectangular projection
(:func:`lonlat_to_km`); memory ``chunk * k²``. Decision: docs/decisions/local_layer.md; why the steps are
exact: docs/decisions/tile_effect.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.spatial import cKDTree

from geodbk.bases import stable_cholesky
from geodbk.errors import DataError
from geodbk.geo.longitude import wrap_near
from geodbk.tile_effect import (
    MIN_OBJECTIVE_ROWS,
    UNSEEN_EFFECT,
    UNSEEN_GP,
    UNSEEN_GP_MARGIN,
    TileEffect,
    TileEffectPrediction,
    _factor,
    _Layout,
    check_place_share,
    check_place_shares_by_group,
    check_unseen_prior,
    gp_unseen_variance,
    mean_gaussian_nll,
    minimize_lbfgs,
    offset_covariance,
    row_count_groups,
    row_place_shares,
    row_prediction,
    rows_of_groups,
    split_unseen_prior,
    tile_offset_variance,
    with_gp_prior,
)

__all__ = [
    "EARTH_RADIUS_KM",
    "UNSEEN_EFFECT",
    "UNSEEN_GP",
    "LocalLayer",
    "SpatialParameters",
    "gp_unseen_variance",
    "lonlat_to_km",
    "matern32",
]

_DT = torch.float64
_JITTER = 1e-9
EARTH_RADIUS_KM = 6371.0088
#: Upper bound of a refitted ``rho`` (a white offset that never changes is the field's job).
_RHO_MAX = 0.999
#: Default number of neighbouring tiles that krige the spatial field: on seven Hawaii runs
#: (random, tile and block splits) the test NLL at 8 is within 0.003 of that at 16 to 48, with
#: a fitted range that grows as k shrinks, at 0.6 times the layer's time of 16
#: (docs/decisions/local_layer.md, "How many neighbours").
NEIGHBOURS = 8
#: Bounds of the field's fitted Matérn range (km): a range at either bound is not a
#: short-range field of tile offsets (see :func:`range_at_bound`).
RANGE_BOUNDS_KM = (0.05, 200.0)
#: Fewest targets a k-d tree query shares among the machine's cores: scipy starts one thread
#: per core on each query, and a map's block asks for a few hundred distinct tiles, which one
#: thread answers faster (benchmarks/bench_neighbour_query.py).
PARALLEL_QUERY_TARGETS = 2048


def lonlat_to_km(lon: Any, lat: Any, *, lat0: float, lon0: float | None = None) -> np.ndarray:
    """``(n, 2)`` km coordinates on the equirectangular projection centred at latitude
    ``lat0``: ``x = R cos(lat0) lon``, ``y = R lat`` (radians); accurate to < 1% over a few
    hundred km. With ``lon0``, longitudes are first moved by whole turns into
    ``[lon0 - 180, lon0 + 180)``, so that places either side of the 180° meridian are
    neighbours."""
    lon_a = np.asarray(lon, dtype=np.float64)
    lon_r = np.radians(lon_a if lon0 is None else wrap_near(lon_a, centre=lon0))
    lat_r = np.radians(np.asarray(lat, dtype=np.float64))
    return np.column_stack(
        [EARTH_RADIUS_KM * math.cos(math.radians(lat0)) * lon_r, EARTH_RADIUS_KM * lat_r]
    )


def matern32(distance: torch.Tensor, range_km: torch.Tensor) -> torch.Tensor:
    """Matérn-3/2 correlation ``(1 + √3 d/ell) exp(-√3 d/ell)``."""
    h = math.sqrt(3.0) * distance / range_km
    return (1.0 + h) * torch.exp(-h)


def range_at_bound(range_km: float, *, rtol: float = 1e-6) -> float | None:
    """The bound of :data:`RANGE_BOUNDS_KM` a fitted range sits at (within ``rtol``), else
    ``None``: at the upper bound the field is one regional offset shared by every neighbour,
    at the lower bound white noise per tile."""
    for bound in RANGE_BOUNDS_KM:
        if abs(range_km - bound) <= rtol * bound:
            return bound
    return None


@dataclass(frozen=True)
class SpatialParameters:
    """The spatial part of the local layer (units of ``y``; range in km).

    Attributes
    ----------
    sigma2
        Variance of the spatial field ``s``.
    range_km
        Matérn-3/2 range ``ell``.
    tau2
        The tile effect's ``tau²`` per group, refitted with the field.
    neighbours
        Neighbouring tiles that krige the field at a place.
    lat0
        Latitude of the projection to km.
    lon0
        Middle of the turn of longitude the projection's ``x`` is taken in (the tiles'
        shortest arc's; ``None``, files written before it: [-180, 180] as given).
    val_nll, val_nll_without
        Validation NLL with the layer and with the tile effect alone, on the same rows.
    val_nll_gp
        The GP alone's validation NLL on the same rows (its own noise model; ``None``: not
        recorded, as in files written before it).
    place_share
        ``c`` in (0, :data:`~geodbk.tile_effect.MAX_PLACE_SHARE`]: how much of an unmeasured
        tile's prior offset variance ``P`` (the white ``tau²`` and the field's kriging
        variance) is the place's, what a well-measured tile's level shows; below 1 the rest is
        its testers' and goes to one test's noise, above 1 ``(c - 1) P`` of one test's noise
        is the place's (:func:`~geodbk.tile_effect.split_unseen_prior`). 1 (files written
        before it): the prior as stated.
    place_share_basis
        What chose ``place_share``: ``{"tiles": n, "units": K}``, the well-measured validation
        tiles without training rows and the held-out units (blocks or tiles) they lie in;
        ``None`` when it was not chosen on validation tiles.
    place_share_by_group
        The share of each urban / rural group whose own validation tiles chose one; the other
        groups take ``place_share`` (``None``: ``place_share`` for all).
    rho
        The quarter-to-quarter correlation of the white offset per group, refitted with the
        field (``None``: the tile effect's).
    unseen_prior
        How a tile without rows is stated: :data:`UNSEEN_EFFECT` (the tile effect's ``tau²``,
        as in files written before it) or :data:`UNSEEN_GP` (the GP's own variance of its
        rows, :func:`gp_unseen_variance`), chosen by the validation NLL (:meth:`LocalLayer.fit`).
    val_nll_unseen
        The validation NLL of each unseen prior tried (``None``: only the tile effect's, when
        fewer than :data:`~geodbk.tile_effect.MIN_OBJECTIVE_ROWS` validation rows have an
        unmeasured tile).
    """

    sigma2: float
    range_km: float
    tau2: dict[str, float]
    neighbours: int = NEIGHBOURS
    lat0: float = 0.0
    lon0: float | None = None
    val_nll: float | None = None
    val_nll_without: float | None = None
    place_share: float = 1.0
    rho: dict[str, float] | None = None
    place_share_basis: dict[str, int] | None = None
    val_nll_gp: float | None = None
    unseen_prior: str = UNSEEN_EFFECT
    val_nll_unseen: dict[str, float] | None = None
    place_share_by_group: dict[str, float] | None = None

    def __post_init__(self) -> None:
        check_unseen_prior(self.unseen_prior)
        check_place_share(self.place_share)
        object.__setattr__(
            self, "place_share_by_group", check_place_shares_by_group(self.place_share_by_group)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = asdict(self)
        out["tau2"] = dict(self.tau2)
        if self.place_share_basis is None:
            out.pop("place_share_basis")
        if self.val_nll_unseen is None:
            out.pop("val_nll_unseen")
        if self.place_share_by_group is None:
            out.pop("place_share_by_group")
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpatialParameters:
        """Inverse of :meth:`to_dict`."""
        rho = raw.get("rho")
        return cls(
            **{
                **raw,
                "tau2": {str(k): float(v) for k, v in raw["tau2"].items()},
                "rho": None if rho is None else {str(k): float(v) for k, v in rho.items()},
            }
        )


@dataclass(frozen=True)
class _Theta:
    """The layer's parameters as tensors: the tile effect's (``tau2`` per group) and the
    field's."""

    tau2: torch.Tensor
    rho: torch.Tensor
    lam: torch.Tensor
    kappa: torch.Tensor
    mu: torch.Tensor
    sigma2: torch.Tensor
    range_km: torch.Tensor


@dataclass(frozen=True)
class _Summaries:
    """Per measured tile: GLS level ``b``, its variance ``w`` and the mean ``v_f``."""

    b: torch.Tensor
    w: torch.Tensor
    v: torch.Tensor


def _summaries(
    lay: _Layout,
    tau2: torch.Tensor,
    rho: torch.Tensor,
    kappa: torch.Tensor,
    mu: torch.Tensor | None = None,
) -> _Summaries:
    """``b_j = 1'A^{-1}r / 1'A^{-1}1``, ``w_j = 1 / 1'A^{-1}1`` with ``A = tau_j² rho^|dt| + E``
    (padding inert; ``tau_j²`` :func:`geodbk.tile_effect.tile_offset_variance`), and the tile's
    mean ``v_f``; the tiles factored in groups of similar row counts
    (:func:`geodbk.tile_effect.row_count_groups`)."""
    groups = row_count_groups(lay)
    if not groups:
        empty = torch.zeros(0, dtype=_DT)
        return _Summaries(b=empty, w=empty, v=empty)
    parts = []
    for index, width in groups:  # no index given: the entries are layout positions
        sub = lay.subset(index, width=width)
        L, z = _factor(sub, tau2, rho, torch.zeros((), dtype=_DT), kappa, mu=mu)
        ones = sub.mask.to(_DT)
        a = torch.linalg.solve_triangular(L, ones[..., None], upper=False)[..., 0]
        info = (a * a).sum(-1)
        count = ones.sum(-1).clamp_min(1.0)
        parts.append(((a * z).sum(-1) / info, 1.0 / info, (sub.var_f * ones).sum(-1) / count))
    back = torch.as_tensor(np.argsort(np.concatenate([index for index, _ in groups])))
    b, w, v = (torch.cat(column)[back] for column in zip(*parts, strict=True))
    return _Summaries(b=b, w=w, v=v)


def _kriging_matrix(
    d_nb: torch.Tensor,
    valid: torch.Tensor,
    diag: torch.Tensor,
    *,
    sigma2: torch.Tensor,
    range_km: torch.Tensor,
) -> torch.Tensor:
    """``sigma² C(d)`` between the valid slots (``valid`` (u, k)), 0 elsewhere, plus ``diag`` on
    the diagonal. Without autograd (prediction) it is built in place in one (u, k, k) buffer,
    ``sigma² e^{-h} (1 + h)``, and masked only when a set has an empty slot: this is the
    largest array of a map's tile quantity."""
    if torch.is_grad_enabled():
        pair = valid[:, :, None] & valid[:, None, :]
        K = torch.where(pair, sigma2 * matern32(d_nb, range_km), torch.zeros((), dtype=_DT))
        return K + torch.diag_embed(diag)
    neg_h = d_nb * (-math.sqrt(3.0) / range_km)
    decay = neg_h.exp().mul_(sigma2)
    K = torch.addcmul(decay, neg_h, decay, value=-1.0, out=neg_h)  # sigma² e^{-h} (1 + h)
    if not bool(valid.all()):
        K.masked_fill_(~(valid[:, :, None] & valid[:, None, :]), 0.0)
    K.diagonal(dim1=-2, dim2=-1).add_(diag)
    return K


@dataclass(frozen=True)
class _Hood:
    """The neighbour sets of m targets, each factored once however many targets share it.

    Attributes
    ----------
    nb
        (m, k) neighbour slots of each target, sorted within the row (-1: none).
    d_star
        (m, k) each target's distance to its neighbours, in ``nb``'s order.
    sets
        (u, k) the distinct rows of ``nb``.
    d_sets
        (u, k, k) the distances between the neighbours of each set.
    inverse
        (m,) the set of each target.
    rows
        (n,) the target of each predicted row, when rows share targets (a map's cells share
        their tile's centre); ``None``: one target per row.
    """

    nb: torch.Tensor
    d_star: torch.Tensor
    sets: torch.Tensor
    d_sets: torch.Tensor
    inverse: torch.Tensor
    rows: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return int(self.nb.shape[1])


def _krige(
    summ: _Summaries,
    hood: _Hood,
    *,
    sigma2: torch.Tensor,
    range_km: torch.Tensor,
    lam: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kriging of the field at targets from their neighbours: ``(mu, sigma²_nb)`` (m,), with
    ``mu = k*' K^{-1} b = (L^{-1} k*)'(L^{-1} b)`` and ``sigma²_nb = sigma² - ||L^{-1} k*||²``
    (``K = LL'``: the neighbours' field covariance plus their summaries' noise). ``L`` and
    ``L^{-1} b`` are computed once per distinct neighbour set (``hood.sets``), ``L^{-1} k*``
    once per target, and ``hood.rows`` maps the rows to their targets."""
    valid_set = hood.sets >= 0
    idx = hood.sets.clamp_min(0)
    noise = lam * summ.v[idx] + summ.w[idx]
    diag = torch.where(valid_set, noise, torch.ones((), dtype=_DT))
    L = stable_cholesky(
        _kriging_matrix(hood.d_sets, valid_set, diag, sigma2=sigma2, range_km=range_km),
        jitter=_JITTER,
    )
    b = torch.where(valid_set, summ.b[idx], torch.zeros((), dtype=_DT))
    z = torch.linalg.solve_triangular(L, b[..., None], upper=False)[..., 0]  # L^{-1} b per set
    valid = hood.nb >= 0
    ks = torch.where(valid, sigma2 * matern32(hood.d_star, range_km), torch.zeros((), dtype=_DT))
    sol = torch.linalg.solve_triangular(L[hood.inverse], ks[..., None], upper=False)[..., 0]
    mu = (sol * z[hood.inverse]).sum(-1)
    var = (sigma2 - (sol**2).sum(-1)).clamp_min(0.0)
    if hood.rows is not None:
        return mu[hood.rows], var[hood.rows]
    return mu, var


def unique_rows(rows: np.ndarray, *, ordered: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` for an (m, k) integer array, by one
    64-bit key per row (a fixed random linear hash, wrapping) and a 1-D unique; rows sharing
    a key are checked equal, and a collision falls back to the row-wise unique. With
    ``ordered=False`` the distinct rows come in an order of their own (of their keys: the same
    for the same rows), without sorting them lexicographically."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        out = np.unique(rows, axis=0, return_inverse=True)
        return out[0], out[1].reshape(-1)
    weights = np.random.default_rng(0x5EED).integers(
        1, np.iinfo(np.int64).max, size=rows.shape[1], dtype=np.int64
    )
    with np.errstate(over="ignore"):
        keys = (rows * weights).sum(axis=1)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if not np.array_equal(rows[first[inverse]], rows):
        out = np.unique(rows, axis=0, return_inverse=True)
        return out[0], out[1].reshape(-1)
    if not ordered:
        return rows[first], inverse.reshape(-1)
    # ordered like np.unique(axis=0): lexicographically by row
    order = np.lexsort(rows[first].T[::-1])
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rows[first[order]], rank[inverse.reshape(-1)]


class _Neighbours:
    """k nearest measured tiles of each target, its own tile excluded (a k-d tree in km)."""

    def __init__(self, xy: np.ndarray, k: int) -> None:
        self.xy = np.asarray(xy, dtype=np.float64)
        self.k = int(min(max(k, 0), len(self.xy)))
        self.tree = cKDTree(self.xy) if len(self.xy) else None

    def query(self, xy: np.ndarray, own: np.ndarray, *, exclude: np.ndarray | None = None) -> _Hood:
        """The k nearest measured tiles of each target as a :class:`_Hood`; ``own``: each
        target's own tile slot (-1: none), left out of its neighbours (its slot then holds
        -1); ``exclude``: slots left out of every target's neighbours (the k nearest of the
        others are kept; -1 fills a row that has fewer). Each row is sorted by slot, so that
        targets with the same neighbours share one set."""
        m = xy.shape[0]
        if self.tree is not None and self.k > 0 and exclude is not None and exclude.size:
            return self._query_excluding(xy, own, np.unique(exclude))
        if self.tree is None or self.k == 0:
            empty = torch.zeros((m, 0), dtype=torch.int64)
            return _Hood(
                nb=empty,
                d_star=torch.zeros((m, 0), dtype=_DT),
                sets=torch.zeros((min(m, 1), 0), dtype=torch.int64),
                d_sets=torch.zeros((min(m, 1), 0, 0), dtype=_DT),
                inverse=torch.zeros(m, dtype=torch.int64),
            )
        kq = min(self.k + 1, len(self.xy))
        workers = -1 if m >= PARALLEL_QUERY_TARGETS else 1
        d, nb = self.tree.query(xy, k=kq, workers=workers)
        d, nb = d.reshape(m, kq), nb.reshape(m, kq)
        is_own = nb == np.asarray(own)[:, None]
        if kq > self.k:  # drop each row's own tile, or else its farthest of the k + 1
            drop = np.where(is_own.any(axis=1), is_own.argmax(axis=1), kq - 1)
            nb[np.arange(m), drop] = len(self.xy)  # sorts after every slot, then cut
        else:  # every measured tile is a neighbour: the own tile's slot holds -1
            nb[is_own] = -1
        # sort each row by slot with its column packed in the low bits: one integer sort
        # (slots are distinct within a row) instead of an argsort and two gathers
        bits = max(1, (kq - 1).bit_length())
        packed = np.sort((nb + 1) << bits | np.arange(kq), axis=1)[:, : self.k]
        d = np.take_along_axis(d, packed & ((1 << bits) - 1), axis=1)
        nb = (packed >> bits) - 1
        return self._hood(nb, d)

    def _query_excluding(self, xy: np.ndarray, own: np.ndarray, exclude: np.ndarray) -> _Hood:
        """:meth:`query` with the slots ``exclude`` (distinct) left out of every target's
        neighbours, its own tile too: the ``k + 1 + len(exclude)`` nearest are searched, the
        left-out ones dropped and the k nearest of the rest kept."""
        m = xy.shape[0]
        kq = min(self.k + 1 + exclude.size, len(self.xy))
        assert self.tree is not None
        d, nb = self.tree.query(xy, k=kq)
        d, nb = d.reshape(m, kq), nb.reshape(m, kq)
        dropped = np.isin(nb, exclude) | (nb == np.asarray(own)[:, None])
        keep = ~dropped & (np.cumsum(~dropped, axis=1) <= self.k)
        nb = np.where(keep, nb, -1)
        # -1 sorts first; each row keeps at most k slots, so its last k columns hold them
        order = np.argsort(nb, axis=1, kind="stable")[:, kq - self.k :]
        return self._hood(
            np.take_along_axis(nb, order, axis=1), np.take_along_axis(d, order, axis=1)
        )

    def _hood(self, nb: np.ndarray, d: np.ndarray) -> _Hood:
        """The :class:`_Hood` of neighbour slots ``nb`` (m, k; sorted within each row) at
        distances ``d``: their distinct sets and the distances within each."""
        sets, inverse = unique_rows(nb, ordered=False)
        p = torch.as_tensor(self.xy[sets])
        return _Hood(
            nb=torch.as_tensor(nb),
            d_star=torch.as_tensor(d),
            sets=torch.as_tensor(sets),
            # by direct differences: no cancellation, whatever k (cdist switches to its
            # matrix-product form above 25 points)
            d_sets=torch.cdist(p, p, compute_mode="donot_use_mm_for_euclid_dist"),
            inverse=torch.as_tensor(inverse.reshape(-1)),
        )


class LocalLayer:
    """A fitted local layer: a tile effect plus a nearest-neighbour spatial field.

    Build it with :meth:`fit` from a tile effect conditioned on the training rows; condition
    on more rows with :meth:`with_effect`. Its :meth:`predict` takes the same rows as
    :meth:`TileEffect.predict` (plus their km positions, or a ``positions`` function of the
    tile ids given here), so it can stand in for the tile effect wherever rows are predicted.
    """

    def __init__(
        self,
        effect: TileEffect,
        params: SpatialParameters,
        *,
        tile_xy: np.ndarray,
        positions: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.effect = effect
        self.params = params
        self.positions = positions
        lay = effect._layout()
        xy = np.asarray(tile_xy, dtype=np.float64).reshape(-1, 2)
        if xy.shape[0] != lay.tiles.size:
            raise ValueError(
                f"tile_xy has {xy.shape[0]} rows for {lay.tiles.size} measured tiles (one per "
                "distinct tile of the effect, in sorted tile order)"
            )
        if not np.isfinite(xy).all():
            raise DataError("local layer: non-finite tile positions")
        self.tile_xy = xy
        self._neighbours = _Neighbours(xy, params.neighbours)
        self._summary_cache: _Summaries | None = None

    @property
    def grouped(self) -> bool:
        """Whether the underlying tile effect has a ``tau²`` per group."""
        return self.effect.grouped

    @property
    def unseen_latent_scale(self) -> float:
        """``lambda`` of an unmeasured tile's prior as
        :func:`~geodbk.tile_effect.split_unseen_prior` splits it: 1 under :data:`UNSEEN_GP`
        (the GP's prior holds its whole latent variance), else the tile effect's."""
        if self.params.unseen_prior == UNSEEN_GP:
            return 1.0
        return float(self.effect.params.latent_scale)

    def _tensors(self) -> _Theta:
        p, e = self.params, self.effect.params
        return _Theta(
            tau2=torch.tensor([p.tau2[g] for g in e.groups], dtype=_DT),
            rho=torch.tensor(e.rho if p.rho is None else [p.rho[g] for g in e.groups], dtype=_DT),
            lam=torch.tensor(e.latent_scale, dtype=_DT),
            kappa=torch.tensor(e.noise_scale, dtype=_DT),
            mu=self.effect.persistent,
            sigma2=torch.tensor(p.sigma2, dtype=_DT),
            range_km=torch.tensor(p.range_km, dtype=_DT),
        )

    @classmethod
    def fit(
        cls,
        effect: TileEffect,
        *,
        tile_xy: np.ndarray,
        val_tiles: Any,
        val_xy: Any,
        val_times: Any,
        val_residual: Any,
        val_var_f: Any,
        val_components: Any,
        val_groups: Any = None,
        lat0: float = 0.0,
        lon0: float | None = None,
        neighbours: int = NEIGHBOURS,
        keep_total: bool = True,
        fit_rho: bool = True,
        max_iter: int = 60,
    ) -> LocalLayer:
        """Choose ``sigma²``, ``ell`` and ``tau²`` per group by the validation NLL of rows
        predicted from their own tile's rows and their neighbours' (both from ``effect``,
        conditioned on the training rows). ``lambda`` and ``kappa`` stay the effect's.
        Validation rows are given like :meth:`TileEffect.fit`'s, plus ``val_xy`` (n, 2) km
        positions of their tiles. ``keep_total``: keep each group's total offset variance at
        the effect's ``tau²`` and fit only the share ``sigma²`` of it that neighbours share
        (``tau²_g - sigma²`` stays white), and the range. ``fit_rho``: refit the white part's
        quarter-to-quarter correlation ``rho``, one per group, with them, when at least
        :data:`~geodbk.tile_effect.MIN_OBJECTIVE_ROWS` validation rows have a measured tile
        (the field is constant in time, so the white part alone carries a tile's change from
        quarter to quarter, and the effect's ``rho`` would shrink it by ``1 - sigma²/tau²``);
        otherwise ``rho`` stays the effect's. Where at least ``MIN_OBJECTIVE_ROWS``
        validation rows have an unmeasured tile (tile and block splits), the layer is fitted
        twice, with an unmeasured tile's prior as the tile effect states it and as the GP does
        (:data:`UNSEEN_EFFECT`, :data:`UNSEEN_GP`), and the GP's is chosen when its validation
        NLL is lower by more than :data:`UNSEEN_GP_MARGIN`.
        """
        names = effect.params.components
        tiles, times, res, vf, comp, code_a, own = effect._rows(
            val_tiles,
            val_times,
            val_residual,
            val_var_f,
            val_components,
            groups=val_groups,
            what="validation rows",
        )
        if tiles.size == 0:
            raise DataError("the local layer is chosen by validation NLL: give validation rows")
        if comp.shape[1] != len(names):
            raise ValueError(f"noise components must have {len(names)} columns: {names}")
        code = torch.as_tensor(code_a)
        lay = effect._layout()
        start = cls(
            effect,
            SpatialParameters(
                sigma2=0.0,
                range_km=1.0,
                tau2=dict(effect.params.tau2),
                neighbours=neighbours,
                lat0=lat0,
                lon0=lon0,
            ),
            tile_xy=tile_xy,
        )
        hood = start._neighbours.query(np.asarray(val_xy, dtype=np.float64), own)
        net = res - effect.tests_shift(comp)  # the validation rows net of their tests' shift
        vt, vr, vv, vc = (torch.as_tensor(a, dtype=_DT) for a in (times, net, vf, comp))
        unseen = torch.as_tensor(own < 0)
        fixed = start._tensors()
        n_g = len(effect.params.groups)
        tau0 = np.array([max(v, 1e-8) for v in effect.params.tau2.values()])
        scale = float(np.mean(tau0))
        start_raw = (
            [0.0, math.log(2.0)]
            if keep_total
            else [*np.log(0.7 * tau0), math.log(0.3 * scale), math.log(2.0)]
        )
        # rho is read from tiles whose validation rows follow training rows; without enough
        # of them (tile and block splits) the objective cannot tell it, and it stays the effect's
        fit_rho = fit_rho and int((own >= 0).sum()) >= MIN_OBJECTIVE_ROWS
        rho0 = min(max(float(effect.params.rho), 1e-3), _RHO_MAX - 1e-3) / _RHO_MAX
        if fit_rho:
            start_raw += [math.log(rho0 / (1.0 - rho0))] * n_g
        raw = torch.tensor(start_raw, dtype=_DT, requires_grad=True)
        bounds = (math.log(1e-8 * scale), math.log(100.0 * scale))
        total = torch.as_tensor(tau0, dtype=_DT)

        def unpack(
            p: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            rho = _RHO_MAX * torch.sigmoid(p[-n_g:].clamp(-9.0, 9.0)) if fit_rho else fixed.rho
            q = p[:-n_g] if fit_rho else p
            rng = torch.exp(q[-1].clamp(*(math.log(b) for b in RANGE_BOUNDS_KM)))
            if keep_total:  # sigma² a share of the smallest tau²; each tau² gives it up
                sigma2 = torch.sigmoid(q[0]).clamp(1e-6, 1.0 - 1e-6) * total.min()
                return total - sigma2, sigma2, rng, rho
            tau2 = torch.exp(q[:n_g].clamp(*bounds))
            sigma2 = torch.exp(q[n_g].clamp(*bounds))
            return tau2, sigma2, rng, rho

        def nll(
            p: torch.Tensor,
            *,
            spatial: bool = True,
            own_rho: bool = True,
            prior: str = UNSEEN_EFFECT,
        ) -> torch.Tensor:
            tau2, sigma2, rng, rho = unpack(p)
            if not own_rho:
                rho = fixed.rho
            if not spatial:
                tau2, sigma2, rho = fixed.tau2, torch.zeros((), dtype=_DT), fixed.rho
            shift, var, _, s2nb = _predict_rows(
                lay,
                hood,
                own,
                vt,
                vv,
                code,
                replace(fixed, tau2=tau2, sigma2=sigma2, range_km=rng, rho=rho),
                with_pull=True,
            )
            noise = (vc * fixed.kappa).sum(-1)
            if prior == UNSEEN_GP:
                gp_var = gp_unseen_variance(vv, vc, fixed.kappa, s2nb, sigma2)
                var = torch.where(unseen, gp_var, var)
            else:
                noise = noise + unseen * (vc * fixed.mu).sum(-1)
            return mean_gaussian_nll(vr, shift, var + noise)

        # an unmeasured tile's prior: the tile effect's, and the GP's where enough validation
        # rows have an unmeasured tile to tell them apart; each with its own field
        priors = [UNSEEN_EFFECT]
        if int(unseen.sum()) >= MIN_OBJECTIVE_ROWS:
            priors.append(UNSEEN_GP)
        fits: dict[str, tuple[torch.Tensor, float]] = {}
        for prior in priors:
            p0 = raw.detach().clone().requires_grad_(True)
            minimize_lbfgs(functools.partial(nll, prior=prior), p0, max_iter=max_iter)
            with torch.no_grad():
                fits[prior] = (p0, float(nll(p0, prior=prior)))
        prior = UNSEEN_EFFECT
        if UNSEEN_GP in fits and fits[UNSEEN_GP][1] < fits[UNSEEN_EFFECT][1] - UNSEEN_GP_MARGIN:
            prior = UNSEEN_GP
        raw = fits[prior][0]
        with torch.no_grad():
            tau2, sigma2, rng, rho = unpack(raw)
            best, without = fits[prior][1], float(nll(raw, spatial=False))
            if fit_rho and (effect_rho := float(nll(raw, own_rho=False, prior=prior))) <= best:
                fit_rho, best = False, effect_rho  # the effect's rho (say 1) was no worse
        params = SpatialParameters(
            sigma2=float(sigma2),
            range_km=float(rng),
            tau2={g: float(v) for g, v in zip(effect.params.groups, tau2, strict=True)},
            neighbours=neighbours,
            lat0=lat0,
            lon0=lon0,
            val_nll=best,
            val_nll_without=without,
            rho=(
                {g: float(v) for g, v in zip(effect.params.groups, rho, strict=True)}
                if fit_rho
                else None
            ),
            unseen_prior=prior,
            val_nll_unseen={name: fits[name][1] for name in priors} if len(priors) > 1 else None,
        )
        return cls(effect, params, tile_xy=tile_xy)

    def with_effect(
        self,
        effect: TileEffect,
        *,
        tile_xy: np.ndarray,
        positions: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> LocalLayer:
        """The same parameters over another tile effect (e.g. one that also conditions on the
        validation rows); ``tile_xy`` for its measured tiles."""
        return LocalLayer(
            effect, self.params, tile_xy=tile_xy, positions=positions or self.positions
        )

    def predict(
        self,
        *,
        tiles: Any,
        times: Any,
        var_f: Any,
        components: Any,
        groups: Any = None,
        xy: Any = None,
        chunk_size: int = 16384,
        place_share: float | None = None,
        tile_components: Any = None,
        leave_out: Any = None,
    ) -> TileEffectPrediction:
        """The tile's posterior at rows (tile, time, km position ``xy``; default: each row at
        its tile's centre, ``positions`` of the tile id, with the neighbours found once per
        distinct tile), with the field included: ``shift``, ``tile_var``,
        ``noise_var``, ``seen`` as :meth:`TileEffect.predict`, and ``pull``, the neighbours'
        kriged part of ``shift``.

        1. Each measured tile ``j`` is reduced to the GLS estimate of its constant part
           ``delta_j + s_j``: ``b_j = 1'A_j^{-1} r_j / 1'A_j^{-1} 1``, variance
           ``w_j = 1 / 1'A_j^{-1} 1``, ``A_j = tau² rho^|dt| + E_j``.
        2. The ``k`` nearest measured tiles other than the place's own (k-d tree) krige the
           field: ``mu = k_*'(K + D)^{-1} b`` and ``sigma²_nb = sigma² - k_*'(K + D)^{-1} k_*``
           with ``K = sigma² C``, ``D = diag(lambda v_j + w_j)``, ``k_* = sigma² C(d_*)``.
        3. The place's own rows condition the tile effect with prior mean ``mu`` and prior
           variance ``lambda v_f + sigma²_nb``: ``shift = mu + k'(K_own + E)^{-1}(r - mu)``,
           ``var = tau² + lambda v_* + sigma²_nb - k'(K_own + E)^{-1} k``; a tile without rows
           gets ``mu`` and ``lambda v_* + c (tau² + sigma²_nb)`` (at least ``v_*`` as far as
           the whole prior holds it), and the rest is added to its ``noise_var`` (``c``:
           ``place_share``, by default the fitted ones, each row its group's;
           :func:`geodbk.tile_effect.split_unseen_prior`), so a test's variance ``tile_var +
           noise_var`` does not depend on ``c``.

        With :data:`UNSEEN_GP` (``params.unseen_prior``) a tile without rows gets
        :func:`gp_unseen_variance` at ``tile_components`` (noise components (n, k) or one row
        of them, e.g. a typical training row's for a map; default: the rows' own) and its
        rows' test noise ``kappa'c``, with the place share applied to what exceeds ``v_*``.

        Targets are solved in chunks of ``chunk_size`` (memory ``chunk * k²``): rows with
        ``xy``; without it, the rows of up to ``chunk_size`` distinct tiles, so that a map's
        many cells per tile go in few chunks (:func:`tile_chunks`).

        ``leave_out`` (one label per row) predicts each row as if the rows of the tiles of
        its label's rows had not conditioned the layer: its own tile unmeasured and none of
        those tiles among its neighbours (a leave-one-unit-out prediction: the rows of a
        held-out block, or of one tile, scored from all the other conditioning rows).
        """
        tiles_a, times_a, _, vf, comp, code, own = self.effect._rows(
            tiles, times, None, var_f, components, groups=groups, what="prediction rows"
        )
        if xy is None and self.positions is None:
            raise ValueError("give xy= (km positions), or build the layer with positions=")
        xy_a = None if xy is None else np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        if xy_a is not None and (xy_a.shape[0] != len(tiles_a) or not np.isfinite(xy_a).all()):
            raise DataError("prediction rows: one finite km position per row is needed")
        lay = self.effect._layout()
        t = self._tensors()
        n = len(tiles_a)
        shift = np.zeros(n)
        tile_var = np.zeros(n)
        pull = np.zeros(n)
        s2nb = np.zeros(n)
        with torch.no_grad():
            if self._summary_cache is None:
                self._summary_cache = _summaries(lay, t.tau2, t.rho, t.kappa, t.mu)
            summ = self._summary_cache
            chunks: list[slice | np.ndarray] = (
                [slice(s, s + chunk_size) for s in range(0, n, chunk_size)]
                if xy_a is not None
                else tile_chunks(tiles_a, chunk_size)
            )
            own_nb = own  # the tile each row's neighbours leave out
            parts: list[tuple[slice | np.ndarray, np.ndarray | None]]
            if leave_out is not None:
                parts = self._left_out_parts(leave_out, own, chunks)
                own = np.full(n, -1, np.int64)  # no row conditions on its own tile
            else:
                parts = [(part, None) for part in chunks]
            for part, exclude in parts:
                if exclude is not None:
                    if xy_a is not None:
                        at = xy_a[part]
                    else:
                        assert self.positions is not None
                        at = self.positions(tiles_a[part])
                    hood = self._neighbours.query(at, own_nb[part], exclude=exclude)
                elif xy_a is not None:
                    hood = self._neighbours.query(xy_a[part], own_nb[part])
                else:
                    hood = self._tile_hood(tiles_a[part], own_nb[part])
                m, v, pulled, nb = _predict_rows(
                    lay,
                    hood,
                    own[part],
                    torch.as_tensor(times_a[part], dtype=_DT),
                    torch.as_tensor(vf[part], dtype=_DT),
                    torch.as_tensor(code[part]),
                    t,
                    summaries=summ,
                    with_pull=True,
                )
                shift[part], tile_var[part], pull[part] = m.numpy(), v.numpy(), pulled.numpy()
                s2nb[part] = nb.numpy()
        seen = own >= 0
        gp_prior = self.params.unseen_prior == UNSEEN_GP
        if gp_prior:
            tile_var = with_gp_prior(
                tile_var,
                seen,
                var_f=vf,
                components=comp,
                tile_components=tile_components,
                kappa=t.kappa,
                s2nb=s2nb,
                sigma2=t.sigma2,
            )
        pred = row_prediction(
            shift,
            tile_var,
            comp,
            t.kappa,
            torch.zeros_like(t.mu) if gp_prior else t.mu,
            seen=seen,
            pull=pull,
            tests_shift=self.effect.tests_shift(comp),
        )
        share = (
            row_place_shares(
                self.params.place_share,
                self.params.place_share_by_group,
                groups=self.effect.params.groups,
                code=code,
            )
            if place_share is None
            else place_share
        )
        return split_unseen_prior(
            pred, var_f=vf, latent_scale=self.unseen_latent_scale, place_share=share
        )

    @staticmethod
    def _left_out_parts(
        leave_out: Any, own: np.ndarray, chunks: Sequence[slice | np.ndarray]
    ) -> list[tuple[slice | np.ndarray, np.ndarray | None]]:
        """The parts to predict with ``leave_out`` and the measured tiles' slots each leaves
        out of its rows' neighbours: the rows of each label with the slots (``own``) they
        hold; or, where each label's rows share one tile (a label per tile), ``chunks`` as
        they are, each row leaving out its own tile."""
        labels = np.asarray(leave_out)
        if labels.shape != own.shape:
            raise ValueError(f"leave_out: one label per row is needed ({own.size} rows)")
        _, unit = np.unique(labels, return_inverse=True)
        unit = unit.reshape(-1)
        pairs = np.unique(np.stack([unit, own], axis=1), axis=0)
        if pairs.shape[0] == np.unique(unit).size:  # one tile (or none) per label
            return [(part, None) for part in chunks]
        order = np.argsort(unit, kind="stable")
        cuts = np.flatnonzero(np.diff(unit[order])) + 1
        out: list[tuple[slice | np.ndarray, np.ndarray | None]] = []
        for rows in np.split(order, cuts):
            slots = own[rows]
            out.append((rows, np.unique(slots[slots >= 0])))
        return out

    def _tile_hood(self, tiles: Any, own: np.ndarray) -> _Hood:
        """The neighbours of rows placed at their tiles' centres (``positions``): queried once
        per distinct tile, so rows of one tile share its neighbours. ``tiles``: strings, or a
        ``pandas.Categorical`` (distinct tiles found from its integer codes; its categories
        quadkeys or :func:`geodbk.geo.quadkey.tile_keys`, as ``positions`` takes either)."""
        assert self.positions is not None
        if isinstance(tiles, pd.Categorical):
            codes = np.asarray(tiles.codes, dtype=np.int64)
            categories = np.asarray(tiles.categories)
            if categories.dtype.kind not in "iu":
                categories = categories.astype(str)
            first = np.full(categories.size, -1, dtype=np.int64)
            first[codes] = np.arange(codes.size)  # a row of each tile (which one: any)
            if codes.size and codes.min() >= 0 and first.min() >= 0:  # every tile used
                distinct, inverse = categories, codes
            else:
                used, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
                distinct = categories[used]  # only the tiles used
        else:
            distinct, first, inverse = np.unique(tiles, return_index=True, return_inverse=True)
        hood = self._neighbours.query(self.positions(distinct), own[first])
        return replace(hood, rows=torch.as_tensor(inverse.reshape(-1)))


def tile_chunks(tiles: Any, chunk_size: int) -> list[slice | np.ndarray]:
    """Row chunks of at most ``chunk_size`` distinct tiles each, every row of a tile in one
    chunk: ``[slice(0, n)]`` when the rows hold no more tiles, else index arrays (each chunk's
    rows in their order). ``tiles``: strings or a ``pandas.Categorical``; a map block's, whose
    categories are its distinct tiles, is one chunk without a pass over its rows."""
    at_most = len(tiles.categories) if isinstance(tiles, pd.Categorical) else len(tiles)
    if at_most <= chunk_size:  # no more distinct tiles than that: one chunk
        return [slice(0, len(tiles))]
    keys = tiles.codes if isinstance(tiles, pd.Categorical) else np.asarray(tiles)
    _, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.reshape(-1)
    n_tiles = int(inverse.max()) + 1 if inverse.size else 0
    if n_tiles <= chunk_size:
        return [slice(0, inverse.size)]
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(0, n_tiles, chunk_size))
    ends = [*starts[1:], inverse.size]
    return [np.sort(order[a:b]) for a, b in zip(starts, ends, strict=True)]


def _predict_rows(
    lay: _Layout,
    hood: _Hood,
    own: np.ndarray,
    times: torch.Tensor,
    var_f: torch.Tensor,
    group: torch.Tensor,
    theta: _Theta,
    *,
    summaries: _Summaries | None = None,
    with_pull: bool = False,
) -> Any:
    """Shift and tile variance of target rows (module docstring, steps 1-3); with
    ``with_pull`` also the kriged pull and the field's kriging variance ``sigma²_nb``."""
    tau2, rho, lam, kappa, mu = theta.tau2, theta.rho, theta.lam, theta.kappa, theta.mu
    sigma2, range_km = theta.sigma2, theta.range_km
    summ = summaries if summaries is not None else _summaries(lay, tau2, rho, kappa, mu)
    n = own.size
    if hood.k > 0:
        pull, s2nb = _krige(summ, hood, sigma2=sigma2, range_km=range_km, lam=lam)
    else:
        pull, s2nb = torch.zeros(n, dtype=_DT), sigma2.expand(n).clone()
    shift = pull.clone()
    var = tau2[group] + lam * var_f + s2nb
    seen = own >= 0
    if seen.any():
        sel = torch.as_tensor(seen)
        # the own tile's rows, centred on the pull, with the kriging variance as a constant
        # prior part: r - mu ~ N(0, tau² rho^|dt| + lambda sqrt(v v') + s2nb + E)
        m_rows = pull[sel]
        s2_rows = s2nb[sel]
        sh, v = _own_tiles(
            lay,
            own[seen],
            m_rows,
            s2_rows,
            times[sel],
            var_f[sel],
            theta,
        )
        where = torch.as_tensor(np.flatnonzero(seen))
        shift = shift.index_put((where,), m_rows + sh)
        var = var.index_put((where,), v)
    if with_pull:
        return shift, var, pull, s2nb
    return shift, var


def _own_tiles(
    lay: _Layout,
    own: np.ndarray,
    pull: torch.Tensor,
    s2nb: torch.Tensor,
    times: torch.Tensor,
    var_f: torch.Tensor,
    theta: _Theta,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift from the pull and tile variance of rows in measured tiles (layout positions
    ``own``), conditioned on their tile's rows: ``r - pull ~ N(0, tau² rho^|dt| + lambda
    sqrt(v v') + s2nb + E)``. Rows of one tile with the same pull and ``s2nb`` (a map's cells)
    share one factor, and the factors are made in groups of similar row counts
    (:func:`geodbk.tile_effect.row_count_groups`)."""
    tau2, rho, lam, kappa, mu = theta.tau2, theta.rho, theta.lam, theta.kappa, theta.mu
    keys = np.column_stack(
        [own, pull.detach().numpy().view(np.int64), s2nb.detach().numpy().view(np.int64)]
    )
    _, inverse = unique_rows(keys, ordered=False)
    first = np.unique(inverse, return_index=True)[1]  # one row per distinct key
    tile_of_key = own[first]
    groups = row_count_groups(lay, tile_of_key)
    key_group = np.empty(first.size, dtype=np.int64)
    for g, (entries, _) in enumerate(groups):
        key_group[entries] = g
    group_rows = rows_of_groups(key_group[inverse], len(groups))
    shifts, variances = [], []
    for g, (entries, width) in enumerate(groups):
        sub = lay.subset(tile_of_key[entries], width=width)
        chosen = torch.as_tensor(first[entries])
        sub = replace(sub, residual=sub.residual - pull[chosen][:, None])
        constant = s2nb[chosen]
        L, b = _factor(sub, tau2, rho, lam, kappa, constant=constant, mu=mu)
        rows = group_rows[g]
        picked = torch.as_tensor(rows)
        sh, v = _predict_tile_with_constant(
            sub,
            L,
            b,
            np.searchsorted(entries, inverse[rows]),
            times[picked],
            var_f[picked],
            tau2=tile_offset_variance(sub, tau2, mu),
            rho=rho[sub.group] if rho.dim() else rho.expand(sub.group.shape[0]),
            lam=lam,
            constant=constant,
        )
        shifts.append(sh)
        variances.append(v)
    back = torch.as_tensor(np.argsort(np.concatenate(group_rows)))
    return torch.cat(shifts)[back], torch.cat(variances)[back]


def _predict_tile_with_constant(
    lay: _Layout,
    L: torch.Tensor,
    b: torch.Tensor,
    target: np.ndarray,
    times: torch.Tensor,
    var_f: torch.Tensor,
    *,
    tau2: torch.Tensor,
    rho: torch.Tensor,
    lam: torch.Tensor,
    constant: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift ``k'(K + E)^{-1} r`` and variance ``prior - k'(K + E)^{-1} k`` of each row ``i``
    of layout tile ``u = target[i]`` (factor ``L_u``, ``b_u = L_u^{-1} r_u``) at ``times[i]``,
    with ``k = tau_u² rho^|t_i - t| + c_u + lambda sqrt(v_i) sqrt(v)`` and ``prior = tau_u² +
    lambda v_i + c_u`` (``tau2``, ``rho``, ``constant``: one per layout tile).

    ``k = A + sqrt(v_i) B`` with ``A``, ``B`` fixed by ``(u, t_i)``, so the two triangular
    solves ``alpha = L^{-1} A`` and ``beta = L^{-1} B`` are done once per distinct ``(u, t_i)``
    and each row costs O(1): ``shift = alpha'b + sqrt(v_i) beta'b`` and ``k'(K + E)^{-1} k =
    ||alpha||² + 2 sqrt(v_i) alpha'beta + v_i ||beta||²``.
    """
    keys = np.column_stack([np.asarray(target, dtype=np.int64), times.numpy().view(np.int64)])
    pairs, group = unique_rows(keys, ordered=False)
    u = torch.as_tensor(pairs[:, 0])
    t_g = times.new_tensor(pairs[:, 1].view(np.float64))
    mask = lay.mask[u]
    a_cov = offset_covariance(t_g[:, None], lay.times[u], tau2=tau2[u, None], rho=rho[u, None])
    a_cov = torch.where(mask, a_cov + constant[u, None], torch.zeros((), dtype=_DT))
    b_cov = torch.where(mask, lam * torch.sqrt(lay.var_f[u]), torch.zeros((), dtype=_DT))
    sol = torch.linalg.solve_triangular(L[u], torch.stack([a_cov, b_cov], -1), upper=False)
    alpha, beta = sol[..., 0], sol[..., 1]
    bu = b[u]
    g = torch.as_tensor(group)
    root = torch.sqrt(var_f)
    shift = (alpha * bu).sum(-1)[g] + root * (beta * bu).sum(-1)[g]
    explained = (
        (alpha * alpha).sum(-1)[g]
        + 2.0 * root * (alpha * beta).sum(-1)[g]
        + var_f * (beta * beta).sum(-1)[g]
    )
    rows = torch.as_tensor(target)
    prior = tau2[rows] + lam * var_f + constant[rows]
    return shift, (prior - explained).clamp_min(0.0)
