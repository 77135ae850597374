"""The three quantities a map can show: ``area``, ``tile`` and ``test``.

One fitted model (a GP plus, optionally, its tile effect :class:`geodbk.tile_effect.TileEffect`)
answers three different questions about a place x (units of y, log10 for Ookla targets):

- ``area``: the neighbourhood level ``f(x)``, mean ``m(x)`` and variance ``var_f(x)`` (the
  smooth latent surface);
- ``tile``: what the zoom-16 tile at x typically gets, ``f(x) + u_j(t)`` with the tile's
  offset ``u_j``. With a tile effect, a tile with history has ``mean = m + shift`` and the
  tile variance of :meth:`TileEffect.predict` (its history informs both); a tile without
  history has ``mean = m`` and the prior ``tau²_g + lambda var_f``. With a local layer
  (:mod:`geodbk.local_layer`) the nearest measured tiles also pull the offset and narrow its
  variance through a short-range spatial field. Without a tile effect the
  persistent part of the noise stands in for the offset: ``var = var_f + s2_floor`` (the limit
  of many tests; for a constant-noise model the whole ``s2``);
- ``test``: one new speed test (or the tile average of ``tests`` tests from ``devices``
  devices): the tile's variance plus the observation noise of those tests (the tile effect's
  refitted noise ``sum_k kappa_k c_k`` when there is one, the GP's ``s2(tests)`` otherwise),
  and with a tile effect the tile's mean moved by those tests' shift ``sum_k gamma_k (c_k -
  c0_k)`` (the log of an average of fewer tests sits lower).

So ``var(test) >= var(tile) >= 0`` at every place. ``var(tile)`` can be below ``var(area)``:
a tile's history narrows it, and the tile effect rescales the GP's own variance by ``lambda``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from geodbk.local_layer import LocalLayer
from geodbk.predictive import noise_kwargs
from geodbk.tile_effect import TileEffect, urban_groups

__all__ = [
    "DEFAULT_MAP_QUANTITY",
    "QUANTITIES",
    "QuantityPrediction",
    "check_quantity",
    "describe_quantity",
    "observation_noise_variance",
    "predict_quantity",
]

QUANTITIES: tuple[str, ...] = ("area", "tile", "test")
#: What maps show unless told otherwise.
DEFAULT_MAP_QUANTITY = "tile"


def check_quantity(quantity: str) -> str:
    """``quantity`` if it is one of :data:`QUANTITIES`, else a ``ValueError`` naming them."""
    if quantity not in QUANTITIES:
        raise ValueError(
            f"quantity must be one of {', '.join(QUANTITIES)} (got {quantity!r}): area = the "
            "neighbourhood level f(x), tile = what a tile typically gets, test = one speed test"
        )
    return quantity


@dataclass(frozen=True)
class QuantityPrediction:
    """A quantity's Gaussian distribution at n places and its parts (numpy float64).

    Attributes
    ----------
    quantity
        ``area``, ``tile`` or ``test``.
    mean, var
        Mean and variance of the quantity.
    area_mean, area_var
        The GP's ``m(x)`` and ``var_f(x)`` (the ``area`` quantity).
    offset
        Posterior mean of the tile's offset added to ``m`` (0 without tile history or local
        layer).
    pull
        The neighbouring tiles' part of ``offset`` (the local layer's kriged spatial field;
        0 without one).
    tile_var
        Variance of the ``tile`` quantity.
    noise_var
        Observation noise of the asked-for tests (``var(test) - var(tile)``).
    persistent_var
        The part of ``noise_var`` that the testers of a tile without history carry across
        quarters (the tile effect's ``sum_k mu_k c_k``; 0 at measured tiles, whose offset holds
        it, and without a tile effect).
    seen
        Whether the place's tile has history in the tile effect.
    tile_basis
        How ``tile_var`` was obtained: ``"local layer"``, ``"tile effect"`` or ``"noise
        floor"`` (no tile effect).
    tests_shift
        How far the asked-for tests move one test's mean from the tile's, ``sum_k gamma_k
        (c_k - c0_k)`` (the tile effect's; 0 without one): part of the ``test`` quantity's
        mean, not of the ``tile``'s.
    """

    quantity: str
    mean: np.ndarray
    var: np.ndarray
    area_mean: np.ndarray
    area_var: np.ndarray
    offset: np.ndarray
    pull: np.ndarray
    tile_var: np.ndarray
    noise_var: np.ndarray
    seen: np.ndarray
    tile_basis: str
    persistent_var: np.ndarray | None = None
    tests_shift: np.ndarray | None = None

    @property
    def sd(self) -> np.ndarray:
        """Standard deviation of the quantity."""
        return np.sqrt(self.var)

    def __len__(self) -> int:
        return int(self.mean.shape[0])


def _floor_variance(names: tuple[str, ...], comp: np.ndarray) -> np.ndarray:
    """The persistent noise term: the ``floor`` component, or all of a constant noise."""
    if "floor" in names:
        return comp[:, names.index("floor")]
    return comp.sum(axis=1)


def _noise_parts(
    model: Any, n: int, *, effect: TileEffect | None, noise_kw: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(components (n, k), tile part (n,), test part (n,))`` of the model's noise.

    Without a tile effect the tile part is the floor and the test part the rest of the
    noise; with one, the tile part is 0 (the effect's own variance holds it) and the test
    part the refitted noise ``sum_k kappa_k c_k``."""
    names, comp = model.noise_components(n=n, **noise_kw)
    names = tuple(names)
    comp = np.asarray(comp, dtype=np.float64).reshape(n, -1)
    if effect is not None:
        kappa = np.asarray(effect.params.noise_scale, dtype=np.float64)
        return comp, np.zeros(n), comp @ kappa
    floor = _floor_variance(names, comp)
    return comp, floor, np.maximum(comp.sum(axis=1) - floor, 0.0)


def observation_noise_variance(
    model: Any,
    n: int,
    *,
    effect: TileEffect | None = None,
    urban: Any = None,
    tests: Any = 1.0,
    devices: Any = None,
) -> np.ndarray:
    """``var(test) - var(tile)`` at n places: the noise of ``tests`` tests (default one) from
    ``devices`` devices, refitted by ``effect`` when given."""
    kw = noise_kwargs(model, tests, devices, urban=urban)
    return _noise_parts(model, n, effect=effect, noise_kw=kw)[2]


def predict_quantity(
    model: Any,
    X: Any,
    *,
    quantity: str,
    effect: TileEffect | None = None,
    layer: LocalLayer | None = None,
    tiles: Any = None,
    times: Any = None,
    xy: Any = None,
    urban: Any = None,
    tests: Any = 1.0,
    devices: Any = None,
    chunk_size: int = 65536,
    own_testers: bool = False,
) -> QuantityPrediction:
    """The ``area``, ``tile`` or ``test`` quantity of a fitted model at inputs ``X``.

    Parameters
    ----------
    model
        A fitted :class:`geodbk.DBKRegressor` (``predict_dist(..., quantity="latent")`` and
        ``noise_components``).
    X
        Model inputs (n, d).
    quantity
        ``area``, ``tile`` or ``test`` (see the module docstring).
    effect
        The model's tile effect, or ``None`` (then ``tile`` uses the noise floor).
    layer
        The model's local layer (tile effect plus spatial field; it replaces ``effect``), or
        ``None``.
    tiles, times
        Tile id (zoom-16 quadkey) and time step (quarter index) of each place; needed with
        ``effect`` or ``layer``.
    xy
        km position of each place (:func:`geodbk.local_layer.lonlat_to_km` with the layer's
        ``lat0`` and ``lon0``); needed with ``layer``.
    urban
        Urban flag of each place (bool, (n,)): the noise floor of a model with one per class
        and the ``tau²`` group of a grouped tile effect.
    tests, devices
        The tests (and devices) a ``test`` quantity averages (default one test).
    chunk_size
        Rows evaluated at a time by the GP.
    own_testers
        State a tile without rows at ``tests``/``devices`` (a held-out row's own, to check
        the model against it) instead of at a typical training row's (a map: nobody's tests
        are known there). Only a tile effect or local layer whose unmeasured prior is the
        GP's (:data:`geodbk.tile_effect.UNSEEN_GP`) states such a tile by its testers.
    """
    check_quantity(quantity)
    if isinstance(effect, LocalLayer):  # a layer stands in for its tile effect
        layer, effect = effect, None
    x_np = np.asarray(X)
    n = int(x_np.shape[0])
    noise_kw = noise_kwargs(model, tests, devices, urban=urban)
    pred = model.predict_dist(x_np, quantity="latent", chunk_size=chunk_size, **noise_kw)
    area_mean = np.asarray(pred.mean, dtype=np.float64)
    area_var = np.maximum(np.asarray(pred.var_f, dtype=np.float64), 0.0)
    if layer is not None:
        effect = layer.effect
    comp, floor, noise_var = _noise_parts(model, n, effect=effect, noise_kw=noise_kw)
    pull = np.zeros(n)
    persistent = np.zeros(n)
    tests_shift = np.zeros(n)
    if effect is None:
        offset = np.zeros(n)
        tile_var = area_var + floor
        seen = np.zeros(n, dtype=bool)
        basis = "noise floor"
    else:
        if tiles is None or times is None:
            raise ValueError("with a tile effect, give tiles= and times= for every place")
        if effect.grouped and urban is None:
            raise ValueError(
                f"this tile effect has a tau² per group {list(effect.params.groups)}: give urban="
            )
        step = np.array(np.broadcast_to(np.asarray(times, dtype=np.float64), (n,)))
        groups = urban_groups(urban) if effect.grouped else None
        rows = {
            "tiles": tiles,
            "times": step,
            "var_f": area_var,
            "components": comp,
            "groups": groups,
            # a map states an unmeasured tile at a typical training row's tests
            "tile_components": None if own_testers else effect.params.tests_centre,
        }
        if layer is not None:
            part = layer.predict(xy=xy, **rows)
            pull = part.pull if part.pull is not None else pull
            basis = "local layer"
        else:
            part = effect.predict(**rows)
            basis = "tile effect"
        offset, tile_var, seen = part.shift, part.tile_var, part.seen
        persistent = part.persistent_var
        if part.tests_shift is not None:
            tests_shift = np.asarray(part.tests_shift, dtype=np.float64)
        # sum_k kappa_k c_k + the testers' persistent part (+ an unmeasured tile's testers'
        # share of its prior, with a local layer's place share)
        noise_var = part.noise_var
    if quantity == "area":
        mean, var = area_mean, area_var
    elif quantity == "tile":
        mean, var = area_mean + offset, tile_var
    else:
        mean, var = area_mean + offset + tests_shift, tile_var + noise_var
    return QuantityPrediction(
        quantity=quantity,
        mean=mean,
        var=np.asarray(var, dtype=np.float64).copy(),
        area_mean=area_mean,
        area_var=area_var,
        offset=np.asarray(offset, dtype=np.float64),
        pull=np.asarray(pull, dtype=np.float64),
        tile_var=np.asarray(tile_var, dtype=np.float64),
        noise_var=np.asarray(noise_var, dtype=np.float64),
        seen=np.asarray(seen, dtype=bool),
        tile_basis=basis,
        persistent_var=np.asarray(persistent, dtype=np.float64),
        tests_shift=tests_shift,
    )


def describe_quantity(model: Any, tests: float, devices: float | None = None) -> str:
    """What the observation layers show: ``single speed test``, ``tile average of K speed
    tests`` (tests-aware models; ``tests+devices`` models add ``from M devices`` when
    ``devices`` is given and differs from K; models with a floor per urban/rural class add
    ``, each cell's urban/rural noise floor``) or ``observation (constant noise)``."""
    if not getattr(model, "tests_aware", False):
        return "observation (constant noise)"
    text = _describe_tests(model, tests, devices)
    if getattr(model, "noise_urban", False):
        text += ", each cell's urban/rural noise floor"
    return text


def _describe_tests(model: Any, tests: float, devices: float | None) -> str:
    if getattr(model, "devices_aware", False) and devices is not None and devices != tests:
        return (
            f"tile average of {tests:g} speed tests from {devices:g} devices "
            f"(tests={tests:g}, devices={devices:g})"
        )
    if tests == 1:
        return "single speed test (tests=1)"
    return f"tile average of {tests:g} speed tests (tests={tests:g})"
