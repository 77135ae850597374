"""The tile effect: a persistent per-tile offset on top of a fitted GP.

With the GP's posterior mean ``m`` and latent variance ``v_f``, the residuals ``r = y - m(x)`` of
tile ``j`` (group ``g``, :func:`urban_groups`) at time steps ``t`` (quarters) are

.. math::

    r_l = \\delta_j + u_j(t_l) + \\varepsilon_l \\sim N(0, K + E), \\quad
    K_{ll'} = \\tau_j^2 \\rho^{|t_l - t_{l'}|} + \\lambda \\sqrt{v_{f,l} v_{f,l'}}, \\quad
    \\tau_j^2 = \\tau_g^2 + \\textstyle\\sum_k \\mu_k \\bar c_{jk}, \\quad
    E = \\operatorname{diag}(s2'_l), \\quad s2'_l = \\textstyle\\sum_k \\kappa_k c_{lk}:

``delta_j`` the GP's error at the tile (one draw per tile), ``u_j`` an AR(1) offset independent
between tiles, ``c_l`` the GP's noise terms (floor, ``s2_meas / tests``, ``s2_dev / devices``).
The offset's variance is the place's ``tau_g²`` plus the persistent part of the tile's testers,
``mu_k`` times the mean ``c_jk`` of its rows (few devices testing a tile keep it away from its
place's level quarter after quarter; ``mu = 0`` for the floor).
A row at ``t*`` gets, by one Cholesky factor per tile,

.. math::

    \\text{mean} = m(x_*) + k_*^\\top (K + E)^{-1} r, \\qquad
    \\text{var} = \\tau_g^2 + \\lambda v_f(x_*) - k_*^\\top (K + E)^{-1} k_* + s2'_*,

with ``k_*`` the row of ``K`` at ``(t*, x*)``; a tile without rows gets ``m(x*)`` and the
place's ``tau²_g + lambda v_f(x*)``, and a row there adds its own testers' ``sum_k mu_k c_*k``
to the noise. An observation's mean also moves with its own tests, by ``sum_k gamma_k (c_*k -
c0_k)`` around the training rows' mean ``c0`` (the log of an average of fewer tests sits
lower); the tile's offset does not. ``(tau², mu, rho, lambda, kappa, gamma)`` minimise the
validation NLL of rows predicted from their tile's training rows. Units: those of ``y``.
Decision and evidence: docs/decisions/tile_effect.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from geodbk.bases import stable_cholesky
from geodbk.errors import DataError
from geodbk.geo.quadkey import keys_to_tile, quadkey_to_tile, tile_keys, tile_to_quadkey
from geodbk.metrics import gaussian_nll
from geodbk.predictive import Prediction

__all__ = [
    "MAX_PLACE_SHARE",
    "UNSEEN_EFFECT",
    "UNSEEN_GP",
    "TileEffect",
    "TileEffectParameters",
    "TileEffectPrediction",
    "check_place_share",
    "check_place_shares_by_group",
    "check_unseen_prior",
    "choose_unseen_prior",
    "components_like",
    "fit_tile_effect",
    "gp_unseen_variance",
    "holdout_rows",
    "mean_gaussian_nll",
    "minimize_lbfgs",
    "offset_covariance",
    "predict_with_tile_effect",
    "row_place_shares",
    "split_unseen_prior",
    "tests_mean_shift",
    "tests_shift_is_plausible",
    "urban_groups",
    "with_gp_prior",
]

log = logging.getLogger("geodbk")

_DT = torch.float64
#: First absolute jitter of the Cholesky of ``K + E`` (units of y²; grown tenfold on failure).
_JITTER = 1e-9
#: Default number of a tile's most recent rows kept for conditioning (20 quarters fit).
MAX_ROWS = 32
#: The group of every tile when no groups are given.
ALL = "all"
#: Largest place share: an unmeasured tile's prior offset variance at most tripled, out of
#: one test's noise (:func:`split_unseen_prior`).
MAX_PLACE_SHARE = 3.0
#: Fewest objective rows with a measured tile for the validation objective; below it the
#: parameters are chosen on a hold-out of the training rows (:func:`holdout_rows`).
MIN_OBJECTIVE_ROWS = 100
#: Share of the multi-row training tiles that give one row to the training hold-out.
HOLDOUT_SHARE = 0.2
#: The training hold-out takes at least this many rows where half the multi-row training tiles
#: allow it (a small region's 20% would give too few rows to choose the parameters on).
HOLDOUT_FLOOR = 200
#: Fewest objective rows the tile effect is fitted on; with fewer it is refused.
MIN_HOLDOUT_ROWS = 10
#: Noise components that fall with a tile's tests or devices; only these get a persistent share
#: ``mu_k`` (a constant component's would be the place's ``tau²`` again).
PERSISTENT_COMPONENTS = ("meas", "dev")
#: Noise components whose size moves a row's mean (``gamma_k``): the same terms, those that
#: fall with tests or devices. The log of an average of n tests sits ``(ln 10 / 2) s2 / n``
#: below the log of the long-run mean speed (Jensen), so rows of few tests or devices sit lower
#: (docs/decisions/tile_effect.md, "An observation's tests move its mean").
TESTS_COMPONENTS = PERSISTENT_COMPONENTS
#: An unmeasured tile's prior as the tile effect states it: ``lambda v_f + tau²`` (with a local
#: layer, the white part and the field's kriging variance), chosen on rows of measured tiles.
UNSEEN_EFFECT = "tile effect"
#: An unmeasured tile's prior as the GP states it: its rows' own variance ``v_f + sum_k c_k``
#: less a test's noise (and a local layer's kriging gain) (:func:`gp_unseen_variance`).
UNSEEN_GP = "gp"
#: Validation NLL (nats per row) by which the GP's prior of an unmeasured tile must beat the
#: tile effect's to be chosen: a random split's few unmeasured validation tiles tie them, and
#: a tie keeps the tile effect's.
UNSEEN_GP_MARGIN = 1e-3


def gp_unseen_variance(
    var_f: torch.Tensor,
    components: torch.Tensor,
    kappa: torch.Tensor,
    s2nb: torch.Tensor,
    sigma2: torch.Tensor,
) -> torch.Tensor:
    """Tile variance of a tile without rows as the GP states it (:data:`UNSEEN_GP`):
    ``W - min(sigma², W) (1 - sigma²_nb / sigma²)`` with ``W = v_f + sum_k max(1 - kappa_k, 0)
    c_k``, the GP's latent variance plus the part of its noise ``sum_k c_k`` at the row's tests
    that is not a test's own (``kappa'c``, the tile effect's refitted noise), less what a local
    layer's field explains: its share of ``W``, at most the whole of it, times its kriging
    gain (``sigma²`` 0 for the tile effect alone). That is ``W - (sigma² - sigma²_nb)`` where
    ``sigma² <= W``; where the GP's variance is smaller than the field's, the field explains a
    share of it, never more, so the tile keeps ``W sigma²_nb / sigma²`` at least. The GP's
    noise was fitted on single rows, so it holds the spread of a tile around ``f`` as it falls
    with the tile's tests and devices; a test there adds ``kappa'c``."""
    persistent = (components * (1.0 - kappa).clamp_min(0.0)).sum(-1)
    whole = var_f + persistent
    explained = torch.minimum(sigma2.to(whole.dtype), whole)  # 0 without a field
    gain = (1.0 - s2nb / sigma2.clamp_min(1e-300)).clamp(0.0, 1.0)
    return (whole - explained * gain).clamp_min(0.0)


def with_gp_prior(
    tile_var: np.ndarray,
    seen: np.ndarray,
    *,
    var_f: np.ndarray,
    components: np.ndarray,
    tile_components: Any,
    kappa: torch.Tensor,
    s2nb: Any = 0.0,
    sigma2: Any = 0.0,
) -> np.ndarray:
    """``tile_var`` with the rows whose tile is not ``seen`` given :func:`gp_unseen_variance`
    at ``tile_components`` (default the rows' ``components``); ``s2nb`` and ``sigma2`` a
    local layer's kriging variance and field variance (0: no field)."""
    at = components if tile_components is None else components_like(tile_components, components)
    gp_var = gp_unseen_variance(
        torch.tensor(np.asarray(var_f), dtype=_DT),
        torch.tensor(np.asarray(at), dtype=_DT),
        kappa,
        torch.as_tensor(s2nb, dtype=_DT),
        torch.as_tensor(sigma2, dtype=_DT),
    )
    return np.where(seen, tile_var, gp_var.numpy())


def check_place_share(share: float) -> None:
    """Refuse a place share outside (0, :data:`MAX_PLACE_SHARE`] (a ``ValueError`` naming it)."""
    if not 0.0 < float(share) <= MAX_PLACE_SHARE:
        raise ValueError(f"place_share must be in (0, {MAX_PLACE_SHARE:g}], got {share}")


def check_place_shares_by_group(shares: dict[str, float] | None) -> dict[str, float] | None:
    """``shares`` with string keys and float values, each a valid place share
    (:func:`check_place_share`); ``None`` stays ``None``."""
    if shares is None:
        return None
    out = {str(g): float(c) for g, c in sorted(shares.items())}
    for c in out.values():
        check_place_share(c)
    return out


def row_place_shares(
    place_share: float, by_group: dict[str, float] | None, *, groups: tuple[str, ...], code: Any
) -> float | np.ndarray:
    """The place share of each row: its group's own (``by_group``, the groups whose
    validation tiles chose one) or the pooled ``place_share``; ``code`` indexes ``groups``.
    One float when no group has its own."""
    if not by_group:
        return float(place_share)
    per_group = np.array([by_group.get(g, place_share) for g in groups], dtype=np.float64)
    return per_group[np.asarray(code, dtype=np.int64)]


def check_unseen_prior(name: str) -> None:
    """Refuse a name that is neither :data:`UNSEEN_EFFECT` nor :data:`UNSEEN_GP`."""
    if name not in (UNSEEN_EFFECT, UNSEEN_GP):
        raise ValueError(f"unseen_prior must be {UNSEEN_EFFECT!r} or {UNSEEN_GP!r}, got {name!r}")


def components_like(components: Any, rows: np.ndarray) -> np.ndarray:
    """``components`` (one row of k, or (n, k)) as an (n, k) float64 array like ``rows``."""
    out = np.asarray(components, dtype=np.float64)
    if out.ndim == 1:
        out = np.broadcast_to(out, rows.shape)
    if out.shape != rows.shape:
        raise ValueError(f"tile_components must be {rows.shape[1]} values or {rows.shape}")
    return out


@dataclass(frozen=True)
class TileEffectParameters:
    """Fitted tile-effect parameters (units of ``y``).

    Attributes
    ----------
    tau2
        Prior variance of a tile's offset, ``tau²``, per tile group (``{"all": tau²}`` without
        groups; a float is read as that).
    rho
        Correlation of the offset between consecutive time steps, in (0, 1].
    noise_scale
        ``kappa_k``, the multiplier of each noise component (same order as ``components``).
    latent_scale
        ``lambda``, the multiplier of the GP's latent variance.
    components
        Names of the GP's noise components, e.g. ``("floor", "meas", "dev")``.
    val_nll
        Validation NLL (nats per row) with the tile effect, and ``val_nll_without`` with the
        GP alone, on the same rows.
    objective
        Which rows chose the parameters: ``validation`` (validation rows of tiles with
        training rows) or ``training hold-out`` (one held-out row of a share of the multi-row
        training tiles, when too few validation rows have a measured tile:
        :func:`holdout_rows`).
    objective_rows
        How many rows the objective had.
    persistent_scale
        ``mu_k``, the share of each noise component that persists at a tile across time steps
        (its testers'; 0 for the floor; ``None``: none, as in files written before it).
    place_share
        ``c`` in (0, :data:`MAX_PLACE_SHARE`]: how much of an unmeasured tile's prior offset
        variance ``P`` is the place's, what a well-measured tile's level shows. Below 1, ``(1 -
        c) P`` is its testers' and goes to one test's noise; above 1, ``(c - 1) P`` of one
        test's noise is the place's (:func:`split_unseen_prior`). 1 (files written before it):
        the prior as stated.
    place_share_basis
        What chose ``place_share``: ``{"tiles": n, "units": K}``, the well-measured validation
        tiles without training rows and the held-out units (blocks or tiles) they lie in;
        ``None`` when it was not chosen on validation tiles.
    place_share_by_group
        The share of each urban / rural group whose own validation tiles chose one (group
        name to ``c``); the other groups take ``place_share``. ``None`` (files written before
        it, or too few tiles in every group): ``place_share`` for all.
    tests_shift, tests_centre
        ``gamma_k`` and ``c0_k``: an observation's mean sits ``sum_k gamma_k (c_k - c0_k)``
        from its tile's with its noise terms ``c_k`` (the log of an average of fewer tests
        sits lower: :data:`TESTS_COMPONENTS`); ``c0`` is the training rows' mean. The tile's
        offset and the tile quantity do not move. Zeros (files written before it): no shift.
    tests_shift_dropped
        The ``gamma`` the fit found and dropped because it put rows of fewer tests above rows
        of more (:func:`tests_shift_is_plausible`; ``tests_shift`` is then 0); ``None`` when
        nothing was dropped.
    unseen_prior
        How a tile without conditioning rows is stated: :data:`UNSEEN_EFFECT` (``lambda v_f +
        tau²``, as in files written before it) or :data:`UNSEEN_GP` (:func:`gp_unseen_variance`),
        chosen on validation rows of unmeasured tiles (:func:`choose_unseen_prior`).
    val_nll_unseen
        The validation NLL of those rows under each prior (``None``: not chosen on them).
    """

    tau2: dict[str, float]
    rho: float
    noise_scale: tuple[float, ...]
    components: tuple[str, ...]
    latent_scale: float = 1.0
    val_nll: float | None = None
    val_nll_without: float | None = None
    objective: str = "validation"
    objective_rows: int | None = None
    persistent_scale: tuple[float, ...] | None = None
    place_share: float = 1.0
    place_share_basis: dict[str, int] | None = None
    tests_shift: tuple[float, ...] | None = None
    tests_centre: tuple[float, ...] | None = None
    tests_shift_dropped: tuple[float, ...] | None = None
    unseen_prior: str = UNSEEN_EFFECT
    val_nll_unseen: dict[str, float] | None = None
    place_share_by_group: dict[str, float] | None = None

    def __post_init__(self) -> None:
        check_place_share(self.place_share)
        object.__setattr__(
            self, "place_share_by_group", check_place_shares_by_group(self.place_share_by_group)
        )
        check_unseen_prior(self.unseen_prior)
        tau2 = self.tau2 if isinstance(self.tau2, dict) else {ALL: self.tau2}
        object.__setattr__(self, "tau2", {str(g): float(v) for g, v in sorted(tau2.items())})
        mu = self.persistent_scale
        mu = (0.0,) * len(self.components) if mu is None else tuple(float(m) for m in mu)
        if len(mu) != len(self.components):
            raise ValueError(f"persistent_scale needs one value per component {self.components}")
        object.__setattr__(self, "persistent_scale", mu)
        for name in ("tests_shift", "tests_centre"):
            value = getattr(self, name)
            value = (0.0,) * len(self.components) if value is None else tuple(map(float, value))
            if len(value) != len(self.components):
                raise ValueError(f"{name} needs one value per component {self.components}")
            object.__setattr__(self, name, value)
        if self.tests_shift_dropped is not None:
            dropped = tuple(float(g) for g in self.tests_shift_dropped)
            object.__setattr__(self, "tests_shift_dropped", dropped)

    @property
    def groups(self) -> tuple[str, ...]:
        """The tile groups, sorted (``("all",)`` without groups)."""
        return tuple(self.tau2)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TileEffectParameters:
        """Inverse of :meth:`to_dict` (also reads files where ``tau2`` is one float)."""
        return cls(
            **{
                **raw,
                "noise_scale": tuple(raw["noise_scale"]),
                "components": tuple(raw["components"]),
                "persistent_scale": raw.get("persistent_scale"),
                "tests_shift": raw.get("tests_shift"),
                "tests_centre": raw.get("tests_centre"),
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = asdict(self)
        out["tau2"] = dict(self.tau2)
        out["noise_scale"] = list(self.noise_scale)
        out["components"] = list(self.components)
        out["persistent_scale"] = list(self.persistent_scale or ())
        out["tests_shift"] = list(self.tests_shift or ())
        out["tests_centre"] = list(self.tests_centre or ())
        if self.place_share_basis is None:
            out.pop("place_share_basis")
        if self.tests_shift_dropped is None:
            out.pop("tests_shift_dropped")
        else:
            out["tests_shift_dropped"] = list(self.tests_shift_dropped)
        if self.val_nll_unseen is None:
            out.pop("val_nll_unseen")
        if self.place_share_by_group is None:
            out.pop("place_share_by_group")
        return out


@dataclass(frozen=True)
class TileEffectPrediction:
    """The tile effect's part of a prediction (numpy float64, n rows).

    Attributes
    ----------
    shift
        Posterior mean of the GP's error plus the offset, added to the GP mean.
    tile_var
        Posterior variance of the tile's mean ``f + u`` at the row: it replaces the GP's
        latent variance (``tau² + lambda v_f`` for a tile without conditioning rows).
    noise_var
        Refitted observation noise ``s2'_i = sum_k kappa_k c_ik``; a row of a tile without
        conditioning rows adds its testers' persistent ``sum_k mu_k c_ik`` (:func:`row_prediction`).
    persistent_var
        That testers' part of ``noise_var`` (0 at rows of tiles with conditioning rows).
    seen
        Whether the row's tile has conditioning rows.
    pull
        The neighbouring tiles' part of ``shift`` (a :class:`geodbk.local_layer.LocalLayer`'s
        kriged field; ``None`` for the tile effect alone).
    tests_shift
        The rows' own tests' move of one test's mean, ``sum_k gamma_k (c_k - c0_k)``: added
        to an observation's mean, not to the tile's (``None``: none).
    """

    shift: np.ndarray
    tile_var: np.ndarray
    noise_var: np.ndarray
    persistent_var: np.ndarray
    seen: np.ndarray
    pull: np.ndarray | None = None
    tests_shift: np.ndarray | None = None

    @property
    def observation_shift(self) -> np.ndarray:
        """``shift`` plus the rows' ``tests_shift``: an observation's move from the GP mean."""
        return self.shift if self.tests_shift is None else self.shift + self.tests_shift


def mean_gaussian_nll(
    residual: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
) -> torch.Tensor:
    """``mean(0.5 (log(2 pi var) + (residual - mean)² / var))``, nats per row."""
    return 0.5 * (torch.log(2 * math.pi * var) + (residual - mean) ** 2 / var).mean()


def minimize_lbfgs(objective: Any, raw: torch.Tensor, *, max_iter: int) -> None:
    """Minimise ``objective(raw)`` over the tensor ``raw`` (requires_grad) in place with
    L-BFGS and a strong-Wolfe line search."""
    opt = torch.optim.LBFGS([raw], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective(raw)
        loss.backward()
        return loss

    opt.step(closure)


def offset_covariance(
    t_a: torch.Tensor, t_b: torch.Tensor, *, tau2: torch.Tensor, rho: torch.Tensor
) -> torch.Tensor:
    """``tau² rho^{|t_a - t_b|}`` for broadcastable time tensors (the AR(1) covariance)."""
    return tau2 * torch.exp(torch.abs(t_a - t_b) * torch.log(rho))


@dataclass
class _Layout:
    """Conditioning rows padded to (tiles, max_rows); padded slots have ``mask = False``."""

    tiles: np.ndarray  # (T,) tile ids, sorted
    times: torch.Tensor  # (T, M)
    residual: torch.Tensor  # (T, M)
    var_f: torch.Tensor  # (T, M)
    components: torch.Tensor  # (T, M, k)
    mask: torch.Tensor  # (T, M) bool
    group: torch.Tensor  # (T,) group code of each tile (that of its latest row)

    @functools.cached_property
    def sorted_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """:func:`sorted_tile_keys` of the tiles (once per layout)."""
        return sorted_tile_keys(self.tiles)

    def subset(self, index: np.ndarray, *, width: int | None = None) -> _Layout:
        """The tiles at positions ``index`` (sorted), as a layout of their own; with ``width``,
        only their last ``width`` slots (a tile's rows fill its last slots, so a width of at
        least the tiles' row counts drops padding only)."""
        i = torch.as_tensor(index)
        cols = slice(None) if width is None else slice(self.mask.shape[1] - width, None)
        return _Layout(
            self.tiles[index],
            self.times[i, cols],
            self.residual[i, cols],
            self.var_f[i, cols],
            self.components[i, cols],
            self.mask[i, cols],
            self.group[i],
        )


#: Row counts at which :func:`row_count_groups` cuts a layout's tiles into groups.
ROW_COUNT_STEPS: tuple[int, ...] = (1, 3, 6, 10, 15)
#: Fewest tiles a group of :func:`row_count_groups` holds before the next, wider step (a small
#: group costs more in per-batch overhead than its padding would).
MIN_GROUP_TILES = 256


def row_count_groups(
    lay: _Layout,
    index: np.ndarray | None = None,
    *,
    steps: Sequence[int] = ROW_COUNT_STEPS,
    min_tiles: int = MIN_GROUP_TILES,
) -> list[tuple[np.ndarray, int]]:
    """The tiles at layout positions ``index`` (default: all; repeats allowed) in groups of
    similar row counts: ``(entries, width)`` per group, ``entries`` the group's places in
    ``index`` (sorted) and ``width`` its largest count (``steps``, then the layout's width),
    for ``lay.subset(index[entries], width=width)``. A group holds at least ``min_tiles``
    tiles, the widest excepted: fewer join the next step's.

    Padding is inert (no covariance, unit noise), so a group's factors and solves equal the
    padded ones, at a cost of ``sum_g n_g m_g³`` instead of ``n M³`` (most tiles have few rows:
    on Hawaii mobile a median of 3, up to 20)."""
    positions = np.arange(lay.mask.shape[0]) if index is None else np.asarray(index)
    count = lay.mask.sum(-1).numpy()[positions]
    width = int(lay.mask.shape[1])
    edges = [s for s in sorted(set(steps)) if 0 < s < width] + [width]
    groups = []
    low = -1  # a tile without rows goes with the narrowest group
    for i, high in enumerate(edges):
        inside = (count > low) & (count <= high)
        taken = int(inside.sum())
        if taken >= min_tiles or (taken and i == len(edges) - 1):
            groups.append((np.flatnonzero(inside), max(high, 1)))
            low = high
    return groups


def _layout(
    tiles: np.ndarray,
    times: np.ndarray,
    residual: np.ndarray,
    var_f: np.ndarray,
    components: np.ndarray,
    group_codes: np.ndarray,
    *,
    max_rows: int,
) -> _Layout:
    """Group conditioning rows by tile (at most the ``max_rows`` latest per tile) and pad."""
    order = np.lexsort((times, tiles))
    tiles, times = tiles[order], times[order]
    uniq, start, count = np.unique(tiles, return_index=True, return_counts=True)
    code = np.repeat(np.arange(uniq.size), count)
    rank_from_end = np.repeat(start + count, count) - np.arange(tiles.size) - 1
    keep = rank_from_end < max_rows
    m = int(min(max_rows, count.max())) if count.size else 1
    slot = (m - 1 - rank_from_end)[keep]  # latest row in the last slot
    code, src = code[keep], order[keep]
    shape = (uniq.size, m)
    t = np.zeros(shape)
    r = np.zeros(shape)
    vf = np.ones(shape)
    comp = np.zeros((*shape, components.shape[1]))
    mask = np.zeros(shape, dtype=bool)
    t[code, slot] = times[keep]
    r[code, slot] = residual[src]
    vf[code, slot] = var_f[src]
    comp[code, slot] = components[src]
    mask[code, slot] = True
    latest = order[start + count - 1] if uniq.size else np.zeros(0, dtype=np.int64)
    group = torch.as_tensor(np.asarray(group_codes, dtype=np.int64)[latest])
    as_t = lambda a: torch.as_tensor(a, dtype=_DT)  # noqa: E731
    return _Layout(uniq, as_t(t), as_t(r), as_t(vf), as_t(comp), torch.as_tensor(mask), group)


def tile_offset_variance(
    lay: _Layout, tau2: torch.Tensor, mu: torch.Tensor | None, index: Any = None
) -> torch.Tensor:
    """``tau_j² = tau²_g + sum_k mu_k c̄_jk`` of the layout's tiles (at ``index``): the place's
    variance plus the persistent part of the mean noise component of the tile's rows."""
    group = lay.group if index is None else lay.group[index]
    out = tau2[group]
    if mu is None:
        return out
    mask = lay.mask if index is None else lay.mask[index]
    comp = lay.components if index is None else lay.components[index]
    count = mask.sum(-1).clamp_min(1).to(_DT)
    cbar = (comp * mask[..., None]).sum(-2) / count[:, None]
    return out + (cbar * mu).sum(-1)


def _tile_covariance(
    t_a: torch.Tensor,
    v_a: torch.Tensor,
    t_b: torch.Tensor,
    v_b: torch.Tensor,
    *,
    tau2: torch.Tensor,
    rho: torch.Tensor,
    lam: torch.Tensor,
) -> torch.Tensor:
    """``tau² rho^{|t_a - t_b|} + lambda sqrt(v_a v_b)``: offset plus the shared GP error."""
    return offset_covariance(t_a, t_b, tau2=tau2, rho=rho) + lam * torch.sqrt(v_a * v_b)


def rows_of_groups(row_group: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """The rows of each group ``0 .. n_groups - 1``, each in row order (``row_group``: each
    row's group; a row of any other label is in none)."""
    order = np.argsort(row_group, kind="stable")
    bounds = np.searchsorted(row_group[order], np.arange(n_groups + 1))
    return [order[a:b] for a, b in itertools.pairwise(bounds)]


def _factor(
    lay: _Layout,
    tau2: torch.Tensor,
    rho: torch.Tensor,
    lam: torch.Tensor,
    kappa: torch.Tensor,
    constant: torch.Tensor | None = None,
    *,
    mu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cholesky factors ``L`` of ``K + E`` per tile and ``b = L^{-1} r`` (padding inert);
    ``tau2`` holds one ``tau²`` per group, ``rho`` one for every tile (0-d) or one per group,
    and ``mu`` the persistent shares (:func:`tile_offset_variance`); ``constant`` (one per
    layout row) is added to every pair of the row's real slots (a constant prior part, e.g. a
    kriging variance)."""
    if rho.dim():
        rho = rho[lay.group][:, None, None]
    pair = lay.mask[:, :, None] & lay.mask[:, None, :]
    K = _tile_covariance(
        lay.times[:, :, None],
        lay.var_f[:, :, None],
        lay.times[:, None, :],
        lay.var_f[:, None, :],
        tau2=tile_offset_variance(lay, tau2, mu)[:, None, None],
        rho=rho,
        lam=lam,
    )
    if constant is not None:
        K = K + constant[:, None, None]
    K = torch.where(pair, K, torch.zeros((), dtype=_DT))
    e = (lay.components * kappa).sum(-1)
    e = torch.where(lay.mask, e, torch.ones((), dtype=_DT))
    L = stable_cholesky(K + torch.diag_embed(e), jitter=_JITTER)
    b = torch.linalg.solve_triangular(L, lay.residual[..., None], upper=False)[..., 0]
    return L, b


def _predict_tile(
    lay: _Layout,
    L: torch.Tensor,
    b: torch.Tensor,
    slot: np.ndarray,
    times: torch.Tensor,
    var_f: torch.Tensor,
    group: torch.Tensor,
    *,
    tau2: torch.Tensor,
    rho: torch.Tensor,
    lam: torch.Tensor,
    mu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shift and tile variance of rows in tile ``slot`` (-1: no conditioning rows).

    ``tau2`` holds one ``tau²`` per group and ``group`` each row's group code: it sets the prior
    (the place's) of a row whose tile has no conditioning rows; a seen tile's own group and
    rows set the rest (:func:`tile_offset_variance`)."""
    shift = torch.zeros(slot.size, dtype=_DT)
    var = tau2[group] + lam * var_f
    seen = slot >= 0
    if not seen.any():
        return shift, var
    idx = torch.as_tensor(slot[seen])
    sel = torch.as_tensor(seen)
    tile_tau2 = tile_offset_variance(lay, tau2, mu, idx)
    ks = _tile_covariance(
        times[sel][:, None],
        var_f[sel][:, None],
        lay.times[idx],
        lay.var_f[idx],
        tau2=tile_tau2[:, None],
        rho=rho,
        lam=lam,
    )
    ks = torch.where(lay.mask[idx], ks, torch.zeros((), dtype=_DT))
    a = torch.linalg.solve_triangular(L[idx], ks[..., None], upper=False)[..., 0]
    pos = torch.as_tensor(np.flatnonzero(seen))
    shift = shift.index_put((pos,), (a * b[idx]).sum(-1))
    prior = tile_tau2 + lam * var_f[sel]
    var = var.index_put((pos,), (prior - (a * a).sum(-1)).clamp_min(0.0))
    return shift, var


def row_prediction(
    shift: np.ndarray,
    tile_var: np.ndarray,
    components: np.ndarray,
    kappa: torch.Tensor,
    mu: torch.Tensor,
    *,
    seen: np.ndarray,
    pull: np.ndarray | None = None,
    tests_shift: np.ndarray | None = None,
) -> TileEffectPrediction:
    """The prediction at rows with the tile's posterior ``shift`` and ``tile_var``: a row's
    noise is ``sum_k kappa_k c_k`` plus its testers' persistent ``sum_k mu_k c_k`` where its
    tile has no conditioning rows (a measured tile's is in its offset); ``tests_shift`` as
    :class:`TileEffectPrediction`'s."""
    persistent = np.where(seen, 0.0, components @ mu.numpy())
    return TileEffectPrediction(
        shift=shift,
        tile_var=tile_var,
        noise_var=components @ kappa.numpy() + persistent,
        persistent_var=persistent,
        seen=seen,
        pull=pull,
        tests_shift=tests_shift,
    )


def tests_shift_is_plausible(
    gamma: Sequence[float],
    names: Sequence[str],
    components: np.ndarray,
    centre: Sequence[float],
    *,
    tolerance: float = 1e-6,
) -> bool:
    """Whether the tests shift ``gamma`` keeps rows of fewer tests at or below rows of more:
    ``gamma_meas <= 0`` (more tests by the same devices never lower a row's mean) and the
    noisiest row of ``components`` (n, k), one test by one device, sits at or below the
    training rows' centre, ``sum_k gamma_k (max_l c_lk - c0_k) <= 0``. The log of an average
    of fewer tests sits lower (Jensen), and quiet tiles are the worse places: both push the
    same way. A ``gamma_dev`` above 0 is allowed (many tests by one device)."""
    g = np.asarray(gamma, dtype=np.float64)
    if not np.any(g):
        return True
    comp = np.asarray(components, dtype=np.float64)
    if "meas" in names and g[list(names).index("meas")] > tolerance:
        return False
    if comp.size == 0:
        return True
    noisiest = comp.max(axis=0) - np.asarray(centre, dtype=np.float64)
    return float(g @ noisiest) <= tolerance


def tests_mean_shift(
    components: Any, gamma: Sequence[float] | torch.Tensor, centre: Sequence[float]
) -> Any:
    """``sum_k gamma_k (c_k - c0_k) = c'gamma - c0'gamma`` of each row of ``components`` (n, k)
    (or (T, M, k)), one product and no (n, k) temporary: numpy in, numpy out; a tensor
    ``gamma`` (under autograd) gives a tensor."""
    if isinstance(gamma, torch.Tensor):
        comp = torch.as_tensor(components, dtype=_DT)
        return comp @ gamma - torch.as_tensor(centre, dtype=_DT) @ gamma
    g = np.asarray(gamma, dtype=np.float64)
    return np.asarray(components, dtype=np.float64) @ g - float(np.dot(centre, g))


def split_unseen_prior(
    pred: TileEffectPrediction,
    *,
    var_f: np.ndarray,
    latent_scale: float,
    place_share: float | np.ndarray,
) -> TileEffectPrediction:
    """Split the variance of a row whose tile has no rows between the place and its testers
    by the place share ``c``: ``tile_var' = clip(min(lambda v_f, tile_var) + c P, min(v_f,
    tile_var), tile_var + noise_var - persistent_var)`` with ``P = max(tile_var - lambda v_f,
    0)`` the prior offset variance, and ``noise_var`` takes up the difference, so every row's
    ``tile_var + noise_var`` (one test's variance) stays as it was and measured tiles' rows
    are unchanged. Below 1 the rest of ``P`` goes to one test's noise, but a place never
    measured keeps at least the GP's own ``v_f`` where the whole prior holds it (never
    narrower than its area quantity because of ``c``); above 1, ``(c - 1) P`` of one test's
    own noise is the place's, at most all of it (the tile quantity never wider than one
    test). A row whose prior is below ``lambda v_f`` (a field that explains part of the GP's
    variance, :func:`gp_unseen_variance`) has ``P = 0`` and keeps its prior at every ``c``,
    so the split is continuous in ``c`` and equals the prior at ``c = 1``. ``place_share``:
    one ``c``, or one per row (:func:`row_place_shares`)."""
    if np.all(np.asarray(place_share) == 1.0):
        return pred
    vf = np.asarray(var_f, dtype=np.float64)
    whole = pred.tile_var
    latent = latent_scale * vf
    kept = np.minimum(latent, whole) + place_share * np.maximum(whole - latent, 0.0)
    widest = whole + np.maximum(pred.noise_var - pred.persistent_var, 0.0)
    tile_var = np.where(pred.seen, whole, np.clip(kept, np.minimum(vf, whole), widest))
    return replace(pred, tile_var=tile_var, noise_var=pred.noise_var + (whole - tile_var))


def sorted_tile_keys(quadkeys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The :func:`geodbk.geo.quadkey.tile_keys` of ``quadkeys``, sorted, and the position of
    each in ``quadkeys``."""
    keys = tile_keys(*quadkey_to_tile(quadkeys)) if len(quadkeys) else np.zeros(0, np.int64)
    order = np.argsort(keys)
    return keys[order], order


def _slots(known: np.ndarray | _Layout, tiles: Any) -> np.ndarray:
    """Index of each of ``tiles`` (strings, or a ``pandas.Categorical``: looked up once per
    category) in the sorted ``known`` tile ids (or a layout's tiles), -1 where absent. A
    Categorical of integer categories holds :func:`geodbk.geo.quadkey.tile_keys`; they are
    looked up among a layout's keys."""
    if isinstance(tiles, pd.Categorical):
        categories = np.asarray(tiles.categories)
        if categories.dtype.kind not in "iu":
            return _slots(known, categories.astype(str))[tiles.codes]
        keys, order = known.sorted_keys if isinstance(known, _Layout) else sorted_tile_keys(known)
        if keys.size == 0:
            return np.full(len(tiles), -1)
        pos = np.searchsorted(keys, categories).clip(0, keys.size - 1)
        return np.where(keys[pos] == categories, order[pos], -1)[tiles.codes]
    if isinstance(known, _Layout):
        known = known.tiles
    if known.size == 0:
        return np.full(tiles.size, -1)
    pos = np.searchsorted(known, tiles).clip(0, known.size - 1)
    return np.where(known[pos] == tiles, pos, -1)


def tile_id_strings(tiles: Any) -> np.ndarray:
    """Tile ids as quadkey strings; a ``pandas.Categorical`` of integer categories holds
    :func:`geodbk.geo.quadkey.tile_keys`, which become their quadkeys."""
    if isinstance(tiles, pd.Categorical):
        categories = np.asarray(tiles.categories)
        if categories.dtype.kind in "iu":
            if (tiles.codes < 0).any():
                raise DataError("tile ids: missing values")
            return tile_to_quadkey(*keys_to_tile(categories))[tiles.codes]
    return np.asarray(tiles).astype(str)


def _as_rows(
    tiles: Any,
    times: Any,
    residual: Any,
    var_f: Any,
    components: Any,
    *,
    what: str,
    categorical_ok: bool = False,
) -> tuple[Any, ...]:
    """Validate one set of rows: equal lengths, finite values, (n, k) components. Tile ids
    become strings, except a ``pandas.Categorical`` when ``categorical_ok`` (rows to predict:
    its codes spare the string work per row)."""
    if categorical_ok and isinstance(tiles, pd.Categorical):
        if (tiles.codes < 0).any():
            raise DataError(f"{what}: missing tile ids")
        tiles_a: Any = tiles
    else:
        tiles_a = tile_id_strings(tiles)
    n = len(tiles_a)
    times_a = np.asarray(times, dtype=np.float64).reshape(-1)
    var_a = np.maximum(np.asarray(var_f, dtype=np.float64).reshape(-1), 0.0)  # rounding < 0
    comp = np.asarray(components, dtype=np.float64)
    comp = comp.reshape(n, -1) if comp.ndim < 2 else comp
    cols = [times_a, var_a] + ([] if residual is None else [np.asarray(residual, np.float64)])
    if any(c.size != n for c in cols) or comp.shape[0] != n:
        raise ValueError(f"{what}: tiles, times, residual, var_f and components differ in length")
    if not all(np.isfinite(c).all() for c in [*cols, comp]):
        raise DataError(f"{what}: non-finite times, residuals, variances or noise components")
    res = None if residual is None else np.asarray(residual, dtype=np.float64).reshape(-1)
    return tiles_a, times_a, res, var_a, comp


def urban_groups(urban: Any) -> np.ndarray:
    """Tile groups ``"urban"`` / ``"rural"`` from an urban flag per row (True: urban)."""
    return np.where(np.asarray(urban, dtype=bool).reshape(-1), "urban", "rural")


def _group_labels(groups: Any, n: int, *, what: str) -> np.ndarray:
    """One group label per row (``"all"`` when ``groups`` is None)."""
    if groups is None:
        return np.full(n, ALL)
    labels = np.asarray(groups).astype(str).reshape(-1)
    if labels.size != n:
        raise ValueError(f"{what}: {labels.size} group labels for {n} rows")
    return labels


def _group_codes(labels: np.ndarray, names: Sequence[str], *, what: str) -> np.ndarray:
    """Position of each label in ``names`` (a :class:`DataError` names unknown ones)."""
    names_a = np.asarray(names, dtype=str)
    code = np.searchsorted(names_a, labels).clip(0, max(names_a.size - 1, 0))
    bad = names_a[code] != labels if names_a.size else np.ones(labels.size, dtype=bool)
    if bad.any():
        raise DataError(
            f"{what}: tile group(s) {sorted(set(labels[bad].tolist()))} are not among the "
            f"fitted groups {list(names)}; pass the groups the tile effect was fitted with"
        )
    return code


def holdout_rows(
    tiles: Any,
    *,
    seed: int = 0,
    share: float = HOLDOUT_SHARE,
    floor: int = HOLDOUT_FLOOR,
) -> np.ndarray:
    """A training hold-out for the tile effect's parameters (bool mask over the rows).

    Of the ``M`` tiles with 2 or more rows, ``max(round(share * M), min(floor, M // 2))`` (at
    least 1) are drawn with ``default_rng(seed)``, and one row of each, drawn the same way, is
    held out: predicted from its tile's other rows it plays the part of a validation row with a
    measured tile (on tile and block splits no validation tile has training rows). Tiles with
    one row never give a row.
    """
    ids = tile_id_strings(tiles).reshape(-1)
    _, inv, counts = np.unique(ids, return_inverse=True, return_counts=True)
    multi = np.flatnonzero(counts >= 2)
    mask = np.zeros(ids.size, dtype=bool)
    if multi.size == 0:
        return mask
    rng = np.random.default_rng(seed)
    size = min(multi.size, max(1, round(share * multi.size), min(floor, multi.size // 2)))
    chosen = rng.choice(multi, size=size, replace=False)
    order = rng.permutation(ids.size)  # a random row of each chosen tile: its first in order
    picked = np.isin(inv[order], chosen)
    _, first = np.unique(inv[order][picked], return_index=True)
    mask[order[picked][first]] = True
    return mask


def choose_objective(tiles: Any, tiles_val: Any, *, seed: int = 0) -> tuple[str, np.ndarray]:
    """Which rows choose the tile effect's parameters.

    ``("validation", mask)`` with ``mask`` all true over the validation rows when at least
    :data:`MIN_OBJECTIVE_ROWS` of them have a tile with training rows; else ``("training
    hold-out", mask)`` with ``mask`` over the training rows (:func:`holdout_rows`): on tile and
    block splits, where no validation tile has training rows. Fewer than
    :data:`MIN_HOLDOUT_ROWS` true rows mean the tile effect cannot be fitted.
    """
    ids = tile_id_strings(tiles).reshape(-1)
    ids_val = tile_id_strings(tiles_val).reshape(-1)
    if int(np.isin(ids_val, ids).sum()) >= MIN_OBJECTIVE_ROWS:
        return "validation", np.ones(ids_val.size, dtype=bool)
    return "training hold-out", holdout_rows(ids, seed=seed)


class TileEffect:
    """A fitted tile effect: parameters plus the conditioning rows it predicts from.

    Build it with :meth:`fit`; add rows seen later (e.g. the validation split) with
    :meth:`with_rows`; persist with :meth:`save` / :meth:`load`.
    """

    def __init__(
        self,
        params: TileEffectParameters,
        *,
        tiles: np.ndarray,
        times: np.ndarray,
        residual: np.ndarray,
        var_f: np.ndarray,
        components: np.ndarray,
        groups: Any = None,
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.params = params
        self.max_rows = int(max_rows)
        self.tiles, self.times, res, self.var_f, self.components = _as_rows(
            tiles, times, residual, var_f, components, what="tile effect rows"
        )
        self.residual = np.asarray(res)
        self.groups = _group_labels(groups, self.tiles.size, what="tile effect rows")
        self._group_code = _group_codes(self.groups, params.groups, what="tile effect rows")
        if self.components.shape[1] != len(params.components):
            raise ValueError(
                f"{self.components.shape[1]} noise components given, parameters name "
                f"{len(params.components)}: {params.components}"
            )
        self._layout_cache: _Layout | None = None

    @property
    def unseen_latent_scale(self) -> float:
        """``lambda`` of an unmeasured tile's prior as :func:`split_unseen_prior` splits it:
        1 under :data:`UNSEEN_GP` (the GP's prior holds all of ``v_f``), else the fitted
        ``latent_scale``."""
        return 1.0 if self.params.unseen_prior == UNSEEN_GP else float(self.params.latent_scale)

    @property
    def grouped(self) -> bool:
        """Whether the effect has a ``tau²`` per group (then :meth:`predict` needs groups)."""
        return self.params.groups != (ALL,)

    def _tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        p = self.params
        return (
            torch.tensor(list(p.tau2.values()), dtype=_DT),
            torch.tensor(p.rho, dtype=_DT),
            torch.tensor(p.latent_scale, dtype=_DT),
            torch.tensor(p.noise_scale, dtype=_DT),
        )

    @property
    def persistent(self) -> torch.Tensor:
        """``mu_k`` as a tensor (:class:`TileEffectParameters`'s ``persistent_scale``)."""
        return torch.tensor(self.params.persistent_scale, dtype=_DT)

    def _rows(self, *rows: Any, groups: Any, what: str) -> tuple[np.ndarray, ...]:
        """Rows to predict or score with this effect: ``(tiles, times, residual, var_f,
        components)`` as :func:`_as_rows`, then each row's group code among the effect's
        groups and its tile's slot in the layout (-1: no conditioning rows)."""
        arrays = _as_rows(*rows, what=what, categorical_ok=True)
        if groups is None and self.grouped:
            raise ValueError(
                f"this tile effect has a tau² per group {list(self.params.groups)}: give groups"
            )
        labels = _group_labels(groups, len(arrays[0]), what=what)
        code = _group_codes(labels, self.params.groups, what=what)
        return (*arrays, code, _slots(self._layout(), arrays[0]))

    def tests_shift(self, components: Any) -> np.ndarray:
        """``sum_k gamma_k (c_k - c0_k)`` of rows with noise ``components`` (n, k)."""
        p = self.params
        return tests_mean_shift(components, p.tests_shift or (), p.tests_centre or ())

    def _layout(self) -> _Layout:
        if self._layout_cache is None:
            self._layout_cache = _layout(
                self.tiles,
                self.times,
                self.residual,
                self.var_f,
                self.components,
                self._group_code,
                max_rows=self.max_rows,
            )
        return self._layout_cache

    @classmethod
    def fit(
        cls,
        *,
        tiles: Any,
        times: Any,
        residual: Any,
        var_f: Any,
        components: Any,
        val_tiles: Any,
        val_times: Any,
        val_residual: Any,
        val_var_f: Any,
        val_components: Any,
        component_names: Sequence[str],
        groups: Any = None,
        val_groups: Any = None,
        max_rows: int = MAX_ROWS,
        max_iter: int = 100,
        persistent: bool = False,
        tests_mean: bool = True,
        fewer_tests_lower: bool = True,
    ) -> TileEffect:
        """Choose ``(tau², rho, lambda, kappa, gamma)`` by the validation NLL of rows predicted
        from their tile's training rows, and return the tile effect conditioned on the training
        rows.

        Parameters
        ----------
        tiles, times, residual, var_f, components
            Training rows: tile id, time step (e.g. the quarter index), residual
            ``y - m(x)``, the GP's latent variance and its noise components (n, k) (they sum
            to the GP's noise variance).
        val_tiles, val_times, val_residual, val_var_f, val_components
            The same for the validation rows (the objective).
        component_names
            Names of the k noise components.
        groups, val_groups
            Optional group label of each training / validation row (e.g. :func:`urban_groups`):
            one ``tau²`` per group. Every group needs validation rows. A tile's group is that of
            its latest row.
        max_rows
            At most this many latest rows per tile condition the offset.
        max_iter
            L-BFGS iterations.
        persistent
            Also fit ``mu``, the testers' persistent share of the ``meas``/``dev`` noise
            components (off by default: docs/decisions/local_layer.md, "Busy tiles").
        tests_mean
            Also fit ``gamma``, the move of a row's mean with its ``meas``/``dev`` noise
            components around their training mean ``c0`` (:class:`TileEffectParameters`).
        fewer_tests_lower
            A speed target: a ``gamma`` that puts rows of fewer tests above rows of more
            (:func:`tests_shift_is_plausible`) is dropped with a warning and the effect fitted
            without it. ``False`` for latency, whose quiet tiles are the slower places while
            the log of an average of fewer tests sits lower, so either sign is plausible.

        Returns
        -------
        TileEffect
            Conditioned on the training rows; :meth:`with_rows` adds the validation rows.
        """
        train = _as_rows(tiles, times, residual, var_f, components, what="training rows")
        val = _as_rows(
            val_tiles, val_times, val_residual, val_var_f, val_components, what="validation rows"
        )
        if val[0].size == 0:
            raise DataError("the tile effect is chosen by validation NLL: give validation rows")
        names = tuple(str(c) for c in component_names)
        if train[4].shape[1] != len(names) or val[4].shape[1] != len(names):
            raise ValueError(f"noise components must have {len(names)} columns: {names}")
        if (groups is None) != (val_groups is None):
            raise ValueError(
                "give groups for both the training and the validation rows, or neither"
            )
        g_train = _group_labels(groups, train[0].size, what="training rows")
        g_val = _group_labels(val_groups, val[0].size, what="validation rows")
        group_names = tuple(sorted(set(g_train.tolist()) | set(g_val.tolist())))
        missing = sorted(set(group_names) - set(g_val.tolist()))
        if missing:
            raise DataError(
                f"tile group(s) {missing} have no validation rows, so their tau² cannot be "
                "chosen; fit without groups or give each group validation rows"
            )
        code_train = _group_codes(g_train, group_names, what="training rows")
        code_val = torch.as_tensor(_group_codes(g_val, group_names, what="validation rows"))
        # only the tiles with validation rows enter the objective
        used = np.isin(train[0], val[0])
        t_tiles, t_times, t_res, t_var, t_comp = (np.asarray(a)[used] for a in train)
        lay = _layout(t_tiles, t_times, t_res, t_var, t_comp, code_train[used], max_rows=max_rows)
        slot = _slots(lay.tiles, val[0])
        vt, vr, vvf, vc = (torch.as_tensor(a, dtype=_DT) for a in val[1:])
        floor_share = float(np.mean(train[4][:, 0])) if names else 0.1
        n_g = len(group_names)
        n_k = len(names)
        lasting = torch.tensor(
            [persistent and n in PERSISTENT_COMPONENTS for n in names], dtype=torch.bool
        )
        centre = tuple(float(c) for c in train[4].mean(0)) if train[0].size else (0.0,) * n_k

        def optimise(shift_on: bool) -> tuple[Any, ...]:
            """The parameters minimising the objective, with ``gamma`` fitted (``shift_on``)
            or held at 0; then the objective there and without any tile effect."""
            moving = torch.tensor([shift_on and n in TESTS_COMPONENTS for n in names])
            # tau² per group, rho, lambda, kappa, mu, gamma: half the floor in the offset, rho
            # 0.9, the noise as is, a tenth of it persistent, no shift
            raw = torch.tensor(
                [math.log(max(0.5 * floor_share, 1e-6))] * n_g
                + [math.log(0.9 / 0.1), 0.0]
                + [0.0] * n_k
                + [math.log(0.1)] * n_k
                + [0.0] * n_k,
                dtype=_DT,
                requires_grad=True,
            )

            # bounds keep K + E finite where the objective flattens out (e.g. lambda -> inf is the
            # unshrunk per-tile mean when every validation tile has training rows)
            scale = max(float(np.var(train[2])), 1e-12)
            log_tau2 = (math.log(1e-8 * scale), math.log(100.0 * scale))

            def unpack(p: torch.Tensor) -> tuple[torch.Tensor, ...]:
                tau2 = torch.exp(p[:n_g].clamp(*log_tau2))
                rho = torch.sigmoid(p[n_g]).clamp(1e-6, 1.0)
                lam = torch.exp(p[n_g + 1].clamp(math.log(1e-6), math.log(1e3)))
                kappa = torch.exp(p[n_g + 2 : n_g + 2 + n_k].clamp(math.log(1e-8), math.log(1e3)))
                mu_raw = p[n_g + 2 + n_k : n_g + 2 + 2 * n_k]
                mu = torch.exp(mu_raw.clamp(math.log(1e-8), math.log(1e3)))
                gamma = torch.where(moving, p[n_g + 2 + 2 * n_k :], torch.zeros(n_k, dtype=_DT))
                return tau2, rho, lam, kappa, torch.where(lasting, mu, torch.zeros_like(mu)), gamma

            unseen_val = torch.as_tensor(slot < 0)

            def val_nll(p: torch.Tensor) -> torch.Tensor:
                tau2, rho, lam, kappa, mu, gamma = unpack(p)
                L, b = _factor(lay, tau2, rho, lam, kappa, mu=mu)
                shift, tile_var = _predict_tile(
                    lay, L, b, slot, vt, vvf, code_val, tau2=tau2, rho=rho, lam=lam, mu=mu
                )
                noise = (vc * kappa).sum(-1) + unseen_val * (vc * mu).sum(-1)
                # an observation's mean: the tile's, moved by the row's own tests
                moved = shift + tests_mean_shift(vc, gamma, centre)
                return mean_gaussian_nll(vr, moved, tile_var + noise)

            minimize_lbfgs(val_nll, raw, max_iter=max_iter)
            with torch.no_grad():
                tau2, rho, lam, kappa, mu, gamma = unpack(raw)
                best = float(val_nll(raw))
                without = float(mean_gaussian_nll(vr, torch.zeros_like(vr), vvf + vc.sum(-1)))
            return tau2, rho, lam, kappa, mu, gamma, best, without

        tau2, rho, lam, kappa, mu, gamma, best, without = optimise(tests_mean)
        gamma_fit = tuple(float(g) for g in gamma)
        if (
            tests_mean
            and fewer_tests_lower
            and not tests_shift_is_plausible(gamma_fit, names, train[4], centre)
        ):
            log.warning(
                "tile effect: the fitted tests shift gamma %s (%s) puts rows of fewer tests "
                "above rows of more, which Ookla's averages of tests do not do (a GP far from "
                "its data, e.g. trained for few epochs, leaves such residuals); fitted without "
                "the shift",
                [round(g, 3) for g in gamma_fit],
                ", ".join(names),
            )
            dropped: tuple[float, ...] | None = gamma_fit
            tau2, rho, lam, kappa, mu, gamma, best, without = optimise(False)
            gamma_fit = tuple(float(g) for g in gamma)
        else:
            dropped = None
        params = TileEffectParameters(
            tau2={g: float(v) for g, v in zip(group_names, tau2, strict=True)},
            rho=float(rho),
            noise_scale=tuple(float(k) for k in kappa),
            components=names,
            latent_scale=float(lam),
            val_nll=best,
            val_nll_without=without,
            persistent_scale=tuple(float(m) for m in mu),
            tests_shift=gamma_fit,
            tests_centre=centre,
            tests_shift_dropped=dropped,
        )
        return cls(
            params,
            tiles=train[0],
            times=train[1],
            residual=train[2],
            var_f=train[3],
            components=train[4],
            groups=None if groups is None else g_train,
            max_rows=max_rows,
        )

    def with_rows(
        self,
        *,
        tiles: Any,
        times: Any,
        residual: Any,
        var_f: Any,
        components: Any,
        groups: Any = None,
    ) -> TileEffect:
        """A copy that also conditions on these rows (same parameters; ``groups`` as in
        :meth:`fit`)."""
        new = _as_rows(tiles, times, residual, var_f, components, what="added rows")
        return TileEffect(
            self.params,
            tiles=np.concatenate([self.tiles, new[0]]),
            times=np.concatenate([self.times, new[1]]),
            residual=np.concatenate([self.residual, np.asarray(new[2])]),
            var_f=np.concatenate([self.var_f, new[3]]),
            components=np.concatenate([self.components, new[4]]),
            groups=np.concatenate(
                [self.groups, _group_labels(groups, new[0].size, what="added rows")]
            ),
            max_rows=self.max_rows,
        )

    def predict(
        self,
        *,
        tiles: Any,
        times: Any,
        var_f: Any,
        components: Any,
        groups: Any = None,
        chunk_size: int = 8192,
        tile_chunk: int = 4096,
        place_share: float | None = None,
        tile_components: Any = None,
    ) -> TileEffectPrediction:
        """The tile's posterior and the refitted noise at rows (tile, time).

        Add ``shift`` to the GP mean; ``tile_var`` replaces the GP's latent variance (the
        tile's mean speed) and ``tile_var + noise_var`` is the observation's variance. A tile
        without conditioning rows gets ``lambda v_f + c tau²`` (at least ``v_f``, as far as
        ``lambda v_f + tau²`` holds it) and the rest of ``tau²`` goes to its ``noise_var``
        (:func:`split_unseen_prior`; ``c``: ``place_share``, by default the fitted
        ``params.place_share``).

        Parameters
        ----------
        tiles, times
            Tile id and time step of each row.
        var_f
            The GP's latent variance at these rows.
        components
            The GP's noise components at these rows (n, k) (their ``tests``/``devices``).
        groups
            Group label of each row, needed when the effect has more than one group (it sets
            the prior ``tau²`` of a tile without conditioning rows).
        chunk_size
            Rows solved at a time.
        tile_chunk
            Tiles factored at a time (memory: ``tile_chunk * max_rows²`` floats).
        place_share
            The place's share ``c`` of an unmeasured tile's prior, one for every row (default:
            the fitted ones, each row its group's: :func:`row_place_shares`).
        tile_components
            With :data:`UNSEEN_GP` (``params.unseen_prior``): the noise components an
            unmeasured tile's prior is stated at, (n, k) or one row (a map: a typical training
            row's); default the rows' own. Its test adds ``kappa'c`` of the rows' own.
        """
        tiles_a, times_a, _, vf, comp, code, slot = self._rows(
            tiles, times, None, var_f, components, groups=groups, what="prediction rows"
        )
        lay = self._layout()
        tau2, rho, lam, kappa = self._tensors()
        mu = self.persistent
        shift = np.zeros(len(tiles_a))
        tile_var = tau2.numpy()[code] + self.params.latent_scale * vf
        seen_tiles = np.unique(slot[slot >= 0])
        blocks = [
            (seen_tiles[entries[a : a + tile_chunk]], width)
            for entries, width in row_count_groups(lay, seen_tiles)
            for a in range(0, entries.size, tile_chunk)
        ]
        owner = np.full(lay.mask.shape[0] + 1, len(blocks))  # last entry: slot -1
        for i, (block, _) in enumerate(blocks):
            owner[block] = i
        block_rows = rows_of_groups(owner[slot], len(blocks))
        with torch.no_grad():
            for i, (block, width) in enumerate(blocks):
                sub = lay.subset(block, width=width)
                L, b = _factor(sub, tau2, rho, lam, kappa, mu=mu)
                rows = block_rows[i]
                local = np.searchsorted(block, slot[rows])
                for s in range(0, rows.size, chunk_size):
                    part = rows[s : s + chunk_size]
                    m, v = _predict_tile(
                        sub,
                        L,
                        b,
                        local[s : s + chunk_size],
                        torch.as_tensor(times_a[part], dtype=_DT),
                        torch.as_tensor(vf[part], dtype=_DT),
                        torch.as_tensor(code[part]),
                        tau2=tau2,
                        rho=rho,
                        lam=lam,
                        mu=mu,
                    )
                    shift[part], tile_var[part] = m.numpy(), v.numpy()
        gp_prior = self.params.unseen_prior == UNSEEN_GP
        if gp_prior:
            tile_var = with_gp_prior(
                tile_var,
                slot >= 0,
                var_f=vf,
                components=comp,
                tile_components=tile_components,
                kappa=kappa,
            )
        pred = row_prediction(
            shift,
            tile_var,
            comp,
            kappa,
            torch.zeros_like(mu) if gp_prior else mu,
            seen=slot >= 0,
            tests_shift=self.tests_shift(comp),
        )
        share = (
            row_place_shares(
                self.params.place_share,
                self.params.place_share_by_group,
                groups=self.params.groups,
                code=code,
            )
            if place_share is None
            else place_share
        )
        return split_unseen_prior(
            pred, var_f=vf, latent_scale=self.unseen_latent_scale, place_share=share
        )

    def first_rows(self, n: int) -> TileEffect:
        """The same parameters conditioned on the first ``n`` rows only (e.g. the training
        rows of an effect that also holds the validation rows)."""
        return TileEffect(
            self.params,
            tiles=self.tiles[:n],
            times=self.times[:n],
            residual=self.residual[:n],
            var_f=self.var_f[:n],
            components=self.components[:n],
            groups=self.groups[:n] if self.grouped else None,
            max_rows=self.max_rows,
        )


def _latent_and_components(
    model: Any, X: Any, noise: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], np.ndarray]:
    """The model's latent mean and variance at ``X`` and its noise components."""
    pred = model.predict_dist(X, quantity="latent", **noise)
    names, comp = model.noise_components(n=len(pred), **noise)
    return pred.mean, pred.var_f, names, comp


def fit_tile_effect(
    model: Any,
    *,
    X: Any,
    y: Any,
    tiles: Any,
    times: Any,
    X_val: Any,
    y_val: Any,
    tiles_val: Any,
    times_val: Any,
    noise: dict[str, Any] | None = None,
    noise_val: dict[str, Any] | None = None,
    groups: Any = None,
    groups_val: Any = None,
    max_rows: int = MAX_ROWS,
    seed: int = 0,
    persistent: bool = False,
    tests_mean: bool = True,
    fewer_tests_lower: bool = True,
) -> TileEffect:
    """Fit a tile effect on top of a fitted estimator, conditioned on train and validation rows.

    The residuals ``y - m(x)``, latent variances and noise components of the training rows
    (from ``model.predict_dist(..., quantity="latent")`` and ``model.noise_components``) condition
    the offsets; ``(tau², rho, kappa)`` minimise the validation NLL (:meth:`TileEffect.fit`);
    the validation rows are then added to the conditioning rows (:meth:`TileEffect.with_rows`).
    When fewer than :data:`MIN_OBJECTIVE_ROWS` validation rows have a tile with training rows
    (tile and block splits), the parameters are chosen on a hold-out of the training rows
    instead (:func:`choose_objective`), each predicted from its tile's other training rows; the
    effect is then conditioned on all training rows and the validation rows alike.
    ``params.objective`` and ``params.objective_rows`` record which rows chose them.

    Parameters
    ----------
    model
        A fitted :class:`geodbk.DBKRegressor` (or anything with the same ``predict_dist`` and
        ``noise_components``).
    X, y, tiles, times
        Training inputs, targets, tile ids and time steps (e.g. quarter indices).
    X_val, y_val, tiles_val, times_val
        The same for the validation split.
    noise, noise_val
        ``predict_dist`` keywords of each split's noise covariates (``tests``, ``devices``,
        ``urban``; see :func:`geodbk.predictive.noise_kwargs`).
    groups, groups_val
        Optional tile group of each row of each split (e.g. :func:`urban_groups`): one
        ``tau²`` per group.
    max_rows
        Latest rows per tile that condition its offset.
    seed
        Seed of the training hold-out.
    persistent
        Also fit the testers' persistent share ``mu`` (:meth:`TileEffect.fit`).
    tests_mean
        Also fit the rows' mean shift with their tests ``gamma`` (:meth:`TileEffect.fit`).
    fewer_tests_lower
        Drop a shift that puts rows of fewer tests above rows of more (a speed target;
        ``False`` for latency: :meth:`TileEffect.fit`).

    Raises
    ------
    DataError
        When neither objective has :data:`MIN_HOLDOUT_ROWS` rows.
    """
    m, vf, names, comp = _latent_and_components(model, X, noise or {})
    mv, vfv, _, compv = _latent_and_components(model, X_val, noise_val or {})
    r = np.asarray(y, dtype=np.float64) - m
    rv = np.asarray(y_val, dtype=np.float64) - mv
    tiles_a = tile_id_strings(tiles)
    tiles_v = tile_id_strings(tiles_val)
    times_a = np.asarray(times, dtype=np.float64)
    groups_a = None if groups is None else np.asarray(groups).astype(str)
    objective, chosen = choose_objective(tiles_a, tiles_v, seed=seed)
    if chosen.sum() < MIN_HOLDOUT_ROWS:
        raise DataError(
            f"the tile effect needs rows of measured tiles to choose its parameters: "
            f"{int(np.isin(tiles_v, tiles_a).sum())} validation rows have a tile with training "
            f"rows and a hold-out of the training tiles with 2+ rows gives {int(chosen.sum())} "
            f"(at least {MIN_HOLDOUT_ROWS} needed); train with --no-tile-effect, or ingest more "
            "quarters"
        )
    if objective == "validation":
        fit_rows = np.ones(tiles_a.size, dtype=bool)
        obj = (tiles_v, np.asarray(times_val, dtype=np.float64), rv, vfv, compv)
        obj_groups = groups_val
    else:
        fit_rows = ~chosen
        obj = (tiles_a[chosen], times_a[chosen], r[chosen], vf[chosen], comp[chosen])
        obj_groups = None if groups_a is None else groups_a[chosen]
    fitted = TileEffect.fit(
        tiles=tiles_a[fit_rows],
        times=times_a[fit_rows],
        residual=r[fit_rows],
        var_f=vf[fit_rows],
        components=comp[fit_rows],
        val_tiles=obj[0],
        val_times=obj[1],
        val_residual=obj[2],
        val_var_f=obj[3],
        val_components=obj[4],
        component_names=names,
        groups=None if groups_a is None else groups_a[fit_rows],
        val_groups=obj_groups,
        max_rows=max_rows,
        persistent=persistent,
        tests_mean=tests_mean,
        fewer_tests_lower=fewer_tests_lower,
    )
    params = dataclasses.replace(
        fitted.params, objective=objective, objective_rows=int(obj[0].size)
    )
    effect = TileEffect(
        params,
        tiles=tiles_a,
        times=times_a,
        residual=r,
        var_f=vf,
        components=comp,
        groups=groups_a,
        max_rows=max_rows,
    )
    return effect.with_rows(
        tiles=tiles_val,
        times=times_val,
        residual=rv,
        var_f=vfv,
        components=compv,
        groups=groups_val,
    )


def predict_with_tile_effect(
    model: Any,
    effect: TileEffect,
    X: Any,
    *,
    tiles: Any,
    times: Any,
    noise: dict[str, Any] | None = None,
    groups: Any = None,
    quantity: str = "observation",
    chunk_size: int = 65536,
) -> Any:
    """The model's prediction with the tile effect: a :class:`geodbk.predictive.Prediction`.

    ``mean = m(x) + shift``, ``var_f = tile_var`` (the tile's mean speed: the GP's error and
    the offset given the tile's history) and, for ``quantity="observation"``, the rows' tests'
    shift added to the mean and ``var = var_f + s2'`` with the refitted noise
    ``s2' = sum_k kappa_k c_k`` of the rows' ``tests``/``devices``; for ``"latent"``,
    ``var = var_f``. ``groups``: each row's tile group
    (needed when the effect has a ``tau²`` per group).
    """

    kw = noise or {}
    pred = model.predict_dist(X, quantity="latent", chunk_size=chunk_size, **kw)
    _, comp = model.noise_components(n=len(pred), **kw)
    part = effect.predict(
        tiles=tiles, times=times, var_f=pred.var_f, components=comp, groups=groups
    )
    if quantity == "observation":
        mean, var = pred.mean + part.observation_shift, part.tile_var + part.noise_var
        return Prediction(mean=mean, var=var, var_f=part.tile_var)
    return Prediction(mean=pred.mean + part.shift, var=part.tile_var.copy(), var_f=part.tile_var)


def choose_unseen_prior(
    effect: TileEffect,
    *,
    tiles: Any,
    times: Any,
    residual: Any,
    var_f: Any,
    components: Any,
    groups: Any = None,
) -> TileEffect:
    """``effect`` (a copy sharing its rows) with the prior of a tile without conditioning rows
    chosen by the NLL of the given validation rows (``residual`` = y minus the GP mean):
    :data:`UNSEEN_GP` when it beats :data:`UNSEEN_EFFECT` by more than
    :data:`UNSEEN_GP_MARGIN` nats a row, both NLLs recorded in ``params.val_nll_unseen``;
    ``effect`` as it is when fewer than :data:`MIN_OBJECTIVE_ROWS` of the rows have an
    unmeasured tile (rows of measured tiles are the same under both). Each row is an
    observation (mean moved by its tests' shift, variance ``tile_var + noise_var`` at its own
    tests); the prior has no parameter to fit, so nothing else changes."""
    rows = {"tiles": tiles, "times": times, "var_f": var_f, "components": components}
    r = np.asarray(residual, dtype=np.float64)
    scores = {}
    for prior in (UNSEEN_EFFECT, UNSEEN_GP):
        trial = copy.copy(effect)
        trial.params = dataclasses.replace(effect.params, unseen_prior=prior, val_nll_unseen=None)
        p = trial.predict(**rows, groups=groups, place_share=1.0)
        if int((~np.asarray(p.seen)).sum()) < MIN_OBJECTIVE_ROWS:
            return effect
        scores[prior] = gaussian_nll(r, p.observation_shift, p.tile_var + p.noise_var)
    prior = UNSEEN_EFFECT
    if scores[UNSEEN_GP] < scores[UNSEEN_EFFECT] - UNSEEN_GP_MARGIN:
        prior = UNSEEN_GP
    chosen = copy.copy(effect)
    chosen.params = dataclasses.replace(effect.params, unseen_prior=prior, val_nll_unseen=scores)
    return chosen
