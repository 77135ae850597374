"""The local layer (geodbk.local_layer): dense float64 reference, neighbours, fitting."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from geodbk.errors import DataError
from geodbk.local_layer import (
    PARALLEL_QUERY_TARGETS,
    RANGE_BOUNDS_KM,
    UNSEEN_EFFECT,
    UNSEEN_GP,
    LocalLayer,
    SpatialParameters,
    _Neighbours,
    lonlat_to_km,
    matern32,
    range_at_bound,
    tile_chunks,
)
from geodbk.tile_effect import TileEffect, TileEffectParameters

TAU2, RHO, LAM, KAPPA, SIGMA2, RANGE = 0.04, 0.8, 1.5, 1.2, 0.09, 2.5


@pytest.fixture(autouse=True)
def _group_every_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Factor the measured tiles in groups of similar row counts however few they are, so
    that the dense references here check the grouped factors (a run's default groups only
    hundreds of tiles)."""
    import geodbk.tile_effect as te

    monkeypatch.setitem(te.row_count_groups.__kwdefaults__, "min_tiles", 1)


def _c(d: np.ndarray) -> np.ndarray:
    return matern32(torch.as_tensor(d), torch.tensor(RANGE)).numpy()


def _data(rng: np.random.Generator, n_tiles: int = 14):
    """Tiles in a 10 km box, 1-6 rows each over 8 quarters, one GP variance per tile."""
    xy = rng.uniform(0, 10, size=(n_tiles, 2))
    v_tile = rng.uniform(0.005, 0.03, n_tiles)
    tiles, times, pos, v, noise = [], [], [], [], []
    for j in range(n_tiles):
        q = np.sort(rng.choice(8, size=int(rng.integers(1, 7)), replace=False)).astype(float)
        tiles += [f"t{j:02d}"] * q.size
        times += list(q)
        pos += [xy[j]] * q.size
        v += [v_tile[j]] * q.size
        noise += list(rng.uniform(0.01, 0.2, q.size))
    return (
        np.array(tiles),
        np.array(times),
        np.array(pos),
        np.array(v),
        np.array(noise)[:, None],
        xy,
    )


def _dense(tiles, times, pos, v, noise, residual, target) -> tuple[float, float]:
    """Conditional mean and variance of delta + s + u at the target (tile, time, xy, v) by
    the dense joint Gaussian of all rows (float64)."""
    tile_t, time_t, xy_t, v_t = target
    d = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    same = tiles[:, None] == tiles[None]
    S = SIGMA2 * _c(d) + same * (
        TAU2 * RHO ** np.abs(times[:, None] - times[None]) + LAM * v[0:1] * 0
    )
    S = S + same * LAM * np.sqrt(np.outer(v, v)) + np.diag(KAPPA * noise[:, 0])
    k = SIGMA2 * _c(np.sqrt(((pos - xy_t) ** 2).sum(-1)))
    own = tiles == tile_t
    k = k + own * (TAU2 * RHO ** np.abs(time_t - times) + LAM * np.sqrt(v_t * v))
    sol = np.linalg.solve(S, np.column_stack([residual, k]))
    return float(k @ sol[:, 0]), float(SIGMA2 + TAU2 + LAM * v_t - k @ sol[:, 1])


def _layer(tiles, times, v, noise, residual, xy, *, neighbours: int) -> LocalLayer:
    params = TileEffectParameters(
        tau2={"all": TAU2},
        rho=RHO,
        noise_scale=(KAPPA,),
        components=("noise",),
        latent_scale=LAM,
    )
    effect = TileEffect(
        params, tiles=tiles, times=times, residual=residual, var_f=v, components=noise
    )
    spatial = SpatialParameters(
        sigma2=SIGMA2, range_km=RANGE, tau2={"all": TAU2}, neighbours=neighbours
    )
    order = np.argsort(np.unique(tiles))
    return LocalLayer(effect, spatial, tile_xy=xy[order])


def _effect_on(params, ids, times, y, noise, rows, groups=None) -> TileEffect:
    """A tile effect with ``params`` conditioned on the rows ``rows`` (GP variance 1e-4)."""
    return TileEffect(
        params,
        tiles=ids[rows],
        times=times[rows],
        residual=y[rows],
        var_f=np.full(int(rows.sum()), 1e-4),
        components=noise[rows],
        groups=None if groups is None else groups[rows],
    )


def _fit_layer(ids, times, y, noise, row_xy, train, *, tile_xy, tau2: float, **options):
    """A local layer fitted on the rows ``~train`` over a tile effect (rho 1, GP variance
    1e-4) conditioned on the rows ``train``; ``options`` go to :meth:`LocalLayer.fit`."""
    params = TileEffectParameters(
        tau2={"all": tau2}, rho=1.0, noise_scale=(1.0,), components=("noise",), latent_scale=1.0
    )
    effect = _effect_on(params, ids, times, y, noise, train)
    val = ~train
    return LocalLayer.fit(
        effect,
        tile_xy=tile_xy,
        val_tiles=ids[val],
        val_xy=row_xy[val],
        val_times=times[val],
        val_residual=y[val],
        val_var_f=np.full(val.sum(), 1e-4),
        val_components=noise[val],
        **options,
    )


def _fit_leaving_tiles_out(
    rng: np.random.Generator,
    xy: np.ndarray,
    offset: np.ndarray,
    held: np.ndarray,
    *,
    noise_var: float,
    tau2: float,
    rows: int = 4,
    **options: Any,
) -> LocalLayer:
    """A layer fitted on the tiles ``held`` (no training rows) over a tile effect with
    ``tau2`` on the others: tile ``j`` at ``xy[j]`` has ``rows`` quarters of ``offset[j]`` plus
    noise of variance ``noise_var``; ``options`` go to :meth:`LocalLayer.fit`."""
    n = len(xy)
    tile = np.repeat(np.arange(n), rows)
    times = np.tile(np.arange(rows, dtype=float), n)
    noise = np.full((tile.size, 1), noise_var)
    y = offset[tile] + rng.normal(0, math.sqrt(noise_var), tile.size)
    ids = np.array([f"t{j:03d}" for j in tile])
    train = ~held[tile]
    train_tiles = np.unique(ids[train])
    tile_xy = xy[[int(t[1:]) for t in train_tiles]]
    return _fit_layer(ids, times, y, noise, xy[tile], train, tile_xy=tile_xy, tau2=tau2, **options)


def test_prediction_matches_the_dense_joint_gaussian() -> None:
    rng = np.random.default_rng(0)
    tiles, times, pos, v, noise, xy = _data(rng)
    residual = rng.normal(0, 0.3, tiles.size)
    layer = _layer(tiles, times, v, noise, residual, xy, neighbours=len(xy))
    # a measured tile at a later quarter, and a new tile between measured ones
    targets = [("t03", 8.0, xy[3], v[tiles == "t03"][0]), ("new", 5.0, np.array([4.0, 6.0]), 0.02)]
    pred = layer.predict(
        tiles=[t[0] for t in targets],
        xy=np.array([t[2] for t in targets]),
        times=[t[1] for t in targets],
        var_f=[t[3] for t in targets],
        components=np.full((2, 1), 0.05),
    )
    for i, target in enumerate(targets):
        mean, var = _dense(tiles, times, pos, v, noise, residual, target)
        assert pred.shift[i] == pytest.approx(mean, rel=1e-8, abs=1e-10)
        assert pred.tile_var[i] == pytest.approx(var, rel=1e-8, abs=1e-10)
    assert pred.seen.tolist() == [True, False]
    assert pred.pull is not None and pred.pull[1] == pytest.approx(
        pred.shift[1]
    )  # an unseen tile is all neighbours' pull


def test_rows_of_one_tile_at_several_quarters_and_gp_variances_match_the_dense_gaussian() -> None:
    """Rows of a measured tile share its factor and solves per (tile, quarter); each row's own
    GP variance enters through sqrt(v_i): every row still equals the dense joint Gaussian."""
    rng = np.random.default_rng(5)
    tiles, times, pos, v, noise, xy = _data(rng)
    residual = rng.normal(0, 0.3, tiles.size)
    layer = _layer(tiles, times, v, noise, residual, xy, neighbours=len(xy))
    targets = [
        ("t03", 8.0, xy[3], 0.01),
        ("t03", 8.0, xy[3], 0.05),
        ("t03", 6.0, xy[3], 0.05),
        ("t05", 8.0, xy[5], 0.02),
        ("t03", 8.0, xy[3], 0.01),
        ("t03", 2.0, xy[3], 0.0),
    ]
    pred = layer.predict(
        tiles=[t[0] for t in targets],
        xy=np.array([t[2] for t in targets]),
        times=[t[1] for t in targets],
        var_f=[t[3] for t in targets],
        components=np.full((len(targets), 1), 0.05),
    )
    for i, target in enumerate(targets):
        mean, var = _dense(tiles, times, pos, v, noise, residual, target)
        assert pred.shift[i] == pytest.approx(mean, rel=1e-8, abs=1e-10)
        assert pred.tile_var[i] == pytest.approx(var, rel=1e-8, abs=1e-10)
    assert pred.shift[0] != pred.shift[1] and pred.tile_var[0] < pred.tile_var[1]


def _layer_and_variant(seed: int, **spatial: float) -> tuple[LocalLayer, LocalLayer, np.ndarray]:
    """A layer of 8 neighbours on random data, the same layer with the spatial parameters
    changed by ``spatial``, and the tiles' km positions."""
    rng = np.random.default_rng(seed)
    tiles, times, _, v, noise, xy = _data(rng)
    residual = rng.normal(0, 0.3, tiles.size)
    layer = _layer(tiles, times, v, noise, residual, xy, neighbours=8)
    params = {"sigma2": SIGMA2, "range_km": RANGE, "tau2": {"all": TAU2}, "neighbours": 8}
    variant = LocalLayer(
        layer.effect, SpatialParameters(**{**params, **spatial}), tile_xy=layer.tile_xy
    )
    return layer, variant, xy


def test_zero_field_gives_back_the_tile_effect() -> None:
    layer, zero, xy = _layer_and_variant(1, sigma2=0.0)
    kw = {"tiles": ["t02", "t05", "zz"], "times": [7.0, 2.0, 3.0], "var_f": [0.01, 0.02, 0.03]}
    kw["components"] = np.full((3, 1), 0.1)
    mine = zero.predict(xy=np.array([xy[2], xy[5], [1.0, 1.0]]), **kw)
    ref = layer.effect.predict(**kw)
    np.testing.assert_allclose(mine.shift, ref.shift, atol=1e-12)
    np.testing.assert_allclose(mine.tile_var, ref.tile_var, rtol=1e-10)


def test_nearest_neighbours_converge_to_the_dense_answer() -> None:
    rng = np.random.default_rng(2)
    tiles, times, pos, v, noise, xy = _data(rng, n_tiles=30)
    residual = rng.normal(0, 0.3, tiles.size)
    target = ("new", 4.0, np.array([5.0, 5.0]), 0.02)
    exact = _dense(tiles, times, pos, v, noise, residual, target)
    errors = []
    for k in (1, 4, 12, 30):
        layer = _layer(tiles, times, v, noise, residual, xy, neighbours=k)
        pred = layer.predict(
            tiles=["new"], xy=target[2][None], times=[4.0], var_f=[0.02], components=[[0.05]]
        )
        errors.append(abs(pred.shift[0] - exact[0]) + abs(pred.tile_var[0] - exact[1]))
    assert errors[-1] < 1e-9
    assert errors[2] < errors[0]


@pytest.mark.parametrize("keep_total", [True, False])
def test_fit_finds_a_spatial_field_and_lowers_validation_nll(keep_total: bool) -> None:
    """Offsets drawn from a field with a 3 km range: unseen tiles borrow from neighbours."""
    rng = np.random.default_rng(3)
    n = 400
    xy = rng.uniform(0, 30, size=(n, 2))
    d = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))
    field = rng.multivariate_normal(np.zeros(n), 0.1 * _c(d * RANGE / 3.0) + 1e-9 * np.eye(n))
    white = rng.normal(0, math.sqrt(0.02), n)
    held = rng.random(n) < 0.2  # leave-tile-out: validation tiles have no training rows
    layer = _fit_leaving_tiles_out(
        rng,
        xy,
        field + white,
        held,
        noise_var=0.03,
        tau2=0.12,
        neighbours=12,
        keep_total=keep_total,
    )
    p = layer.params
    assert p.val_nll is not None and p.val_nll_without is not None
    assert p.val_nll < p.val_nll_without - 0.1
    # the field takes over most of the offset variance (sigma² and the range trade off
    # against each other, so only their presence is checked)
    assert p.sigma2 > 0.03 and p.tau2["all"] < 0.06 and p.range_km > 0.5
    if keep_total:  # the effect's offset variance is shared out, not grown
        assert p.sigma2 + p.tau2["all"] == pytest.approx(0.12)


def test_targets_sharing_neighbours_match_targets_predicted_alone() -> None:
    """Neighbour sets are factored once per distinct set: a batch whose targets share sets
    (close points, own tiles, a repeated point) equals each target predicted on its own, and
    the dense answer where the neighbours are all tiles."""
    rng = np.random.default_rng(4)
    tiles, times, pos, v, noise, xy = _data(rng, n_tiles=30)
    residual = rng.normal(0, 0.3, tiles.size)
    layer = _layer(tiles, times, v, noise, residual, xy, neighbours=6)
    m = 40
    pts = np.vstack([rng.uniform(4.0, 4.5, size=(m - 4, 2)), xy[:3], [[4.2, 4.2]]])
    names = [*(f"new{i}" for i in range(m - 4)), "t00", "t01", "t02", "new0"]
    kw = {"times": np.full(m, 5.0), "var_f": np.full(m, 0.02), "components": np.full((m, 1), 0.05)}
    batch = layer.predict(tiles=names, xy=pts, **kw)
    hood = layer._neighbours.query(pts, np.full(m, -1))
    assert hood.sets.shape[0] < m  # close targets share neighbour sets
    for i in range(m):
        alone = layer.predict(
            tiles=names[i : i + 1],
            xy=pts[i : i + 1],
            times=kw["times"][i : i + 1],
            var_f=kw["var_f"][i : i + 1],
            components=kw["components"][i : i + 1],
        )
        assert batch.shift[i] == pytest.approx(alone.shift[0], rel=1e-10, abs=1e-12)
        assert batch.tile_var[i] == pytest.approx(alone.tile_var[0], rel=1e-10, abs=1e-12)
    everything = _layer(tiles, times, v, noise, residual, xy, neighbours=len(xy))
    full = everything.predict(tiles=names[:5], xy=pts[:5], **{k: a[:5] for k, a in kw.items()})
    for i in range(5):
        mean, var = _dense(tiles, times, pos, v, noise, residual, (names[i], 5.0, pts[i], 0.02))
        # the kriging system's jitter (1e-8 scale) bounds the agreement
        assert full.shift[i] == pytest.approx(mean, rel=1e-6, abs=1e-8)
        assert full.tile_var[i] == pytest.approx(var, rel=1e-6, abs=1e-8)


def test_lonlat_to_km_distances() -> None:
    xy = lonlat_to_km([-157.8, -157.8, -157.7], [21.3, 21.4, 21.3], lat0=21.3)
    assert np.hypot(*(xy[1] - xy[0])) == pytest.approx(11.12, rel=1e-3)
    assert np.hypot(*(xy[2] - xy[0])) == pytest.approx(
        11.12 * math.cos(math.radians(21.3)), rel=1e-3
    )


def test_persistent_share_matches_the_dense_joint_gaussian() -> None:
    """With the testers' persistent share mu, tile j's white offset has variance
    tau² + mu * mean(c_j) and an unseen place keeps tau² (the place's)."""
    rng = np.random.default_rng(4)
    tiles, times, pos, v, noise, xy = _data(rng)
    comp = np.column_stack([np.full(tiles.size, 0.02), noise[:, 0]])
    mu = 0.7
    residual = rng.normal(0, 0.3, tiles.size)
    params = TileEffectParameters(
        tau2={"all": TAU2},
        rho=RHO,
        noise_scale=(1.0, KAPPA),
        components=("floor", "meas"),
        latent_scale=LAM,
        persistent_scale=(0.0, mu),
    )
    effect = TileEffect(
        params, tiles=tiles, times=times, residual=residual, var_f=v, components=comp
    )
    spatial = SpatialParameters(
        sigma2=SIGMA2, range_km=RANGE, tau2={"all": TAU2}, neighbours=len(xy)
    )
    layer = LocalLayer(effect, spatial, tile_xy=xy[np.argsort(np.unique(tiles))])
    tau_j = {t: TAU2 + mu * comp[tiles == t, 1].mean() for t in np.unique(tiles)}
    tau_row = np.array([tau_j[t] for t in tiles])
    d = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    same = tiles[:, None] == tiles[None]
    S = SIGMA2 * _c(d) + same * tau_row[:, None] * RHO ** np.abs(times[:, None] - times[None])
    S = S + same * LAM * np.sqrt(np.outer(v, v)) + np.diag(comp @ np.array([1.0, KAPPA]))
    targets = [("t05", 8.0, xy[5], v[tiles == "t05"][0]), ("new", 5.0, np.array([4.0, 6.0]), 0.02)]
    pred = layer.predict(
        tiles=[t[0] for t in targets],
        xy=np.array([t[2] for t in targets]),
        times=[t[1] for t in targets],
        var_f=[t[3] for t in targets],
        components=np.full((2, 2), 0.05),
    )
    for i, (tile, time, at, v_t) in enumerate(targets):
        tau_t = tau_j.get(tile, TAU2)
        k = SIGMA2 * _c(np.sqrt(((pos - at) ** 2).sum(-1)))
        own = tiles == tile
        k = k + own * (tau_t * RHO ** np.abs(time - times) + LAM * np.sqrt(v_t * v))
        sol = np.linalg.solve(S, np.column_stack([residual, k]))
        assert pred.shift[i] == pytest.approx(k @ sol[:, 0], rel=1e-8, abs=1e-10)
        var = SIGMA2 + tau_t + LAM * v_t - k @ sol[:, 1]
        assert pred.tile_var[i] == pytest.approx(var, rel=1e-8, abs=1e-10)
    # the unseen place's test noise carries its testers' share; the measured tile's does not
    assert pred.noise_var[1] == pytest.approx(0.05 + KAPPA * 0.05 + mu * 0.05)
    assert pred.noise_var[0] == pytest.approx(0.05 + KAPPA * 0.05)


def test_unique_rows_equals_numpy_and_survives_a_hash_collision() -> None:
    from geodbk.local_layer import unique_rows

    rng = np.random.default_rng(2)
    rows = rng.integers(-1, 30, size=(40, 4))[rng.integers(0, 40, 500)]
    want, want_inv = np.unique(rows, axis=0, return_inverse=True)
    got, got_inv = unique_rows(rows)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_inv, want_inv.reshape(-1))
    # unordered: the same distinct rows, each once, and the inverse rebuilds the rows
    loose, loose_inv = unique_rows(rows, ordered=False)
    assert len(loose) == len(want)
    np.testing.assert_array_equal(np.unique(loose, axis=0), want)
    np.testing.assert_array_equal(loose[loose_inv], rows)
    # two different rows with the same hash key: a = (w1, 0), b = (0, w0)
    w = np.random.default_rng(0x5EED).integers(1, np.iinfo(np.int64).max, size=2, dtype=np.int64)
    clash = np.array([[w[1], 0], [0, w[0]], [w[1], 0]], dtype=np.int64)
    with np.errstate(over="ignore"):
        assert (clash[0] * w).sum() == (clash[1] * w).sum()
    got, got_inv = unique_rows(clash)
    np.testing.assert_array_equal(got, np.unique(clash, axis=0))
    assert got_inv.tolist() == [1, 0, 1]
    loose, loose_inv = unique_rows(clash, ordered=False)
    np.testing.assert_array_equal(loose[loose_inv], clash)
    assert len(loose) == 2


def test_rows_without_positions_sit_at_their_tiles_centres() -> None:
    """With ``xy`` left out, each row stands at its tile's centre (``positions``) and the
    neighbours are found once per distinct tile: the same numbers as giving every row its
    tile's centre, rows of one tile share their pull and the variance differs only by
    ``lambda var_f``."""
    rng = np.random.default_rng(7)
    tiles, times, _pos, v, noise, xy = _data(rng, n_tiles=25)
    residual = rng.normal(0, 0.3, tiles.size)
    base = _layer(tiles, times, v, noise, residual, xy, neighbours=5)
    centres = {f"new{i}": rng.uniform(0, 10, 2) for i in range(6)}
    centres.update({f"t{j:02d}": xy[j] for j in range(len(xy))})

    def positions(ids: np.ndarray) -> np.ndarray:
        return np.array([centres[str(t)] for t in ids])

    layer = LocalLayer(base.effect, base.params, tile_xy=base.tile_xy, positions=positions)
    names = np.array(["new0", "t03", "new0", "new5", "t03", "t11", "new5", "new0", "t03"])
    m = names.size
    kw = {
        "times": np.array([6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 2.0]),
        "var_f": rng.uniform(0.01, 0.03, m),
        "components": np.full((m, 1), 0.05),
    }
    at_tiles = layer.predict(tiles=names, **kw)
    explicit = layer.predict(tiles=names, xy=positions(names), **kw)
    np.testing.assert_allclose(at_tiles.shift, explicit.shift, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(at_tiles.tile_var, explicit.tile_var, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(at_tiles.pull, explicit.pull, rtol=1e-12, atol=1e-14)
    for i in range(m):  # alone, nothing is shared: the same numbers
        alone = layer.predict(tiles=names[i : i + 1], **{k: a[i : i + 1] for k, a in kw.items()})
        assert at_tiles.shift[i] == pytest.approx(alone.shift[0], rel=1e-10, abs=1e-12)
        assert at_tiles.tile_var[i] == pytest.approx(alone.tile_var[0], rel=1e-10, abs=1e-12)
    for name in ("new0", "new5"):
        rows = np.flatnonzero(names == name)
        assert np.ptp(at_tiles.shift[rows]) == 0.0
        gap = at_tiles.tile_var[rows] - LAM * kw["var_f"][rows]
        np.testing.assert_allclose(gap, gap[0], rtol=1e-12)
    # tile ids as a pandas.Categorical (codes into distinct names, unused names included):
    # the same numbers, from the tile effect alone as well
    codes = pd.Categorical(names, categories=[*sorted(set(names)), "unused"])
    every_used = pd.Categorical(names, categories=sorted(set(names), reverse=True))
    for tiles in (codes, every_used):
        as_codes = layer.predict(tiles=tiles, **kw)
        for field in ("shift", "tile_var", "pull", "noise_var", "seen"):
            np.testing.assert_array_equal(getattr(as_codes, field), getattr(at_tiles, field))
    effect_kw = {k: kw[k] for k in ("times", "var_f", "components")}
    by_name = layer.effect.predict(tiles=names, **effect_kw)
    by_code = layer.effect.predict(tiles=codes, **effect_kw)
    np.testing.assert_array_equal(by_code.shift, by_name.shift)
    np.testing.assert_array_equal(by_code.tile_var, by_name.tile_var)
    with pytest.raises(DataError, match="missing tile ids"):
        layer.predict(tiles=pd.Categorical([None, "t03"]), **{k: a[:2] for k, a in kw.items()})


def test_fit_on_held_out_quarters_of_measured_tiles() -> None:
    """Validation rows of tiles that also have training rows (a random split): the own
    tile's factor is shared by its rows and differentiated through; the field still lowers
    the validation NLL."""
    rng = np.random.default_rng(5)
    n = 150
    xy = rng.uniform(0, 20, size=(n, 2))
    d = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))
    field = rng.multivariate_normal(np.zeros(n), 0.1 * _c(d * RANGE / 3.0) + 1e-9 * np.eye(n))
    rows = 4
    tile = np.repeat(np.arange(n), rows)
    times = np.tile(np.arange(rows, dtype=float), n)
    noise = np.full((tile.size, 1), 0.05)
    y = field[tile] + rng.normal(0, math.sqrt(0.05), tile.size)
    ids = np.array([f"t{j:03d}" for j in tile])
    train = ~((times == rows - 1) & (rng.random(tile.size) < 0.5))  # hold half the last quarter
    layer = _fit_layer(ids, times, y, noise, xy[tile], train, tile_xy=xy, tau2=0.1, neighbours=8)
    p = layer.params
    assert p.val_nll is not None and p.val_nll_without is not None
    assert np.isfinite(p.val_nll) and p.val_nll <= p.val_nll_without + 1e-9


@pytest.mark.parametrize("share", [0.2, 0.6])
def test_place_share_moves_an_unmeasured_tiles_prior_to_the_test_noise(share: float) -> None:
    """With ``place_share = c`` an unmeasured tile keeps ``lambda v + c (tau² + sigma²_nb)`` of
    its prior as the tile variance (at least ``v``) and the rest goes to one test's noise: a test's variance
    is unchanged, test >= tile >= 0, and measured tiles' rows are untouched."""
    whole, part, xy = _layer_and_variant(5, place_share=share)
    kw = {"tiles": ["t02", "zz", "yy"], "times": [7.0, 3.0, 1.0], "var_f": [0.01, 0.03, 0.02]}
    kw["components"] = np.full((3, 1), 0.1)
    at = np.array([xy[2], [1.0, 1.0], [40.0, 40.0]])
    a, b = whole.predict(xy=at, **kw), part.predict(xy=at, **kw)
    np.testing.assert_allclose(a.tile_var + a.noise_var, b.tile_var + b.noise_var, rtol=1e-12)
    vf = np.asarray(kw["var_f"])
    latent = LAM * vf
    kept = latent + share * (a.tile_var - latent)
    np.testing.assert_allclose(b.tile_var[1:], np.maximum(kept, np.minimum(vf, a.tile_var))[1:])
    assert b.tile_var[0] == a.tile_var[0] and b.noise_var[0] == a.noise_var[0]
    assert np.all(b.tile_var >= 0) and np.all(b.tile_var + b.noise_var >= b.tile_var)
    np.testing.assert_array_equal(a.shift, b.shift)
    # an explicit share overrides the fitted one
    c = part.predict(xy=at, place_share=1.0, **kw)
    np.testing.assert_array_equal(c.tile_var, a.tile_var)
    np.testing.assert_array_equal(c.noise_var, a.noise_var)


def _grouped_data(seed: int, tau2: dict[str, float]):
    """:func:`_data` with GP residuals N(0, 0.3²), its even tiles rural and odd ones urban,
    and a tile effect with one ``tau2`` per group on them: ``(tiles, times, pos, v, noise, xy,
    residual, groups, effect)``."""
    rng = np.random.default_rng(seed)
    tiles, times, pos, v, noise, xy = _data(rng)
    residual = rng.normal(0, 0.3, tiles.size)
    groups = np.where(np.array([int(t[1:]) for t in tiles]) % 2 == 0, "rural", "urban")
    params = TileEffectParameters(
        tau2=tau2, rho=RHO, noise_scale=(KAPPA,), components=("noise",), latent_scale=LAM
    )
    effect = TileEffect(
        params,
        tiles=tiles,
        times=times,
        residual=residual,
        var_f=v,
        components=noise,
        groups=groups,
    )
    return tiles, times, pos, v, noise, xy, residual, groups, effect


def test_a_groups_own_place_share_applies_to_its_rows_only() -> None:
    """With ``place_share_by_group`` an unmeasured row takes its group's share and a row of a
    group without one the pooled share: each equals the layer's prediction at that share."""
    tau2 = {"urban": 0.03, "rural": 0.06}
    tiles, _, _, _, _, xy, _, _, effect = _grouped_data(6, tau2)
    spatial = SpatialParameters(
        sigma2=SIGMA2,
        range_km=RANGE,
        tau2=tau2,
        place_share=0.3,
        place_share_by_group={"rural": 2.0},
    )
    layer = LocalLayer(effect, spatial, tile_xy=xy[np.argsort(np.unique(tiles))])
    kw = {"tiles": ["zz", "yy", "t01"], "times": [3.0, 3.0, 7.0], "var_f": [0.02, 0.02, 0.01]}
    kw["components"] = np.full((3, 1), 0.3)
    kw["groups"] = np.array(["urban", "rural", "rural"])
    at = np.array([[1.0, 1.0], [1.0, 1.0], xy[1]])
    both = layer.predict(xy=at, **kw)
    urban = layer.predict(xy=at, place_share=0.3, **kw)
    rural = layer.predict(xy=at, place_share=2.0, **kw)
    assert both.tile_var[0] == pytest.approx(urban.tile_var[0])
    assert both.tile_var[1] == pytest.approx(rural.tile_var[1])
    assert both.tile_var[1] > both.tile_var[0]  # the same prior but the rural share
    assert both.tile_var[2] == pytest.approx(urban.tile_var[2])  # a measured tile: no share
    np.testing.assert_allclose(both.tile_var + both.noise_var, urban.tile_var + urban.noise_var)


def test_spatial_parameters_without_a_place_share_read_as_one() -> None:
    """Files written before the place share read as 1 (the whole prior is the place's)."""
    raw = SpatialParameters(sigma2=0.1, range_km=1.0, tau2={"all": 0.2}).to_dict()
    assert raw["place_share"] == 1.0
    raw.pop("place_share")
    assert SpatialParameters.from_dict(raw).place_share == 1.0


def _changing_tiles(seed: int) -> tuple[np.ndarray, ...]:
    """150 tiles at 4 quarters: a static spatial field (0.1), a white offset drawn anew every
    quarter (0.05: its quarter-to-quarter correlation is 0) and test noise (0.05)."""
    rng = np.random.default_rng(seed)
    n, rows = 150, 4
    xy = rng.uniform(0, 20, size=(n, 2))
    d = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))
    field = rng.multivariate_normal(np.zeros(n), 0.1 * _c(d * RANGE / 3.0) + 1e-9 * np.eye(n))
    tile = np.repeat(np.arange(n), rows)
    times = np.tile(np.arange(rows, dtype=float), n)
    y = field[tile] + rng.normal(0, math.sqrt(0.05), tile.size)
    y += rng.normal(0, math.sqrt(0.05), tile.size)
    ids = np.array([f"t{j:03d}" for j in tile])
    return ids, times, y, np.full((tile.size, 1), 0.05), xy, tile


def test_fit_refits_rho_where_validation_rows_follow_training_rows() -> None:
    """Held-out last quarters of measured tiles tell how much a tile changes from quarter to
    quarter: the white offset's rho falls from the effect's 1 toward the truth, 0, and the
    validation NLL is lower than with the effect's rho. Validation tiles without training
    rows (a tile split) cannot tell it: rho stays the effect's."""
    ids, times, y, noise, xy, tile = _changing_tiles(7)
    train = times < 3
    fitted = _fit_layer(ids, times, y, noise, xy[tile], train, tile_xy=xy, tau2=0.15)
    kept = _fit_layer(ids, times, y, noise, xy[tile], train, tile_xy=xy, tau2=0.15, fit_rho=False)
    assert fitted.params.rho is not None and fitted.params.rho["all"] < 0.5
    assert kept.params.rho is None
    assert fitted.params.val_nll < kept.params.val_nll
    unseen = tile >= 120  # 30 tiles whose rows are all held out: 120 rows, none measured
    layer = _fit_layer(ids, times, y, noise, xy[tile], ~unseen, tile_xy=xy[:120], tau2=0.15)
    assert layer.params.rho is None


def test_a_refitted_rho_is_the_one_the_layer_predicts_with() -> None:
    """A layer whose parameters hold rho predicts as the same layer over a tile effect with
    that rho; files without it read as the effect's (``None``)."""
    ids, times, y, noise, xy, tile = _changing_tiles(3)
    train = times < 3

    def layer(effect_rho: float, layer_rho: float | None) -> LocalLayer:
        params = TileEffectParameters(
            tau2={"all": 0.15},
            rho=effect_rho,
            noise_scale=(1.0,),
            components=("noise",),
            latent_scale=1.0,
        )
        effect = _effect_on(params, ids, times, y, noise, train)
        spatial = SpatialParameters(
            sigma2=0.08,
            range_km=RANGE,
            tau2={"all": 0.07},
            neighbours=8,
            rho=None if layer_rho is None else {"all": layer_rho},
        )
        return LocalLayer(effect, spatial, tile_xy=xy)

    kw = {"tiles": ids[~train], "times": times[~train], "var_f": np.full((~train).sum(), 1e-4)}
    kw |= {"components": noise[~train], "xy": xy[tile][~train]}
    a = layer(0.3, None).predict(**kw)
    b = layer(0.95, 0.3).predict(**kw)
    np.testing.assert_allclose(a.shift, b.shift, rtol=1e-12)
    np.testing.assert_allclose(a.tile_var, b.tile_var, rtol=1e-12)
    raw = SpatialParameters(
        sigma2=0.1,
        range_km=1.0,
        tau2={"rural": 0.2, "urban": 0.3},
        rho={"rural": 0.4, "urban": 0.9},
    ).to_dict()
    assert SpatialParameters.from_dict(json.loads(json.dumps(raw))).rho == {
        "rural": 0.4,
        "urban": 0.9,
    }
    raw.pop("rho")
    assert SpatialParameters.from_dict(raw).rho is None


def test_fit_refits_one_rho_per_group() -> None:
    """Urban tiles whose white offset is drawn anew each quarter and rural tiles whose offset
    persists: the refitted rho is lower for the urban group than for the rural one."""
    rng = np.random.default_rng(11)
    n, rows = 200, 4
    xy = rng.uniform(0, 30, size=(n, 2))
    urban_tile = np.arange(n) % 2 == 0
    tile = np.repeat(np.arange(n), rows)
    times = np.tile(np.arange(rows, dtype=float), n)
    persistent = rng.normal(0, math.sqrt(0.1), n)[tile]
    fresh = rng.normal(0, math.sqrt(0.1), tile.size)
    y = np.where(urban_tile[tile], fresh, persistent) + rng.normal(0, math.sqrt(0.02), tile.size)
    ids = np.array([f"t{j:03d}" for j in tile])
    groups = np.where(urban_tile[tile], "urban", "rural")
    noise = np.full((tile.size, 1), 0.02)
    train, val = times < 3, times == 3
    params = TileEffectParameters(
        tau2={"rural": 0.1, "urban": 0.1},
        rho=0.9,
        noise_scale=(1.0,),
        components=("noise",),
        latent_scale=1.0,
    )
    effect = _effect_on(params, ids, times, y, noise, train, groups)
    layer = LocalLayer.fit(
        effect,
        tile_xy=xy,
        val_tiles=ids[val],
        val_xy=xy[tile][val],
        val_times=times[val],
        val_residual=y[val],
        val_var_f=np.full(val.sum(), 1e-4),
        val_components=noise[val],
        val_groups=groups[val],
    )
    rho = layer.params.rho
    assert rho is not None and set(rho) == {"rural", "urban"}
    assert rho["urban"] < 0.5 < rho["rural"]


def test_a_rho_per_group_matches_the_dense_joint_gaussian() -> None:
    """Two groups with their own rho (and tau²): each measured tile's offset is AR(1) with
    its group's rho, and the layer's prediction equals the dense joint Gaussian."""
    rho = {"rural": 0.5, "urban": 0.9}
    tau2 = {"rural": 0.03, "urban": 0.05}
    tiles, times, pos, v, noise, xy, residual, groups, effect = _grouped_data(4, tau2)
    spatial = SpatialParameters(
        sigma2=SIGMA2, range_km=RANGE, tau2=tau2, neighbours=len(xy), rho=rho
    )
    layer = LocalLayer(effect, spatial, tile_xy=xy[np.argsort(np.unique(tiles))])
    row_rho = np.array([rho[g] for g in groups])
    row_tau2 = np.array([tau2[g] for g in groups])
    d = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    same = tiles[:, None] == tiles[None]
    S = SIGMA2 * _c(d) + same * (
        row_tau2[:, None] * row_rho[:, None] ** np.abs(times[:, None] - times[None])
        + LAM * np.sqrt(np.outer(v, v))
    )
    S += np.diag(KAPPA * noise[:, 0])
    for j, time_t in ((3, 9.0), (4, 8.0)):
        tile_t, g = f"t{j:02d}", "urban" if j % 2 else "rural"
        v_t = v[tiles == tile_t][0]
        own = tiles == tile_t
        k = SIGMA2 * _c(np.sqrt(((pos - xy[j]) ** 2).sum(-1)))
        k = k + own * (tau2[g] * rho[g] ** np.abs(time_t - times) + LAM * np.sqrt(v_t * v))
        sol = np.linalg.solve(S, np.column_stack([residual, k]))
        target = {"tiles": [tile_t], "xy": xy[j : j + 1], "times": [time_t], "var_f": [v_t]}
        target |= {"components": np.full((1, 1), 0.05), "groups": [g]}
        pred = layer.predict(**target)
        # (the factors' 1e-9 jitter is the only difference)
        assert pred.shift[0] == pytest.approx(k @ sol[:, 0], rel=1e-7, abs=1e-9)
        var = SIGMA2 + tau2[g] + LAM * v_t - k @ sol[:, 1]
        assert pred.tile_var[0] == pytest.approx(var, rel=1e-7, abs=1e-9)
        one_rho = LocalLayer(effect, replace(spatial, rho=None), tile_xy=layer.tile_xy)
        other = one_rho.predict(**target)
        assert abs(other.tile_var[0] - var) > 1e-4  # the effect's one rho is another answer


def test_km_positions_either_side_of_the_180_meridian_are_neighbours_with_lon0() -> None:
    lon, lat = [179.999, -179.999], [51.6, 51.6]
    near = lonlat_to_km(lon, lat, lat0=51.6, lon0=180.0)
    assert np.hypot(*(near[1] - near[0])) == pytest.approx(
        0.002 * 111.195 * math.cos(math.radians(51.6)), rel=1e-3
    )
    far = lonlat_to_km(lon, lat, lat0=51.6)  # files written before lon0: as given
    assert np.hypot(*(far[1] - far[0])) > 20_000.0
    hawaii = ([-157.8, -155.1], [21.3, 19.7])
    np.testing.assert_array_equal(
        lonlat_to_km(*hawaii, lat0=20.5, lon0=-156.4), lonlat_to_km(*hawaii, lat0=20.5)
    )
    old = SpatialParameters(sigma2=0.1, range_km=2.0, tau2={"all": 0.2}).to_dict()
    del old["lon0"]
    assert SpatialParameters.from_dict(old).lon0 is None


def test_neighbour_query_matches_brute_force() -> None:
    """Each target's k nearest measured tiles other than its own (its own among the k + 1
    or not), sorted by slot, with the distances to them and between them; with as many
    neighbours as measured tiles the own tile's slot holds -1."""
    rng = np.random.default_rng(11)
    xy = rng.uniform(0.0, 20.0, (60, 2))
    targets = np.vstack([xy[:10] + 1e-3, rng.uniform(0.0, 20.0, (25, 2))])
    own = np.concatenate([np.arange(10), np.full(25, -1)])
    own[12] = 59  # a measured tile far from this target: not among its k + 1 nearest
    hood = _Neighbours(xy, 6).query(targets, own)
    full = np.linalg.norm(targets[:, None, :] - xy[None, :, :], axis=-1)
    assert 59 not in np.argsort(full[12])[:7]
    for i in range(targets.shape[0]):
        d = full[i].copy()
        if own[i] >= 0:
            d[own[i]] = np.inf
        want = np.sort(np.argsort(d, kind="stable")[:6])
        np.testing.assert_array_equal(hood.nb[i].numpy(), want)
        np.testing.assert_allclose(hood.d_star[i].numpy(), full[i, want], rtol=1e-12)
        members = hood.sets[hood.inverse[i]].numpy()
        np.testing.assert_array_equal(members, want)
        pair = np.linalg.norm(xy[want][:, None] - xy[want][None], axis=-1)
        np.testing.assert_allclose(hood.d_sets[hood.inverse[i]].numpy(), pair, atol=1e-12)
    every = _Neighbours(xy[:5], 5).query(xy[:5], np.arange(5))
    for i in range(5):
        assert every.nb[i].tolist() == [-1, *[j for j in range(5) if j != i]]


def test_neighbour_query_leaves_out_excluded_slots_as_brute_force() -> None:
    """With slots excluded, each target's k nearest measured tiles among the others (its own
    left out too), sorted by slot; a row with fewer than k others is filled with -1."""
    rng = np.random.default_rng(12)
    xy = rng.uniform(0.0, 20.0, (40, 2))
    targets = np.vstack([xy[:6] + 1e-3, rng.uniform(0.0, 20.0, (10, 2))])
    own = np.concatenate([np.arange(6), np.full(10, -1)])
    exclude = np.array([0, 1, 2, 17, 30, 31, 32, 33])
    hood = _Neighbours(xy, 5).query(targets, own, exclude=exclude)
    full = np.linalg.norm(targets[:, None, :] - xy[None, :, :], axis=-1)
    for i in range(targets.shape[0]):
        d = full[i].copy()
        d[exclude] = np.inf
        if own[i] >= 0:
            d[own[i]] = np.inf
        want = np.sort(np.argsort(d, kind="stable")[:5])
        np.testing.assert_array_equal(hood.nb[i].numpy(), want)
        np.testing.assert_allclose(hood.d_star[i].numpy(), full[i, want], rtol=1e-12)
        np.testing.assert_array_equal(hood.sets[hood.inverse[i]].numpy(), want)
    few = _Neighbours(xy[:6], 5).query(xy[:2], np.arange(2), exclude=np.array([2, 3]))
    for i in range(2):
        assert few.nb[i].tolist() == [-1, -1, *[j for j in (0, 1, 4, 5) if j != i]]


def test_leave_out_predicts_as_a_layer_conditioned_without_those_tiles() -> None:
    """Rows predicted with ``leave_out`` equal the same layer conditioned on every row but
    those of the tiles sharing their label (and the dense joint Gaussian of those rows): a
    held-out block's tiles, or one tile, scored from all the other conditioning rows."""
    rng = np.random.default_rng(3)
    tiles, times, pos, v, noise, xy = _data(rng, n_tiles=16)
    residual = rng.normal(0, 0.3, tiles.size)
    layer = _layer(tiles, times, v, noise, residual, xy, neighbours=6)
    ids = np.unique(tiles)
    block = np.array(["b0", "b0", "b1", "b2", "b2", "b2"])  # the units of t00 … t05
    rows = np.isin(tiles, ids[:6])
    row_block = block[np.searchsorted(ids, tiles[rows])]
    kw = {
        "tiles": tiles[rows],
        "times": times[rows] + 1.0,
        "xy": pos[rows],
        "var_f": v[rows],
        "components": noise[rows],
    }

    def check(pred: Any, labels: np.ndarray) -> None:
        """``pred`` at each label's rows equals the layer conditioned without its tiles."""
        for label in np.unique(labels):
            mine = labels == label
            out = np.isin(tiles, kw["tiles"][mine])
            keep_ids = np.unique(tiles[~out])
            alone = _layer(
                tiles[~out],
                times[~out],
                v[~out],
                noise[~out],
                residual[~out],
                xy[np.searchsorted(ids, keep_ids)],
                neighbours=6,
            ).predict(**{k: val[mine] for k, val in kw.items()})
            np.testing.assert_allclose(pred.shift[mine], alone.shift, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(pred.tile_var[mine], alone.tile_var, rtol=1e-10)
            np.testing.assert_allclose(pred.noise_var[mine], alone.noise_var, rtol=1e-10)

    left = layer.predict(leave_out=row_block, **kw)
    assert not left.seen.any()
    check(left, row_block)
    # a label per tile: each row leaves out its own tile only, in one batch
    check(layer.predict(leave_out=kw["tiles"], **kw), kw["tiles"])
    # with every other tile a neighbour, the dense Gaussian of the rows left in
    dense_layer = _layer(tiles, times, v, noise, residual, xy, neighbours=len(xy))
    one = dense_layer.predict(
        leave_out=np.array(["a"] * int((tiles == "t04").sum())),
        **{k: val[tiles[rows] == "t04"] for k, val in kw.items()},
    )
    out = tiles == "t04"
    target = ("t04", float(kw["times"][tiles[rows] == "t04"][0]), xy[4], v[out][0])
    mean, var = _dense(
        tiles[~out], times[~out], pos[~out], v[~out], noise[~out], residual[~out], target
    )
    assert one.shift[0] == pytest.approx(mean, rel=1e-8, abs=1e-10)
    assert one.tile_var[0] == pytest.approx(var, rel=1e-8, abs=1e-10)
    with pytest.raises(ValueError, match="one label per row"):
        layer.predict(leave_out=row_block[:-1], **kw)


def test_small_neighbour_queries_start_no_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A map block's query of a few hundred tiles runs on the calling thread (scipy starts a
    thread per core for ``workers=-1``), with the neighbours of a threaded query."""
    rng = np.random.default_rng(0)
    hood = _Neighbours(rng.uniform(0.0, 50.0, (400, 2)), 8)
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    small = rng.uniform(0.0, 50.0, (300, 2))
    got = hood.query(small, np.full(300, -1))
    assert started == []
    monkeypatch.setattr(threading.Thread, "start", real_start)
    big = np.concatenate([small, rng.uniform(0.0, 50.0, (PARALLEL_QUERY_TARGETS, 2))])
    threaded = hood.query(big, np.full(big.shape[0], -1))
    assert torch.equal(threaded.nb[:300], got.nb)
    assert torch.allclose(threaded.d_star[:300], got.d_star)


def test_tile_chunks_keep_each_tiles_rows_together() -> None:
    """Chunks of at most ``chunk_size`` distinct tiles cover every row once, in row order,
    with all rows of a tile in one chunk; one slice when the rows hold few enough tiles."""
    rng = np.random.default_rng(3)
    names = rng.choice([f"q{i}" for i in range(10)], size=200)
    assert tile_chunks(names, 10) == [slice(0, 200)]
    for tiles in (names, pd.Categorical(names, categories=[f"q{i}" for i in range(12)])):
        parts = tile_chunks(tiles, 3)
        assert len(parts) == 4
        rows = np.concatenate(parts)
        assert sorted(rows.tolist()) == list(range(200))
        for part in parts:
            assert np.all(np.diff(part) > 0)
            assert len(set(names[part])) <= 3
        owner = {name: i for i, part in enumerate(parts) for name in names[part]}
        assert all(owner[name] == i for i, part in enumerate(parts) for name in names[part])


def test_rows_at_tile_centres_give_the_same_numbers_in_any_chunks() -> None:
    """A map's rows (at their tiles' centres) are predicted in chunks of ``chunk_size``
    distinct tiles: how the tiles are cut into chunks changes nothing."""
    rng = np.random.default_rng(11)
    tiles, times, _pos, v, noise, xy = _data(rng, n_tiles=20)
    base = _layer(tiles, times, v, noise, rng.normal(0, 0.3, tiles.size), xy, neighbours=5)
    centres = {f"t{j:02d}": xy[j] for j in range(len(xy))} | {"new": np.array([5.0, 5.0])}

    def positions(ids: np.ndarray) -> np.ndarray:
        return np.array([centres[str(t)] for t in ids])

    layer = LocalLayer(base.effect, base.params, tile_xy=base.tile_xy, positions=positions)
    names = rng.choice(sorted(centres), size=50)
    kw = {
        "tiles": names,
        "times": np.full(50, 6.0),
        "var_f": rng.uniform(0.01, 0.03, 50),
        "components": np.full((50, 1), 0.05),
    }
    whole = layer.predict(**kw)
    chunked = layer.predict(chunk_size=3, **kw)
    for field in ("shift", "tile_var", "pull", "noise_var"):
        np.testing.assert_allclose(getattr(chunked, field), getattr(whole, field), rtol=1e-12)


def test_a_tests_shift_is_fitted_on_observations_and_given_back_to_them() -> None:
    """Over a tile effect with a tests shift ``gamma (c - c0)``, the layer is fitted on the
    validation rows net of their own shift (the same as a layer over an effect without one,
    given those net rows), conditions on the same rows, and reports each target row's shift
    apart from the tile's."""
    rng = np.random.default_rng(21)
    tiles, times, pos, v, noise, xy = _data(rng, n_tiles=30)
    residual = rng.normal(0, 0.3, tiles.size)
    gamma, centre = -1.5, 0.1
    base = TileEffectParameters(
        tau2={"all": TAU2}, rho=RHO, noise_scale=(KAPPA,), components=("meas",), latent_scale=LAM
    )
    moved = replace(base, tests_shift=(gamma,), tests_centre=(centre,))
    train = rng.random(tiles.size) < 0.7
    val = ~train

    def fitted(params: TileEffectParameters, val_r: np.ndarray) -> LocalLayer:
        effect = _effect_on(params, tiles, times, residual, noise, train)
        measured = np.unique(tiles[train])
        return LocalLayer.fit(
            effect,
            tile_xy=xy[[int(t[1:]) for t in measured]],
            val_tiles=tiles[val],
            val_xy=pos[val],
            val_times=times[val],
            val_residual=val_r,
            val_var_f=v[val],
            val_components=noise[val],
            max_iter=30,
        )

    with_shift = fitted(moved, residual[val])
    without = fitted(base, residual[val] - gamma * (noise[val, 0] - centre))
    assert with_shift.params.sigma2 == pytest.approx(without.params.sigma2, rel=1e-6)
    assert with_shift.params.range_km == pytest.approx(without.params.range_km, rel=1e-6)
    q_comp = rng.uniform(0.01, 0.3, (val.sum(), 1))
    q = {"tiles": tiles[val], "xy": pos[val], "times": times[val] + 1.0, "var_f": v[val]}
    a = with_shift.predict(**q, components=q_comp)
    b = without.predict(**q, components=q_comp)
    np.testing.assert_allclose(a.shift, b.shift, atol=1e-8)
    np.testing.assert_allclose(a.tile_var, b.tile_var, atol=1e-8)
    np.testing.assert_allclose(a.tests_shift, gamma * (q_comp[:, 0] - centre), atol=1e-12)
    assert b.tests_shift is not None and not b.tests_shift.any()


def _gp_prior_pair(kappa: float) -> tuple[LocalLayer, LocalLayer, np.ndarray]:
    """One layer with the tile effect's prior of an unmeasured tile and one with the GP's, on
    the same rows (effect noise scale ``kappa``), and the tiles' km positions."""
    rng = np.random.default_rng(11)
    tiles, times, _, v, noise, xy = _data(rng)
    residual = rng.normal(0, 0.3, tiles.size)
    params = TileEffectParameters(
        tau2={"all": TAU2}, rho=RHO, noise_scale=(kappa,), components=("noise",), latent_scale=LAM
    )
    effect = TileEffect(
        params, tiles=tiles, times=times, residual=residual, var_f=v, components=noise
    )
    order = np.argsort(np.unique(tiles))

    def layer(prior: str) -> LocalLayer:
        spatial = SpatialParameters(
            sigma2=SIGMA2, range_km=RANGE, tau2={"all": TAU2}, neighbours=8, unseen_prior=prior
        )
        return LocalLayer(effect, spatial, tile_xy=xy[order])

    return layer(UNSEEN_EFFECT), layer(UNSEEN_GP), xy


@pytest.mark.parametrize("kappa", [0.4, 1.3])
def test_the_gp_prior_gives_an_unmeasured_tile_the_gps_variance_less_the_fields_gain(
    kappa: float,
) -> None:
    """``UNSEEN_GP``: an unmeasured tile's tile variance is ``W - min(sigma², W) (1 -
    sigma²_nb / sigma²)`` with ``W = v + max(1 - kappa, 0) c``, the kriging variance
    ``sigma²_nb`` that of the tile effect's prior (``lambda v + tau² + sigma²_nb``, a dense
    reference above): ``W - (sigma² - sigma²_nb)`` where ``sigma² <= W`` (kappa 0.4), a share
    of ``W`` where the GP's variance is below the field's (kappa 1.3), never below ``W
    sigma²_nb / sigma²``; its test adds ``kappa c``; the pull and measured tiles' rows are
    unchanged."""
    effect_prior, gp_prior, xy = _gp_prior_pair(kappa)
    kw = {"tiles": ["t02", "zz", "yy"], "times": [7.0, 3.0, 1.0], "var_f": [0.01, 0.03, 0.02]}
    kw["components"] = np.array([[0.1], [0.2], [0.05]])
    at = np.array([xy[2], [1.0, 1.0], [400.0, 400.0]])  # measured, between, far from all
    a, b = effect_prior.predict(xy=at, **kw), gp_prior.predict(xy=at, **kw)
    vf, c = np.asarray(kw["var_f"]), kw["components"][:, 0]
    s2nb = a.tile_var - LAM * vf - TAU2
    assert s2nb[2] == pytest.approx(SIGMA2) and 0 < s2nb[1] < SIGMA2

    def gp_variance(whole: np.ndarray) -> np.ndarray:
        return whole - np.minimum(SIGMA2, whole) * (1.0 - s2nb / SIGMA2)

    whole = vf + max(1.0 - kappa, 0.0) * c
    want = gp_variance(whole)
    np.testing.assert_allclose(b.tile_var[1:], want[1:], rtol=1e-10, atol=1e-15)
    assert np.all(b.tile_var[1:] >= whole[1:] * s2nb[1:] / SIGMA2 - 1e-15)
    below = whole[1] < SIGMA2  # the GP's variance below the field's between the tiles
    assert below == (kappa > 1.0)
    if not below:
        assert b.tile_var[1] == pytest.approx(whole[1] - (SIGMA2 - s2nb[1]), rel=1e-10)
    np.testing.assert_allclose(b.noise_var[1:], kappa * c[1:], rtol=1e-12)
    assert b.tile_var[0] == a.tile_var[0] and b.noise_var[0] == a.noise_var[0]
    np.testing.assert_array_equal(a.shift, b.shift)
    # a map states the tile at given components (e.g. a typical row's), not the rows'
    typical = gp_prior.predict(xy=at, tile_components=[0.3], **kw)
    want_typical = gp_variance(vf + max(1.0 - kappa, 0.0) * 0.3)
    np.testing.assert_allclose(typical.tile_var[1:], want_typical[1:], rtol=1e-10, atol=1e-15)
    assert typical.tile_var[0] == a.tile_var[0]


@pytest.mark.parametrize("spread", ["gp", "tile effect"])
def test_fit_chooses_the_unmeasured_prior_that_the_unmeasured_tiles_follow(spread: str) -> None:
    """Unmeasured validation tiles whose residuals spread as the GP's noise says (``gp``) or
    as the tile effect's ``tau²`` says (``tile effect``): the fit chooses that prior, and
    records both validation NLLs."""
    rng = np.random.default_rng(12)
    n, tau2, noise_var = 300, 0.3, 0.05
    xy = rng.uniform(0, 60, size=(n, 2))
    held = rng.random(n) < 0.4
    offset_sd = np.where(held, 0.0 if spread == "gp" else math.sqrt(tau2), math.sqrt(tau2))
    layer = _fit_leaving_tiles_out(
        rng, xy, rng.normal(size=n) * offset_sd, held, noise_var=noise_var, tau2=tau2, neighbours=8
    )
    p = layer.params
    assert p.val_nll_unseen is not None and set(p.val_nll_unseen) == {UNSEEN_EFFECT, UNSEEN_GP}
    want = UNSEEN_GP if spread == "gp" else UNSEEN_EFFECT
    assert p.unseen_prior == want
    other = UNSEEN_EFFECT if want == UNSEEN_GP else UNSEEN_GP
    assert p.val_nll_unseen[want] < p.val_nll_unseen[other]
    again = SpatialParameters.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p


def test_spatial_parameters_without_an_unseen_prior_read_as_the_tile_effects() -> None:
    """Files written before the choice read as the tile effect's prior; a wrong name is
    refused."""
    raw = SpatialParameters(sigma2=0.1, range_km=1.0, tau2={"all": 0.2}).to_dict()
    assert "val_nll_unseen" not in raw
    raw.pop("unseen_prior")
    assert SpatialParameters.from_dict(raw).unseen_prior == UNSEEN_EFFECT
    with pytest.raises(ValueError, match="unseen_prior"):
        SpatialParameters(sigma2=0.1, range_km=1.0, tau2={"all": 0.2}, unseen_prior="kriging")


def test_an_offset_shared_by_every_tile_runs_the_range_to_its_bound() -> None:
    """Tiles 10 km across that share one offset: the field that explains the held-out tiles
    best is one constant, so the fitted range sits at the upper bound, and
    :func:`range_at_bound` names it; a field of a few km stays inside the bounds."""
    rng = np.random.default_rng(0)
    n = 150
    xy = rng.uniform(0, 10, (n, 2))
    held = rng.random(n) < 0.5
    shared = np.full(n, 0.3) + rng.normal(0, 0.01, n)
    layer = _fit_leaving_tiles_out(rng, xy, shared, held, noise_var=0.05, tau2=0.1, neighbours=8)
    assert range_at_bound(layer.params.range_km) == max(RANGE_BOUNDS_KM)
    d = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    local = rng.multivariate_normal(np.zeros(n), 0.1 * _c(d / 1.5) + 1e-9 * np.eye(n))
    layer = _fit_leaving_tiles_out(rng, xy, local, held, noise_var=0.05, tau2=0.1, neighbours=8)
    assert range_at_bound(layer.params.range_km) is None
    assert min(RANGE_BOUNDS_KM) < layer.params.range_km < max(RANGE_BOUNDS_KM)
    assert range_at_bound(min(RANGE_BOUNDS_KM)) == min(RANGE_BOUNDS_KM)
