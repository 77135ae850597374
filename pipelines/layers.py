"""The local layer's run-directory side: fit it after training, save it, load it for maps.

The layer (:class:`geodbk.local_layer.LocalLayer`) sits on the model's tile effect. It is fitted
by :func:`fit_run_local_layer` on the validation rows (each predicted from its own tile's
training rows and its nearest measured tiles'), then conditioned on the training and
validation rows like the tile effect, and saved as ``models/TARGET/local_layer.json`` (its
parameters; the rows are the tile effect's). Tile positions are the centres of the zoom-16
quadkeys, in km on the projection centred at the training tiles' mean latitude.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.atomic import atomic_write_json
from geodbk.errors import ModelFileError
from geodbk.geo.contract import Z95
from geodbk.geo.frame import longitude_arc
from geodbk.geo.quadkey import quadkey_centroid
from geodbk.local_layer import (
    NEIGHBOURS,
    RANGE_BOUNDS_KM,
    UNSEEN_EFFECT,
    UNSEEN_GP,
    LocalLayer,
    SpatialParameters,
    lonlat_to_km,
    range_at_bound,
)
from geodbk.metrics import gaussian_nll
from geodbk.tile_effect import (
    MAX_PLACE_SHARE,
    TileEffect,
    choose_unseen_prior,
    split_unseen_prior,
)
from pipelines.bundles import load_tile_effect
from pipelines.map_calibration import MIN_TESTS, tile_level_errors

log = logging.getLogger("geodbk")

__all__ = [
    "LAYER_FILE",
    "PlaceShare",
    "ValidationRows",
    "certifies",
    "choose_place_share",
    "first_covering_share",
    "fit_local_layer",
    "fit_run_local_layer",
    "load_local_layer",
    "load_map_layers",
    "place_share_coverage",
    "save_local_layer",
    "tile_positions",
    "validation_share_coverage",
    "validation_tile_levels",
    "with_effect_place_share",
]

LAYER_FILE = "local_layer.json"
#: Place shares tried, ascending (:func:`choose_place_share`): 0.05 to 1 by 0.05, then wider
#: to :data:`~geodbk.tile_effect.MAX_PLACE_SHARE`, where the whole prior covers too few.
_NARROWER = tuple(round(0.05 * k, 2) for k in range(1, 21))
PLACE_SHARES = (*_NARROWER, 1.25, 1.5, 1.75, 2.0, 2.5, MAX_PLACE_SHARE)
#: Coverage of well-measured tiles' levels the chosen place share aims at; on validation tiles
#: in ``K`` held-out units it must cover ``PLACE_COVERAGE (K + 1) / K`` of a unit's tiles on
#: average over the units (:func:`required_coverage`).
PLACE_COVERAGE = 0.95
#: Held-out units below which the conformal count asks a share to cover all of them, or all
#: but part of one unit's tiles (``ceil(0.95 (K + 1)) = K``): the chosen share errs wide.
FEW_PLACE_UNITS = 39
#: Validation tiles without training rows and with MIN_TESTS+ tests needed to choose it.
MIN_PLACE_TILES = 30
#: Held-out units those tiles must lie in for a share other than 1: the fewest ``K`` with
#: ``PLACE_COVERAGE (K + 1) / K <= 1`` (:func:`required_coverage`), 19.
MIN_PLACE_UNITS = math.ceil(PLACE_COVERAGE / (1.0 - PLACE_COVERAGE) - 1e-9)


def tile_positions(tiles: Any, *, lat0: float, lon0: float | None = None) -> np.ndarray:
    """``(n, 2)`` km positions of the tiles' centres (:func:`geodbk.local_layer.lonlat_to_km`);
    ``tiles``: quadkeys or :func:`geodbk.geo.quadkey.tile_keys`."""
    ids = np.asarray(tiles)
    lon, lat = quadkey_centroid(ids if ids.dtype.kind in "iu" else ids.astype(str))
    return lonlat_to_km(lon, lat, lat0=lat0, lon0=lon0)


def _positions_of(lat0: float, lon0: float | None) -> Callable[[np.ndarray], np.ndarray]:
    """Tile ids (quadkeys or tile keys) -> km positions on the projection at ``lat0``
    (``lon0``)."""

    def positions(tiles: np.ndarray) -> np.ndarray:
        return tile_positions(tiles, lat0=lat0, lon0=lon0)

    return positions


def _effect_positions(effect: Any, lat0: float, lon0: float | None) -> np.ndarray:
    return tile_positions(effect._layout().tiles, lat0=lat0, lon0=lon0)


@dataclass(frozen=True)
class ValidationRows:
    """A run's validation rows as the post-fit steps read them.

    Attributes
    ----------
    X, y
        Model inputs and log10 targets.
    tiles, times
        Quadkeys and quarter indices.
    noise
        The model's noise covariates (``tests``, ``devices``, ``urban`` as it takes them).
    groups
        The tile effect's group of each row (``None``: one group).
    tests, urban
        Tests and urban flag of each row, for the place share (``None``: it stays 1).
    units
        The held-out unit of each row for the place share: rows of one unit were held out
        together (a block of a block split; :func:`geodbk.geo.blocks.held_out_units`).
        ``None``: each tile is its own unit.
    """

    X: np.ndarray
    y: np.ndarray
    tiles: np.ndarray
    times: np.ndarray
    noise: dict[str, Any]
    groups: np.ndarray | None = None
    tests: np.ndarray | None = None
    urban: np.ndarray | None = None
    units: np.ndarray | None = None


def _gp_at(model: Any, val: ValidationRows) -> tuple[Any, np.ndarray]:
    """The GP's latent prediction and noise components at the validation rows."""
    pred = model.predict_dist(val.X, quantity="latent", **val.noise)
    _, comp = model.noise_components(n=len(pred), **val.noise)
    return pred, comp


def fit_run_local_layer(
    model: Any,
    effect: Any,
    *,
    n_train: int,
    val: ValidationRows,
    neighbours: int = NEIGHBOURS,
) -> LocalLayer:
    """Fit the local layer on top of ``effect`` (conditioned on the training rows, then the
    validation rows: its first ``n_train`` rows are the training rows) and return it
    conditioned on all of ``effect``'s rows. With ``val.tests`` and ``val.urban`` the place
    share of an unmeasured tile's prior is chosen on the validation tiles
    (:func:`choose_place_share`); without them it stays 1. ``neighbours``: the measured tiles
    that krige the field at a place."""
    pred, comp = _gp_at(model, val)
    return fit_local_layer(
        effect, n_train=n_train, val=val, pred=pred, components=comp, neighbours=neighbours
    )


def fit_local_layer(
    effect: Any,
    *,
    n_train: int,
    val: ValidationRows,
    pred: Any,
    components: np.ndarray,
    fit_rho: bool = True,
    neighbours: int = NEIGHBOURS,
) -> LocalLayer:
    """:func:`fit_run_local_layer` from the GP's latent prediction ``pred`` (``mean``,
    ``var_f``) and noise ``components`` at the validation rows (``val.X`` and ``val.noise``
    are not read); ``fit_rho=False`` keeps the tile effect's rho
    (:meth:`geodbk.local_layer.LocalLayer.fit`)."""
    train_effect = effect.first_rows(n_train)
    lon, lat = quadkey_centroid(np.asarray(train_effect.tiles).astype(str))
    lat0 = float(np.mean(lat)) if len(lat) else 0.0
    lon0 = 0.5 * sum(longitude_arc(lon)) if len(lon) else 0.0  # the tiles' arc's middle
    val_xy = tile_positions(val.tiles, lat0=lat0, lon0=lon0)
    layer = LocalLayer.fit(
        train_effect,
        tile_xy=_effect_positions(train_effect, lat0, lon0),
        val_tiles=val.tiles,
        val_xy=val_xy,
        val_times=val.times,
        val_residual=np.asarray(val.y, dtype=np.float64) - pred.mean,
        val_var_f=pred.var_f,
        val_components=components,
        val_groups=val.groups,
        lat0=lat0,
        lon0=lon0,
        fit_rho=fit_rho,
        neighbours=neighbours,
    )
    full, fresh = _left_out_scoring(layer, effect, n_train=n_train, val=val)
    choice = _share_on(full, val, pred, components, fresh=fresh)
    gp_nll = gaussian_nll(
        np.asarray(val.y, dtype=np.float64),
        np.asarray(pred.mean, dtype=np.float64),
        np.asarray(pred.var_f, dtype=np.float64) + np.asarray(components).sum(-1),
    )
    layer.params = replace(
        layer.params,
        place_share=choice.share,
        place_share_basis=choice.basis,
        place_share_by_group=choice.by_group,
        val_nll_gp=float(gp_nll),
    )
    log.info(
        "local layer: sigma2 %.4g, range %.2f km, tau2 %s, rho %s, place share %.2f, an "
        "unmeasured tile's prior %s%s; validation NLL %.4f (tile effect alone %.4f, GP alone %.4f)",
        layer.params.sigma2,
        layer.params.range_km,
        layer.params.tau2,
        layer.params.rho or "the tile effect's",
        layer.params.place_share,
        "the GP's" if layer.params.unseen_prior == UNSEEN_GP else "the tile effect's",
        _unseen_scores(layer.params.val_nll_unseen),
        layer.params.val_nll,
        layer.params.val_nll_without,
        gp_nll,
    )
    bound = range_at_bound(layer.params.range_km)
    if bound is not None:
        log.warning(
            "local layer: the field's range reached its bound of %g km with %d neighbours, so "
            "it is not a short-range field of tile offsets (%s); check the test NLL against "
            "the tile effect alone (--no-local-layer) or another local_layer_neighbours",
            bound,
            layer.params.neighbours,
            "one offset shared by every neighbour"
            if bound == max(RANGE_BOUNDS_KM)
            else "white noise per tile",
        )
    return layer.with_effect(
        effect,
        tile_xy=_effect_positions(effect, lat0, lon0),
        positions=_positions_of(lat0, lon0),
    )


def _unseen_scores(scores: dict[str, float] | None) -> str:
    """`` (validation NLL: the GP's 0.3533, the tile effect's 0.3903)``,
    or nothing when only one prior was tried."""
    if not scores:
        return ""
    return (
        f" (validation NLL: the GP's {scores[UNSEEN_GP]:.4f}, "
        f"the tile effect's {scores[UNSEEN_EFFECT]:.4f})"
    )


def validation_share_coverage(
    model: Any,
    layer: LocalLayer,
    *,
    n_train: int,
    val: ValidationRows,
    counted_by: np.ndarray | None = None,
    own_testers: bool = False,
) -> dict[str, Any]:
    """:func:`place_share_coverage` of the validation tiles without training rows, each
    scored from ``layer``'s other conditioning rows (:func:`_left_out_scoring`; its tile
    effect's first ``n_train`` rows are the training rows), as :func:`fit_run_local_layer`
    chooses the place share. ``counted_by``: a unit per validation row to count the tiles by
    instead of their held-out units (e.g. places). Each unmeasured tile is stated as a map
    states it and the share is chosen, at a typical training row's tests; ``own_testers``: at
    its rows' own. Needs ``val.tests`` and ``val.urban``."""
    full, fresh, rows = _validation_scoring(model, layer, n_train=n_train, val=val)
    if counted_by is not None:
        rows["units"] = np.asarray(counted_by)[fresh]
    if own_testers:
        rows["tile_components"] = None
    return place_share_coverage(full, **rows)


def _validation_scoring(
    model: Any, layer: LocalLayer, *, n_train: int, val: ValidationRows
) -> tuple[LocalLayer, np.ndarray, dict[str, Any]]:
    """The layer, the validation rows of tiles without training rows and their rows for
    :func:`place_share_coverage`, scored as :func:`fit_run_local_layer` chooses the place
    share: each left out with its held-out unit, stated as the map draws it."""
    if val.tests is None or val.urban is None:
        raise ValueError("the validation rows need tests and urban flags")
    pred, comp = _gp_at(model, val)
    full, fresh = _left_out_scoring(layer, layer.effect, n_train=n_train, val=val)
    rows = _fresh_share_rows(full, fresh, val, pred, comp)
    rows["tile_components"] = _map_testers(full)
    return full, fresh, rows


def _left_out_scoring(
    layer: LocalLayer, effect: TileEffect, *, n_train: int, val: ValidationRows
) -> tuple[LocalLayer, np.ndarray]:
    """``layer`` conditioned on all of ``effect``'s rows (its first ``n_train`` the training
    rows, then the validation rows) and which validation rows belong to tiles without
    training rows: the tiles the place share is chosen on. Each is scored leaving out its
    held-out unit (its block, else its own tile; :func:`_fresh_share_rows`), from every other
    conditioning row, as a test tile is predicted from the training and validation rows."""
    lat0, lon0 = layer.params.lat0, layer.params.lon0
    full = layer.with_effect(effect, tile_xy=_effect_positions(effect, lat0, lon0))
    trained = np.asarray(effect.first_rows(n_train).tiles).astype(str)
    return full, ~np.isin(np.asarray(val.tiles).astype(str), trained)


def _fresh_share_rows(
    layer: LocalLayer,
    fresh: np.ndarray,
    val: ValidationRows,
    pred: Any,
    components: np.ndarray,
) -> dict[str, Any]:
    """:func:`_share_rows` of the validation rows ``fresh`` (of tiles without training
    rows), with their km positions for ``layer`` and ``leave_out``, their held-out unit."""
    rows = {
        k: None if v is None else np.asarray(v)[fresh]
        for k, v in _share_rows(val, pred, components).items()
    }
    rows["leave_out"] = rows["units"] if rows["units"] is not None else rows["tiles"]
    rows["xy"] = tile_positions(rows["tiles"], lat0=layer.params.lat0, lon0=layer.params.lon0)
    return rows


def _share_rows(val: ValidationRows, pred: Any, components: np.ndarray) -> dict[str, Any]:
    """The rows :func:`place_share_coverage` scores, from the validation rows and the GP's
    latent prediction ``pred`` and noise ``components`` there."""
    return {
        "tiles": val.tiles,
        "times": val.times,
        "y": np.asarray(val.y, dtype=np.float64),
        "mean": pred.mean,
        "var_f": pred.var_f,
        "components": components,
        "groups": val.groups,
        "tests": val.tests,
        "urban": val.urban,
        "units": val.units,
    }


def with_effect_place_share(
    model: Any, effect: TileEffect, *, n_train: int, val: ValidationRows
) -> TileEffect:
    """``effect`` with the prior of an unmeasured tile chosen by the validation rows
    (:func:`geodbk.tile_effect.choose_unseen_prior`) and then its place share on the
    validation tiles without training rows (:func:`choose_place_share`), the effect
    conditioned on its first ``n_train`` rows, the training rows: the tile effect's maps when
    no local layer is fitted; a copy sharing ``effect``'s rows, which stays as it was. Without
    ``val.tests`` and ``val.urban`` the share stays 1."""
    pred, comp = _gp_at(model, val)
    train_effect = effect.first_rows(n_train)
    prior = choose_unseen_prior(
        train_effect,
        tiles=val.tiles,
        times=val.times,
        residual=np.asarray(val.y, dtype=np.float64) - pred.mean,
        var_f=pred.var_f,
        components=comp,
        groups=val.groups,
    ).params
    log.info(
        "tile effect: an unmeasured tile's prior %s%s",
        "the GP's" if prior.unseen_prior == UNSEEN_GP else "the tile effect's",
        _unseen_scores(prior.val_nll_unseen),
    )
    chosen = copy.copy(effect)
    chosen.params = replace(
        effect.params, unseen_prior=prior.unseen_prior, val_nll_unseen=prior.val_nll_unseen
    )
    if val.tests is None or val.urban is None:
        return chosen
    choice = _share_on(chosen.first_rows(n_train), val, pred, comp)
    log.info("tile effect: place share %.2f", choice.share)
    chosen.params = replace(
        chosen.params,
        place_share=choice.share,
        place_share_basis=choice.basis,
        place_share_by_group=choice.by_group,
    )
    return chosen


def _share_on(
    tile_model: LocalLayer | TileEffect,
    val: ValidationRows,
    pred: Any,
    components: np.ndarray,
    *,
    fresh: np.ndarray | None = None,
) -> PlaceShare:
    """:func:`choose_place_share` of ``tile_model`` on the validation rows and the GP's latent
    prediction ``pred`` there; 1 without the rows' tests and urban flags. A local layer (its
    validation rows conditioning it) scores the rows ``fresh`` (:func:`_left_out_scoring`)."""
    if val.tests is None or val.urban is None:
        return PlaceShare(1.0, tiles=0, units=0)
    drawn = {"tile_components": _map_testers(tile_model)}
    if isinstance(tile_model, LocalLayer):
        if fresh is None:
            raise ValueError("a local layer's place share needs the rows it scores (fresh=)")
        return choose_place_share(
            tile_model, **_fresh_share_rows(tile_model, fresh, val, pred, components), **drawn
        )
    return choose_place_share(tile_model, **_share_rows(val, pred, components), **drawn)


def _map_testers(tile_model: LocalLayer | TileEffect) -> Any:
    """The noise components a map states an unmeasured tile at (a typical training row's,
    ``tests_centre``; ``None``, the rows' own, for a model saved without them): the place
    share is chosen on the tile quantity as the map draws it."""
    effect = tile_model.effect if isinstance(tile_model, LocalLayer) else tile_model
    return effect.params.tests_centre


def required_coverage(n_units: int) -> float:
    """The mean over ``K`` held-out units of the share of each unit's scored tiles that a
    place share's intervals must cover: ``0.95 (K + 1) / K``, above 1 (no share certified)
    for ``K < 19``. Hierarchical split conformal: were the units exchangeable and a unit's
    tiles exchangeable within it, a new unit's tile is then covered with probability at
    least 95% (the quantile of the scores weighted ``1 / ((K + 1) n_k)``, with mass
    ``1 / (K + 1)`` at infinity). With one tile per unit it is the split-conformal count,
    ``ceil(0.95 (n + 1))`` of ``n`` tiles (96 of 100)."""
    return PLACE_COVERAGE * (n_units + 1) / n_units


def certifies(tiles: int, units: int) -> bool:
    """Whether ``tiles`` well-measured validation tiles without training rows, held out in
    ``units`` units, can choose a place share other than 1 (:data:`MIN_PLACE_TILES`,
    :data:`MIN_PLACE_UNITS`)."""
    return tiles >= MIN_PLACE_TILES and units >= MIN_PLACE_UNITS


@dataclass(frozen=True)
class PlaceShare:
    """A chosen place share and what chose it: the scored validation tiles and the held-out
    units they lie in (0 and 0: none were scored)."""

    share: float
    tiles: int
    units: int
    by_group: dict[str, float] | None = None

    @property
    def basis(self) -> dict[str, int] | None:
        """``{"tiles", "units"}`` for the saved parameters; ``None`` without scored tiles."""
        return {"tiles": self.tiles, "units": self.units} if self.tiles else None


def choose_place_share(tile_model: LocalLayer | TileEffect, **rows: Any) -> PlaceShare:
    """The smallest place share ``c`` (of :data:`PLACE_SHARES`) whose tile quantity covers
    :func:`required_coverage` of the validation tiles without training rows that have
    ``MIN_TESTS`` tests or more, a unit's tiles counted together (:func:`place_share_coverage`;
    ``rows["units"]``, each tile its own unit by default): below 1 where those tiles' levels
    stray less than the prior says, above 1 where they stray more, and the widest share when
    none covers enough. 1 when fewer than :data:`MIN_PLACE_TILES` such tiles exist (a random
    split: every validation tile is measured) or when they lie in too few units to certify
    any share (a block split with fewer than 19 validation blocks holding them).

    With a tile effect grouped by urban / rural (:func:`geodbk.tile_effect.urban_groups`),
    each group whose own such tiles can certify a share (:func:`certifies_group`) gets its own
    by the same rule on its tiles alone (``by_group``; Mondrian conformal: the count then
    holds within the group); the other groups keep the pooled share."""
    scores = _coverage_of(tile_model, **rows)
    if not certifies(scores.tiles, scores.units):
        if scores.tiles < MIN_PLACE_TILES:
            log.info(
                "place share 1: %d validation tiles without training rows have %d+ tests "
                "(%d needed)",
                scores.tiles,
                MIN_TESTS,
                MIN_PLACE_TILES,
            )
        else:
            log.info(
                "place share 1: the %d validation tiles without training rows that have %d+ "
                "tests lie in %d held-out blocks; another share needs %d",
                scores.tiles,
                MIN_TESTS,
                scores.units,
                MIN_PLACE_UNITS,
            )
        return PlaceShare(1.0, tiles=scores.tiles, units=scores.units)
    share = _smallest_covering_share(scores, what="validation tiles")
    log.info(
        "place share %.2f: the smallest whose intervals cover %.1f%% of the %d validation "
        "tiles without training rows that have %d+ tests, %s%s",
        share,
        100 * required_coverage(scores.units),
        scores.tiles,
        MIN_TESTS,
        "each tile counted once"
        if scores.units == scores.tiles
        else f"averaged over the {scores.units} held-out blocks they lie in",
        f" (with fewer than {FEW_PLACE_UNITS} units the count asks nearly all of them, so "
        "the map's intervals err wide)"
        if scores.units < FEW_PLACE_UNITS
        else "",
    )
    by_group: dict[str, float] = {}
    if _urban_grouped(tile_model):
        for name, flag in (("urban", True), ("rural", False)):
            group = scores.of_group(flag)
            if certifies_group(group.tiles, group.units):
                by_group[name] = _smallest_covering_share(group, what=f"{name} validation tiles")
        if by_group:
            log.info(
                "place share by group: %s (%.2f for any other)",
                ", ".join(f"{g} {c:.2f}" for g, c in by_group.items()),
                share,
            )
    return PlaceShare(share, tiles=scores.tiles, units=scores.units, by_group=by_group or None)


def first_covering_share(unit_coverage: Callable[[float], float], *, units: int) -> float | None:
    """The smallest of :data:`PLACE_SHARES` whose coverage averaged over ``units`` held-out
    units (``unit_coverage(c)``) reaches :func:`required_coverage`; ``None`` when none does."""
    needed = required_coverage(units)
    return next((c for c in PLACE_SHARES if unit_coverage(c) >= needed - 1e-9), None)


def certifies_group(tiles: int, units: int) -> bool:
    """Whether one urban / rural group's ``tiles`` well-measured validation tiles without
    training rows, in ``units`` held-out units, can choose the group's own place share: the
    conformal count's own minimum, :data:`MIN_PLACE_UNITS` units (and so tiles)."""
    return tiles >= MIN_PLACE_UNITS and units >= MIN_PLACE_UNITS


def _urban_grouped(tile_model: LocalLayer | TileEffect) -> bool:
    """Whether the model's tile effect has one ``tau²`` per urban / rural group, so that each
    row's group is known wherever it is predicted."""
    effect = tile_model.effect if isinstance(tile_model, LocalLayer) else tile_model
    return set(effect.params.groups) == {"urban", "rural"}


def _smallest_covering_share(scores: _ShareScores, *, what: str) -> float:
    """The smallest share of :data:`PLACE_SHARES` whose coverage of ``scores``' tiles by unit
    reaches :func:`required_coverage`, else the widest, with a warning (``what`` names the
    tiles)."""
    needed = required_coverage(scores.units)
    share = first_covering_share(scores.unit_coverage, units=scores.units)
    if share is None:
        share = PLACE_SHARES[-1]
        log.warning(
            "place share %.2f: no share covers %.1f%% of the %d %s without training rows "
            "that have %d+ tests (%.1f%% at %.2f); their levels stray from the map more than "
            "the model says",
            share,
            100 * needed,
            scores.tiles,
            what,
            MIN_TESTS,
            100 * scores.unit_coverage(share),
            share,
        )
    return float(share)


def place_share_coverage(tile_model: LocalLayer | TileEffect, **rows: Any) -> dict[str, Any]:
    """How the tile quantity covers the levels of the tiles without conditioning rows that
    have ``MIN_TESTS`` tests or more, at each place share ``c`` of :data:`PLACE_SHARES`
    (``rows`` as for :func:`choose_place_share`): ``{"tiles", "units", "coverage": {c: share
    of the tiles}, "unit_coverage": {c: mean over units of the share of their tiles}}``, the
    curves empty without such tiles."""
    scores = _coverage_of(tile_model, **rows)
    shares = [float(c) for c in PLACE_SHARES] if scores.tiles else []
    return {
        "tiles": scores.tiles,
        "units": scores.units,
        "coverage": {c: scores.coverage(c) for c in shares},
        "unit_coverage": {c: scores.unit_coverage(c) for c in shares},
    }


@dataclass(frozen=True)
class _ShareScores:
    """Scored tiles, the held-out units they lie in, and as functions of the place share the
    share of the tiles covered and the mean over units of the share of their tiles covered;
    ``of_group(urban)``: the same for the urban (``True``) or rural tiles alone."""

    tiles: int
    units: int
    coverage: Callable[[float], float]
    unit_coverage: Callable[[float], float]
    of_group: Callable[[bool], _ShareScores]


def _coverage_of(
    tile_model: LocalLayer | TileEffect,
    *,
    tiles: np.ndarray,
    times: np.ndarray,
    y: np.ndarray,
    mean: np.ndarray,
    var_f: np.ndarray,
    components: np.ndarray,
    groups: np.ndarray | None,
    tests: np.ndarray,
    urban: np.ndarray,
    units: np.ndarray | None = None,
    xy: np.ndarray | None = None,
    leave_out: np.ndarray | None = None,
    tile_components: Any = None,
) -> _ShareScores:
    """The tiles without conditioning rows that have ``MIN_TESTS`` tests or more, their
    held-out units (``units`` per row; each tile its own without it) and whether the tile
    quantity's 95% interval covers each one's level as a function of the place share ``c``
    (:func:`pipelines.map_calibration.tile_level_errors`, as the report's map calibration),
    with ``tile_model`` (a local layer, whose rows need their km positions ``xy``, or a tile
    effect) as it is conditioned (a local layer's rows each leaving out the conditioning rows
    of the tiles of its ``leave_out`` label, :meth:`LocalLayer.predict`, when given); the
    model is predicted once with its whole prior and split at each share as its own
    prediction splits it (``tile_model.unseen_latent_scale``), whatever share ``tile_model``
    holds."""
    part = _whole_prior_prediction(
        tile_model,
        tiles=tiles,
        times=times,
        var_f=var_f,
        components=components,
        groups=groups,
        xy=xy,
        leave_out=leave_out,
        tile_components=tile_components,
    )
    unseen = ~np.asarray(part.seen)
    tile_ids = np.asarray(tiles).astype(str)[unseen]
    unit_of = (
        pd.Series(tile_ids if units is None else np.asarray(units)[unseen], index=tile_ids)
        .groupby(level=0)
        .first()
    )
    scored = {"tiles": tiles, "y": y, "tests": tests, "urban": urban, "mean": mean}

    @functools.cache
    def covered_at(c: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        levels = _unseen_tile_levels(tile_model, part, c, var_f=var_f, **scored)
        covered = np.abs(levels["error"].to_numpy()) <= Z95 * levels["sd"].to_numpy()
        unit = unit_of.loc[levels["tile"].to_numpy()].to_numpy()
        return unit, covered, levels["urban"].to_numpy(bool)

    return _scores_where(covered_at, urban=None)


def _whole_prior_prediction(
    tile_model: LocalLayer | TileEffect,
    *,
    tiles: np.ndarray,
    times: np.ndarray,
    var_f: np.ndarray,
    components: np.ndarray,
    groups: np.ndarray | None,
    xy: np.ndarray | None = None,
    leave_out: np.ndarray | None = None,
    tile_components: Any = None,
    **_: Any,
) -> Any:
    """``tile_model``'s prediction at the rows with an unmeasured tile's whole prior in its
    tile quantity (place share 1), for :func:`_unseen_tile_levels` to split at any share; a
    local layer's rows at ``xy``, each leaving out its ``leave_out`` label's tiles. Other
    keys of a rows dict are ignored."""
    rows: dict[str, Any] = {
        "tiles": tiles,
        "times": times,
        "var_f": var_f,
        "components": components,
        "groups": groups,
        "place_share": 1.0,
        "tile_components": tile_components,
    }
    if isinstance(tile_model, LocalLayer):
        return tile_model.predict(xy=xy, leave_out=leave_out, **rows)
    return tile_model.predict(**rows)


def _unseen_tile_levels(
    tile_model: LocalLayer | TileEffect,
    part: Any,
    c: float,
    *,
    tiles: np.ndarray,
    y: np.ndarray,
    tests: np.ndarray,
    urban: np.ndarray,
    mean: np.ndarray,
    var_f: np.ndarray,
) -> pd.DataFrame:
    """:func:`pipelines.map_calibration.tile_level_errors` of the rows of tiles without
    conditioning rows, from ``tile_model``'s prediction ``part`` there (made with the whole
    prior) split at the place share ``c``."""
    unseen = ~np.asarray(part.seen)
    p = split_unseen_prior(
        part, var_f=var_f, latent_scale=tile_model.unseen_latent_scale, place_share=c
    )
    return tile_level_errors(
        tiles=np.asarray(tiles).astype(str)[unseen],
        y=np.asarray(y)[unseen],
        tests=np.asarray(tests)[unseen],
        urban=np.asarray(urban)[unseen],
        mean=(mean + p.shift)[unseen],
        var=p.tile_var[unseen],
        noise=p.noise_var[unseen],
        persistent=p.persistent_var[unseen],
    )


def validation_tile_levels(
    model: Any, layer: LocalLayer, *, n_train: int, val: ValidationRows, place_share: float
) -> pd.DataFrame:
    """Each well-measured validation tile without training rows, scored as the place share
    is chosen (:func:`validation_share_coverage`, as the map draws it) at ``place_share``:
    its level's error and the error's sd (:func:`pipelines.map_calibration.tile_level_errors`),
    to see which tiles a share leaves uncovered and how wide their intervals are."""
    return validation_tile_levels_at(model, layer, n_train=n_train, val=val)(place_share)


def validation_tile_levels_at(
    model: Any, layer: LocalLayer, *, n_train: int, val: ValidationRows
) -> Callable[[float], pd.DataFrame]:
    """:func:`validation_tile_levels` as a function of the place share, the validation rows
    predicted once (with the whole prior) and split at each share asked for."""
    full, _, rows = _validation_scoring(model, layer, n_train=n_train, val=val)
    part = _whole_prior_prediction(full, **rows)
    scored = {k: rows[k] for k in ("tiles", "y", "tests", "urban", "mean", "var_f")}

    def at(place_share: float) -> pd.DataFrame:
        return _unseen_tile_levels(full, part, place_share, **scored)

    return at


def _scores_where(
    covered_at: Callable[[float], tuple[np.ndarray, np.ndarray, np.ndarray]],
    *,
    urban: bool | None,
) -> _ShareScores:
    """:class:`_ShareScores` of the scored tiles (``covered_at(c)``: each one's unit, whether
    it is covered at ``c`` and its urban flag), all of them or those of one group."""

    def at(c: float) -> tuple[np.ndarray, np.ndarray]:
        unit, covered, flag = covered_at(float(c))
        keep = slice(None) if urban is None else flag == urban
        return unit[keep], covered[keep]

    def coverage(c: float) -> float:
        covered = at(c)[1]
        return float(covered.mean()) if covered.size else 1.0

    def unit_coverage(c: float) -> float:
        unit, covered = at(c)
        if not covered.size:
            return 1.0
        return float(pd.Series(covered).groupby(unit).mean().mean())

    scored = at(1.0)[0]
    return _ShareScores(
        tiles=int(scored.size),
        units=int(np.unique(scored).size),
        coverage=coverage,
        unit_coverage=unit_coverage,
        of_group=lambda flag: _scores_where(covered_at, urban=flag),
    )


def save_local_layer(model_dir: Path, layer: LocalLayer | None) -> None:
    """Write the layer's parameters next to the model, or remove a stale file (``None``)."""
    path = Path(model_dir) / LAYER_FILE
    if layer is None:
        path.unlink(missing_ok=True)
        return
    atomic_write_json(path, layer.params.to_dict())


def load_map_layers(rd: Any, target: str, model: Any) -> tuple[Any, Any]:
    """``(tile effect, local layer)`` saved with ``target``'s model (each ``None`` when the
    model was trained without)."""

    effect = load_tile_effect(rd, target, model)
    md = getattr(model, "metadata_", None) or {}
    layer = load_local_layer(rd.model_dir(target), effect, expected=md.get("local_layer"))
    return effect, layer


def load_local_layer(model_dir: Path, effect: Any, *, expected: dict[str, Any] | None) -> Any:
    """The saved layer on ``effect``, or ``None`` when the model has none (``expected``: the
    model metadata's ``local_layer``, which the file must match)."""
    if expected is None or effect is None:
        return None
    path = Path(model_dir) / LAYER_FILE
    try:
        raw = json.loads(path.read_text())
        params = SpatialParameters.from_dict(raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(
            f"{path} is missing or unreadable ({exc}); retrain the model with `geodbk train`"
        ) from None
    if params.to_dict() != SpatialParameters.from_dict(expected).to_dict():
        raise ModelFileError(
            f"{path} does not belong to this model (another training run wrote it); retrain "
            "with `geodbk train`"
        )
    return LocalLayer(
        effect,
        params,
        tile_xy=_effect_positions(effect, params.lat0, params.lon0),
        positions=_positions_of(params.lat0, params.lon0),
    )
