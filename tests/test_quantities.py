"""The area, tile and test quantities (geodbk.quantities) against their definitions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tile_tables import fit_effect_on_masks

from geodbk import DBKRegressor
from geodbk.quantities import (
    QUANTITIES,
    check_quantity,
    observation_noise_variance,
    predict_quantity,
)
from geodbk.tile_effect import predict_with_tile_effect


@pytest.fixture(scope="module")
def fitted() -> dict:
    """A tests-aware DBK on 50 tiles x 4 quarters with a persistent offset per tile, and its
    tile effect (fitted on quarters 0-1, chosen on quarter 2)."""
    rng = np.random.default_rng(7)
    n_tiles, quarters = 50, 4
    centre = rng.uniform(-1, 1, size=(n_tiles, 2))
    offset = rng.normal(0.0, 0.4, n_tiles)
    tile = np.repeat(np.arange(n_tiles), quarters)
    time = np.tile(np.arange(quarters, dtype=float), n_tiles)
    tests = rng.integers(1, 10, tile.size).astype(float)
    x = centre[tile]
    y = np.sin(2 * x[:, 0]) + offset[tile] + rng.normal(size=tile.size) * np.sqrt(0.05 / tests)
    ids = np.array([f"t{j:03d}" for j in tile])
    val, train = time == 2, time < 2
    model = DBKRegressor(
        rank=16, hidden=16, epochs=8, batch_size=64, noise="tests", device="cpu", seed=0
    )
    model.fit(x[train], y[train], x[val], y[val], tests=tests[train], tests_val=tests[val])
    effect = fit_effect_on_masks(
        model, x=x, y=y, ids=ids, times=time, train=train, val=val, tests=tests
    )
    at = time == 3
    new = rng.uniform(-1, 1, size=(20, 2))  # places whose tile was never measured
    X = np.vstack([x[at], new])
    tiles = np.concatenate([ids[at], [f"new{i}" for i in range(20)]])
    return {"model": model, "effect": effect, "X": X, "tiles": tiles, "seen": at.sum()}


def test_check_quantity_names_the_choices() -> None:
    assert [check_quantity(q) for q in QUANTITIES] == ["area", "tile", "test"]
    with pytest.raises(ValueError, match="area, tile, test"):
        check_quantity("latent")


def test_quantities_with_a_tile_effect_match_their_definitions(fitted: dict) -> None:
    model, effect, X, tiles = fitted["model"], fitted["effect"], fitted["X"], fitted["tiles"]
    kw = {"effect": effect, "tiles": tiles, "times": 3.0, "tests": 1.0}
    area = predict_quantity(model, X, quantity="area", **kw)
    tile = predict_quantity(model, X, quantity="tile", **kw)
    test = predict_quantity(model, X, quantity="test", **kw)
    latent = model.predict_dist(X, quantity="latent")
    np.testing.assert_allclose(area.mean, latent.mean)
    np.testing.assert_allclose(area.var, latent.var_f)
    # tile / test are the tile effect's latent / observation predictions
    times = np.full(len(tiles), 3.0)
    ref_tile = predict_with_tile_effect(
        model, effect, X, tiles=tiles, times=times, noise={"tests": 1.0}, quantity="latent"
    )
    ref_test = predict_with_tile_effect(
        model, effect, X, tiles=tiles, times=times, noise={"tests": 1.0}
    )
    np.testing.assert_allclose(tile.mean, ref_tile.mean)
    np.testing.assert_allclose(tile.var, ref_tile.var)
    np.testing.assert_allclose(test.mean, ref_test.mean)
    np.testing.assert_allclose(test.var, ref_test.var)
    # the ordering, and the parts add up
    assert np.all(test.var >= tile.var) and np.all(tile.var >= 0)
    np.testing.assert_allclose(tile.mean, area.mean + tile.offset)
    np.testing.assert_allclose(test.var - tile.var, test.noise_var)
    seen = fitted["seen"]
    assert tile.seen[:seen].all() and not tile.seen[seen:].any()
    assert np.all(tile.offset[seen:] == 0)
    # an unseen tile carries the prior spread of an offset: tau² + lambda var_f > var_f
    p = effect.params
    np.testing.assert_allclose(
        tile.var[seen:], p.tau2["all"] + p.latent_scale * area.var[seen:], rtol=1e-10
    )
    assert tile.tile_basis == "tile effect"


def test_quantities_without_a_tile_effect_use_the_noise_floor(fitted: dict) -> None:
    model, X = fitted["model"], fitted["X"]
    tile = predict_quantity(model, X, quantity="tile")
    test = predict_quantity(model, X, quantity="test", tests=4.0)
    obs = model.predict_dist(X, tests=4.0)
    floor = model.noise_parameters()["s2_floor"]
    np.testing.assert_allclose(tile.var, obs.var_f + floor, rtol=1e-6)
    np.testing.assert_allclose(test.var, obs.var, rtol=1e-6)
    np.testing.assert_allclose(test.mean, obs.mean)
    assert tile.tile_basis == "noise floor" and not tile.seen.any()
    one = observation_noise_variance(model, len(X))
    np.testing.assert_allclose(tile.var + one, model.predict_dist(X, tests=1.0).var, rtol=1e-6)


def test_a_tile_effect_needs_tiles_and_times(fitted: dict) -> None:
    with pytest.raises(ValueError, match="tiles= and times="):
        predict_quantity(fitted["model"], fitted["X"], quantity="tile", effect=fitted["effect"])


def _layers_over(effect: Any, tiles: np.ndarray, *, seed: int, vary: str) -> tuple[Any, Any]:
    """``(layer(value), xy)``: local layers over ``effect`` (sigma² 0.05, range 3 km, its
    measured tiles at random km positions) that differ in the parameter ``vary``, and the km
    positions of ``tiles`` (new tiles at random ones)."""
    from geodbk.local_layer import LocalLayer, SpatialParameters

    measured = effect._layout().tiles
    rng = np.random.default_rng(seed)
    spots = dict(zip(measured, rng.uniform(0, 20, size=(measured.size, 2)), strict=True))
    xy = np.array([spots.get(t, rng.uniform(0, 20, 2)) for t in tiles])

    def layer(value: Any) -> LocalLayer:
        params = SpatialParameters(
            sigma2=0.05, range_km=3.0, tau2=dict(effect.params.tau2), **{vary: value}
        )
        return LocalLayer(effect, params, tile_xy=np.array([spots[t] for t in measured]))

    return layer, xy


@pytest.mark.parametrize("share", [0.3, 1.0])
def test_a_place_share_narrows_the_tile_quantity_not_the_test_quantity(
    fitted: dict, share: float
) -> None:
    """With a local layer whose place share is ``c``, an unmeasured place's tile variance is
    ``lambda var_f + c P``, or ``var_f`` where that is more and ``lambda var_f + P`` holds it,
    and its test variance is that of ``c = 1``; measured places and the means are
    unchanged."""
    model, effect, X, tiles = fitted["model"], fitted["effect"], fitted["X"], fitted["tiles"]
    layer, xy = _layers_over(effect, tiles, seed=3, vary="place_share")
    kw = {"tiles": tiles, "times": 3.0, "tests": 1.0, "xy": xy}
    one = {q: predict_quantity(model, X, quantity=q, effect=layer(1.0), **kw) for q in QUANTITIES}
    got = {q: predict_quantity(model, X, quantity=q, effect=layer(share), **kw) for q in QUANTITIES}
    np.testing.assert_allclose(got["test"].var, one["test"].var, rtol=1e-12)
    np.testing.assert_allclose(got["tile"].mean, one["tile"].mean)
    seen = fitted["seen"]
    np.testing.assert_array_equal(got["tile"].var[:seen], one["tile"].var[:seen])
    area, whole = one["area"].var[seen:], one["tile"].var[seen:]
    latent = effect.params.latent_scale * area
    # c of the prior, but never below the area quantity's variance while the prior holds it
    want = np.maximum(latent + share * (whole - latent), np.minimum(area, whole))
    np.testing.assert_allclose(got["tile"].var[seen:], want, rtol=1e-10)
    assert np.all(got["tile"].var[seen:] >= np.minimum(area, whole) * (1 - 1e-12))
    assert np.all(got["test"].var >= got["tile"].var) and np.all(got["tile"].var >= 0)


def test_the_test_quantity_moves_with_its_tests_and_the_tile_quantity_does_not(
    fitted: dict,
) -> None:
    """The tile effect's tests shift: one test's mean is the tile's plus ``gamma (c(K) -
    c0)``, with ``c(K)`` the noise components of K tests; the tile quantity is the same
    whatever K."""
    model, effect, X, tiles = fitted["model"], fitted["effect"], fitted["X"], fitted["tiles"]
    gamma = np.asarray(effect.params.tests_shift)
    assert gamma[1] != 0.0  # the fixture's tests-aware model has a "meas" component
    kw = {"effect": effect, "tiles": tiles, "times": 3.0}
    tile = {k: predict_quantity(model, X, quantity="tile", tests=k, **kw) for k in (1.0, 16.0)}
    test = {k: predict_quantity(model, X, quantity="test", tests=k, **kw) for k in (1.0, 16.0)}
    np.testing.assert_allclose(tile[1.0].mean, tile[16.0].mean)
    for k in (1.0, 16.0):
        _, comp = model.noise_components(n=len(X), tests=k)
        moved = (np.asarray(comp) - np.asarray(effect.params.tests_centre)) @ gamma
        np.testing.assert_allclose(test[k].mean, tile[k].mean + moved, atol=1e-12)
        np.testing.assert_allclose(test[k].tests_shift, moved, atol=1e-12)


def test_a_gp_prior_states_an_unmeasured_map_tile_at_a_typical_row_and_a_check_at_its_own(
    fitted: dict,
) -> None:
    """With the GP's prior of an unmeasured tile (``UNSEEN_GP``) a map's tile quantity there is
    stated at the training rows' mean noise components ``c0`` whatever ``tests`` a test
    quantity is asked for, while ``own_testers`` states it at the rows' tests; test >= tile >=
    0 either way, and measured places are as with the tile effect's prior."""
    import copy
    from dataclasses import replace

    from geodbk.local_layer import UNSEEN_EFFECT, UNSEEN_GP

    model, X, tiles = fitted["model"], fitted["X"], fitted["tiles"]
    # half of the GP's per-test noise is a test's own, the rest the tile's
    effect = copy.copy(fitted["effect"])
    effect.params = replace(effect.params, noise_scale=(1.0, 0.5))
    layer, xy = _layers_over(effect, tiles, seed=4, vary="unseen_prior")
    seen = fitted["seen"]
    kw = {"tiles": tiles, "times": 3.0, "xy": xy, "effect": layer(UNSEEN_GP)}
    tile = {k: predict_quantity(model, X, quantity="tile", tests=k, **kw) for k in (1.0, 16.0)}
    test = {k: predict_quantity(model, X, quantity="test", tests=k, **kw) for k in (1.0, 16.0)}
    np.testing.assert_allclose(tile[1.0].var, tile[16.0].var, rtol=1e-12)
    for k in (1.0, 16.0):
        assert np.all(test[k].var >= tile[k].var) and np.all(tile[k].var >= 0)
    own = {
        k: predict_quantity(model, X, quantity="tile", tests=k, own_testers=True, **kw)
        for k in (1.0, 16.0)
    }
    # more tests, less of the GP's noise that is the tile's: narrower where nobody measured
    assert np.all(own[16.0].var[seen:] < own[1.0].var[seen:])
    np.testing.assert_allclose(own[1.0].var[:seen], own[16.0].var[:seen], rtol=1e-12)
    base = predict_quantity(
        model, X, quantity="tile", tests=1.0, **{**kw, "effect": layer(UNSEEN_EFFECT)}
    )
    np.testing.assert_allclose(tile[1.0].var[:seen], base.var[:seen], rtol=1e-12)
    np.testing.assert_allclose(tile[1.0].mean, base.mean, rtol=1e-12)
