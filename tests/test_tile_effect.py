"""The tile effect (geodbk.tile_effect): dense float64 reference, fitting, persistence."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from geodbk import likelihoods
from geodbk.errors import DataError, ModelFileError
from geodbk.geo.quadkey import quadkey_to_tile, tile_keys
from geodbk.geo.tile_effect_files import (
    has_tile_effect,
    load_tile_effect,
    save_tile_effect,
    tile_effect_files,
)
from geodbk.tile_effect import (
    TileEffect,
    TileEffectParameters,
    choose_objective,
    tile_id_strings,
    urban_groups,
)


@pytest.fixture(autouse=True)
def _group_every_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Factor the measured tiles in groups of similar row counts however few they are, so
    that the dense references here check the grouped factors (a run's default groups only
    hundreds of tiles)."""
    import geodbk.tile_effect as te

    monkeypatch.setitem(te.row_count_groups.__kwdefaults__, "min_tiles", 1)


def _rows(rng: np.random.Generator, n_tiles: int, *, tau2: float, rho: float, noise: float):
    """Tiles observed in a random subset of 12 quarters: AR(1) offset plus noise."""
    tiles, times, y = [], [], []
    for j in range(n_tiles):
        q = np.sort(rng.choice(12, size=int(rng.integers(1, 13)), replace=False)).astype(float)
        cov = tau2 * rho ** np.abs(q[:, None] - q[None, :])
        u = rng.multivariate_normal(np.zeros(q.size), cov)
        tiles += [f"t{j:03d}"] * q.size
        times += list(q)
        y += list(u + rng.normal(0.0, np.sqrt(noise), q.size))
    return np.array(tiles), np.array(times), np.array(y)


def _dense_tile(
    effect: TileEffect, tile: str, time: float, var_f: float, group: str = "all"
) -> tuple[float, float]:
    """Posterior mean and variance of the tile's GP error plus offset by the dense joint
    Gaussian (float64): K = tau²_g rho^|dt| + lambda sqrt(v v'), E = diag(kappa' c), with the
    tau² of the tile's group g (its latest row's; the row's own for an unseen tile)."""
    p = effect.params
    rows = np.flatnonzero(effect.tiles == tile)
    rows = rows[np.argsort(effect.times[rows], kind="stable")][-effect.max_rows :]
    tau2 = p.tau2[effect.groups[rows[-1]] if rows.size else group]
    prior = tau2 + p.latent_scale * var_f
    if rows.size == 0:
        return 0.0, prior
    t, v = effect.times[rows], effect.var_f[rows]
    K = tau2 * p.rho ** np.abs(t[:, None] - t[None, :]) + p.latent_scale * np.sqrt(np.outer(v, v))
    E = np.diag(effect.components[rows] @ np.array(p.noise_scale))
    k = tau2 * p.rho ** np.abs(time - t) + p.latent_scale * np.sqrt(var_f * v)
    sol = np.linalg.solve(K + E, np.column_stack([effect.residual[rows], k]))
    return float(k @ sol[:, 0]), float(prior - k @ sol[:, 1])


def _effect(params, rng, tiles, times, residual, components, **kw) -> TileEffect:
    """A tile effect on these rows with random GP latent variances in [0, 0.05]."""
    var_f = rng.uniform(0.0, 0.05, residual.size)
    return TileEffect(
        params,
        tiles=tiles,
        times=times,
        residual=residual,
        var_f=var_f,
        components=components,
        **kw,
    )


def test_prediction_matches_the_dense_reference() -> None:
    rng = np.random.default_rng(0)
    tiles, times, r = _rows(rng, 30, tau2=0.3, rho=0.8, noise=0.2)
    comp = np.column_stack([np.full(r.size, 0.1), rng.uniform(0.01, 0.2, r.size)])
    params = TileEffectParameters(
        tau2=0.25, rho=0.7, noise_scale=(0.6, 1.3), components=("floor", "meas"), latent_scale=1.7
    )
    # max_rows=5 truncates the tiles seen in more than 5 quarters
    effect = _effect(params, rng, tiles, times, r, comp, max_rows=5)
    q_tiles = np.array(["t000", "t007", "t013", "t029", "unseen", "t007"])
    q_times = np.array([3.0, 11.0, 0.0, 6.5, 2.0, 20.0])
    q_comp = rng.uniform(0.01, 0.3, (q_tiles.size, 2))
    q_vf = rng.uniform(0.0, 0.05, q_tiles.size)
    pred = effect.predict(
        tiles=q_tiles, times=q_times, var_f=q_vf, components=q_comp, chunk_size=2, tile_chunk=3
    )
    for i, (tile, t) in enumerate(zip(q_tiles, q_times, strict=True)):
        mean, var = _dense_tile(effect, tile, t, q_vf[i])
        assert pred.shift[i] == pytest.approx(mean, abs=1e-8)  # jitter 1e-9 on K + E
        assert pred.tile_var[i] == pytest.approx(var, abs=1e-8)
    np.testing.assert_allclose(pred.noise_var, q_comp @ np.array([0.6, 1.3]), rtol=1e-12)
    assert pred.seen.tolist() == [True, True, True, True, False, True]
    assert pred.shift[4] == 0.0 and pred.tile_var[4] == pytest.approx(0.25 + 1.7 * q_vf[4])
    # far from the tile's quarters the offset forgets: back towards the prior
    assert pred.tile_var[5] - 1.7 * q_vf[5] > pred.tile_var[1] - 1.7 * q_vf[1]


def test_tiles_grouped_by_row_count_keep_every_row_and_the_same_predictions() -> None:
    """Each tile falls in one group, cut to a width that holds all its rows, and predictions
    from the grouped factors equal those of the padded layout (one group, ``steps=()``)."""
    from geodbk import tile_effect as te

    rng = np.random.default_rng(4)
    tiles, times, r = _rows(rng, 40, tau2=0.3, rho=0.8, noise=0.2)
    comp = np.column_stack([np.full(r.size, 0.1), rng.uniform(0.01, 0.2, r.size)])
    params = TileEffectParameters(
        tau2=0.25, rho=0.7, noise_scale=(0.6, 1.3), components=("floor", "meas"), latent_scale=1.7
    )
    effect = _effect(params, rng, tiles, times, r, comp)
    lay = effect._layout()
    count = lay.mask.sum(-1).numpy()
    index = np.array([5, 0, 5, 17, 39, 2])  # repeats allowed
    groups = te.row_count_groups(lay, index, steps=(1, 3, 6), min_tiles=1)
    entries = np.concatenate([e for e, _ in groups])
    assert sorted(entries.tolist()) == list(range(index.size))
    assert len(groups) > 1
    # too few tiles for a group of their own: they join the next step's, the widest at last
    merged = te.row_count_groups(lay, index, steps=(1, 3, 6), min_tiles=index.size)
    assert len(merged) == 1 and merged[0][1] == lay.mask.shape[1]
    np.testing.assert_array_equal(merged[0][0], np.arange(index.size))
    two = te.row_count_groups(lay, np.arange(40), steps=(3,), min_tiles=1)
    small = count <= 3
    assert [e.size for e, _ in two] == [int(small.sum()), int((~small).sum())]
    for e, width in groups:
        assert (count[index[e]] <= width).all()
        sub = lay.subset(index[e], width=width)
        np.testing.assert_array_equal(sub.mask.sum(-1).numpy(), count[index[e]])
        kept = sub.residual[sub.mask].numpy()
        np.testing.assert_array_equal(
            kept,
            lay.residual[torch.as_tensor(index[e])][lay.mask[torch.as_tensor(index[e])]].numpy(),
        )
    q_tiles = np.array([f"t{j:03d}" for j in range(40)] + ["unseen"])
    kw = {
        "tiles": q_tiles,
        "times": rng.uniform(0.0, 12.0, q_tiles.size),
        "var_f": rng.uniform(0.0, 0.05, q_tiles.size),
        "components": rng.uniform(0.01, 0.3, (q_tiles.size, 2)),
    }
    defaults = te.row_count_groups.__kwdefaults__
    try:
        te.row_count_groups.__kwdefaults__ = {"steps": te.ROW_COUNT_STEPS, "min_tiles": 1}
        grouped = effect.predict(**kw)
        te.row_count_groups.__kwdefaults__ = {"steps": (), "min_tiles": 1}
        padded = effect.predict(**kw)
    finally:
        te.row_count_groups.__kwdefaults__ = defaults
    np.testing.assert_allclose(grouped.shift, padded.shift, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grouped.tile_var, padded.tile_var, rtol=1e-12, atol=1e-14)


def test_prediction_with_a_tau2_per_group_matches_the_dense_reference() -> None:
    rng = np.random.default_rng(5)
    tiles, times, r = _rows(rng, 30, tau2=0.3, rho=0.8, noise=0.2)
    urban = np.array([int(t[1:]) % 3 == 0 for t in tiles])  # constant within a tile
    comp = np.column_stack([np.full(r.size, 0.1), rng.uniform(0.01, 0.2, r.size)])
    params = TileEffectParameters(
        tau2={"urban": 0.6, "rural": 0.05},
        rho=0.9,
        noise_scale=(0.5, 1.1),
        components=("floor", "meas"),
        latent_scale=0.8,
    )
    assert params.groups == ("rural", "urban")
    effect = _effect(params, rng, tiles, times, r, comp, groups=urban_groups(urban))
    q_tiles = np.array(["t000", "t001", "t003", "t004", "new_u", "new_r"])
    q_groups = np.array(["urban", "rural", "urban", "rural", "urban", "rural"])
    q_times = np.array([3.0, 11.0, 0.0, 6.5, 2.0, 2.0])
    q_vf = rng.uniform(0.0, 0.05, q_tiles.size)
    pred = effect.predict(
        tiles=q_tiles,
        times=q_times,
        var_f=q_vf,
        components=rng.uniform(0.01, 0.3, (q_tiles.size, 2)),
        groups=q_groups,
    )
    for i in range(q_tiles.size):
        mean, var = _dense_tile(effect, q_tiles[i], q_times[i], q_vf[i], q_groups[i])
        assert pred.shift[i] == pytest.approx(mean, abs=1e-8)
        assert pred.tile_var[i] == pytest.approx(var, abs=1e-8)
    # an unseen tile takes its own group's prior
    assert pred.tile_var[4] == pytest.approx(0.6 + 0.8 * q_vf[4])
    assert pred.tile_var[5] == pytest.approx(0.05 + 0.8 * q_vf[5])
    with pytest.raises(ValueError, match="give groups"):
        effect.predict(tiles=q_tiles, times=q_times, var_f=q_vf, components=np.ones((6, 2)))
    with pytest.raises(DataError, match="suburban"):
        effect.predict(
            tiles=q_tiles[:1],
            times=q_times[:1],
            var_f=q_vf[:1],
            components=np.ones((1, 2)),
            groups=["suburban"],
        )


def test_fit_learns_a_tau2_per_group() -> None:
    rng = np.random.default_rng(6)
    a = _rows(rng, 300, tau2=0.4, rho=0.95, noise=0.1)
    b = _rows(rng, 300, tau2=0.02, rho=0.95, noise=0.1)
    tiles = np.concatenate([a[0], np.char.add("b", b[0])])
    times, y = np.concatenate([a[1], b[1]]), np.concatenate([a[2], b[2]])
    groups = np.where(np.char.startswith(tiles, "b"), "quiet", "busy")
    val = rng.random(y.size) < 0.2
    kw = _split_at(tiles, times, y, val)
    grouped = TileEffect.fit(**kw, groups=groups[~val], val_groups=groups[val])
    pooled = TileEffect.fit(**kw)
    tau2 = grouped.params.tau2
    assert set(tau2) == {"busy", "quiet"}
    assert 0.25 < tau2["busy"] < 0.6 and tau2["quiet"] < 0.08
    assert grouped.params.val_nll < pooled.params.val_nll - 0.01
    # each group needs validation rows; groups for both splits or neither
    with pytest.raises(DataError, match="quiet"):
        TileEffect.fit(**kw, groups=groups[~val], val_groups=np.full(val.sum(), "busy"))
    with pytest.raises(ValueError, match="neither"):
        TileEffect.fit(**kw, groups=groups[~val])


def _split(tiles, times, y, rng):
    return _split_at(tiles, times, y, rng.random(y.size) < 0.2)


def _split_at(tiles, times, y, val):
    return {
        "tiles": tiles[~val],
        "times": times[~val],
        "residual": y[~val],
        "var_f": np.zeros((~val).sum()),
        "components": np.full(((~val).sum(), 1), 0.2),
        "val_tiles": tiles[val],
        "val_times": times[val],
        "val_residual": y[val],
        "val_var_f": np.zeros(val.sum()),
        "val_components": np.full((val.sum(), 1), 0.2),
        "component_names": ("noise",),
    }


def test_fit_recovers_a_persistent_offset_and_lowers_validation_nll() -> None:
    rng = np.random.default_rng(1)
    tiles, times, y = _rows(rng, 400, tau2=0.3, rho=0.95, noise=0.1)
    effect = TileEffect.fit(**_split(tiles, times, y, rng))
    p = effect.params
    assert 0.2 < p.tau2["all"] < 0.45
    assert p.rho > 0.8
    # the GP noise was 0.2 for a true 0.1: the refit halves it
    assert 0.35 < p.noise_scale[0] < 0.7
    assert p.val_nll is not None and p.val_nll_without is not None
    assert p.val_nll < p.val_nll_without - 0.1


def test_fit_without_an_offset_keeps_the_noise() -> None:
    rng = np.random.default_rng(2)
    tiles, times, y = _rows(rng, 400, tau2=1e-8, rho=0.5, noise=0.2)
    effect = TileEffect.fit(**_split(tiles, times, y, rng))
    assert effect.params.tau2["all"] < 0.02
    assert 0.85 < effect.params.noise_scale[0] < 1.15
    assert effect.params.val_nll == pytest.approx(effect.params.val_nll_without, abs=0.01)


def test_with_rows_conditions_on_more_rows() -> None:
    params = TileEffectParameters(tau2=0.5, rho=1.0, noise_scale=(1.0,), components=("noise",))
    kw = {"var_f": [0.0], "components": [[0.1]]}
    effect = TileEffect(params, tiles=["a"], times=[0.0], residual=[1.0], **kw)
    more = effect.with_rows(tiles=["a"], times=[1.0], residual=[1.0], **kw)
    q = {"tiles": ["a"], "times": [2.0], "var_f": [0.0], "components": [[0.1]]}
    one, two = effect.predict(**q), more.predict(**q)
    # rho = 1, no GP error: a constant offset, the precision-weighted mean of the residuals
    assert one.shift[0] == pytest.approx(0.5 / 0.6)
    assert two.shift[0] == pytest.approx(20.0 / 22.0)
    assert two.tile_var[0] == pytest.approx(1.0 / (1 / 0.5 + 2 / 0.1))


def test_save_and_load_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(3)
    tiles, times, y = _rows(rng, 50, tau2=0.3, rho=0.9, noise=0.1)
    effect = TileEffect.fit(**_split(tiles, times, y, rng))
    save_tile_effect(effect, tmp_path)
    assert has_tile_effect(tmp_path)
    back = load_tile_effect(tmp_path)
    assert back.params == effect.params
    q = {
        "tiles": tiles[:20],
        "times": times[:20] + 0.5,
        "var_f": np.full(20, 0.01),
        "components": np.full((20, 1), 0.2),
    }
    a, b = effect.predict(**q), back.predict(**q)
    np.testing.assert_array_equal(a.shift, b.shift)
    np.testing.assert_array_equal(a.tile_var, b.tile_var)


def test_save_and_load_keep_the_groups(tmp_path) -> None:
    rng = np.random.default_rng(7)
    tiles, times, y = _rows(rng, 60, tau2=0.3, rho=0.9, noise=0.1)
    groups = urban_groups(np.char.endswith(tiles, "1"))
    val = rng.random(y.size) < 0.3
    effect = TileEffect.fit(
        **_split_at(tiles, times, y, val), groups=groups[~val], val_groups=groups[val]
    )
    save_tile_effect(effect, tmp_path)
    back = load_tile_effect(tmp_path)
    assert back.params == effect.params and back.params.groups == ("rural", "urban")
    np.testing.assert_array_equal(back.groups, effect.groups)
    q = {
        "tiles": np.append(tiles[:10], "unseen"),
        "times": np.append(times[:10], 3.0),
        "var_f": np.full(11, 0.01),
        "components": np.full((11, 1), 0.2),
        "groups": np.append(groups[:10], "urban"),
    }
    np.testing.assert_array_equal(effect.predict(**q).tile_var, back.predict(**q).tile_var)


def test_a_file_with_one_tau2_still_loads(tmp_path) -> None:
    """Files written before the groups (``tau2`` one float, no ``group`` column)."""
    import pyarrow.parquet as pq

    params = TileEffectParameters(tau2=0.5, rho=1.0, noise_scale=(1.0,), components=("noise",))
    effect = TileEffect(
        params, tiles=["a"], times=[0.0], residual=[1.0], var_f=[0.0], components=[[0.1]]
    )
    save_tile_effect(effect, tmp_path)
    doc_path, rows_path = tile_effect_files(tmp_path)
    doc = json.loads(doc_path.read_text())
    doc_path.write_text(json.dumps({**doc, "tau2": 0.5}))
    pq.write_table(pq.read_table(rows_path).drop_columns(["group"]), rows_path)
    back = load_tile_effect(tmp_path)
    assert back.params.tau2 == {"all": 0.5} and back.groups.tolist() == ["all"]
    got = back.predict(tiles=["a"], times=[1.0], var_f=[0.0], components=[[0.1]])
    assert got.shift[0] == pytest.approx(0.5 / 0.6)


def test_bad_input_is_refused(tmp_path) -> None:
    rng = np.random.default_rng(4)
    tiles, times, y = _rows(rng, 20, tau2=0.3, rho=0.9, noise=0.1)
    kw = _split(tiles, times, y, rng)
    with pytest.raises(DataError, match="validation rows"):
        TileEffect.fit(**{**kw, **{k: v[:0] for k, v in kw.items() if k.startswith("val_")}})
    with pytest.raises(ValueError, match="differ in length"):
        TileEffect.fit(**{**kw, "residual": kw["residual"][:-1]})
    with pytest.raises(DataError, match="non-finite"):
        TileEffect.fit(
            **{
                **kw,
                "residual": np.where(np.arange(kw["residual"].size) == 0, np.nan, kw["residual"]),
            }
        )
    with pytest.raises(ModelFileError, match="tile-effect"):
        load_tile_effect(tmp_path)


@pytest.mark.parametrize(
    ("noise", "cov"),
    [
        (likelihoods.GaussianNoise(init=0.3), None),
        (likelihoods.TestsNoise(init=0.4), torch.tensor([1.0, 2.0, 7.0])),
        (
            likelihoods.TestsNoise(init=0.4, devices=True, learn_power=True),
            torch.tensor([[1.0, 1.0], [9.0, 3.0]]),
        ),
        (
            likelihoods.TestsNoise(init=0.4, devices=True, urban=True),
            torch.tensor([[4.0, 2.0, 1.0], [1.0, 1.0, 0.0]]),
        ),
    ],
)
def test_noise_components_sum_to_the_variance(noise, cov) -> None:
    n = 3 if cov is None else cov.shape[0]
    comp = noise.components(cov, n=n)
    assert comp.shape == (n, len(noise.component_names))
    torch.testing.assert_close(comp.sum(-1), noise.variance(cov).expand(n))
    assert bool((comp >= 0).all())


def test_persistent_share_matches_the_dense_reference() -> None:
    """tau_j² = tau²_g + sum_k mu_k mean(c_jk): a measured tile's prior grows with its rows'
    noise components; an unseen tile keeps the place's tau²_g and its row's noise adds mu'c."""
    rng = np.random.default_rng(3)
    tiles, times, r = _rows(rng, 20, tau2=0.3, rho=0.8, noise=0.2)
    comp = np.column_stack([np.full(r.size, 0.1), rng.uniform(0.01, 0.5, r.size)])
    mu = np.array([0.0, 0.8])
    params = TileEffectParameters(
        tau2=0.1,
        rho=0.85,
        noise_scale=(0.6, 1.3),
        components=("floor", "meas"),
        latent_scale=1.2,
        persistent_scale=tuple(mu),
    )
    effect = _effect(params, rng, tiles, times, r, comp, max_rows=6)
    q_tiles = np.array(["t001", "t004", "t011", "unseen"])
    q_times = np.array([3.0, 12.0, 1.0, 2.0])
    q_comp = rng.uniform(0.01, 0.3, (q_tiles.size, 2))
    q_vf = rng.uniform(0.0, 0.05, q_tiles.size)
    pred = effect.predict(tiles=q_tiles, times=q_times, var_f=q_vf, components=q_comp)
    for i, tile in enumerate(q_tiles):
        rows = np.flatnonzero(effect.tiles == tile)
        rows = rows[np.argsort(effect.times[rows], kind="stable")][-effect.max_rows :]
        tau2 = 0.1 + (comp[rows].mean(axis=0) @ mu if rows.size else 0.0)
        prior = tau2 + 1.2 * q_vf[i]
        if rows.size == 0:
            mean, var = 0.0, prior
        else:
            t, v = effect.times[rows], effect.var_f[rows]
            K = tau2 * 0.85 ** np.abs(t[:, None] - t[None]) + 1.2 * np.sqrt(np.outer(v, v))
            E = np.diag(comp[rows] @ np.array([0.6, 1.3]))
            k = tau2 * 0.85 ** np.abs(q_times[i] - t) + 1.2 * np.sqrt(q_vf[i] * v)
            sol = np.linalg.solve(K + E, np.column_stack([effect.residual[rows], k]))
            mean, var = k @ sol[:, 0], prior - k @ sol[:, 1]
        assert pred.shift[i] == pytest.approx(mean, abs=1e-8)
        assert pred.tile_var[i] == pytest.approx(var, abs=1e-8)
    noise = q_comp @ np.array([0.6, 1.3])
    np.testing.assert_allclose(pred.noise_var[:3], noise[:3], rtol=1e-12)
    assert pred.noise_var[3] == pytest.approx(noise[3] + q_comp[3] @ mu)
    # the share matters: without it a measured tile's variance differs
    plain = _effect(
        dataclasses.replace(params, persistent_scale=(0.0, 0.0)),
        np.random.default_rng(3),
        tiles,
        times,
        r,
        comp,
        max_rows=6,
    )
    plain.var_f = effect.var_f
    other = plain.predict(tiles=q_tiles, times=q_times, var_f=q_vf, components=q_comp)
    assert np.abs(other.tile_var[:3] - pred.tile_var[:3]).max() > 1e-3


def test_old_files_without_a_persistent_share_read_as_zero() -> None:
    raw = TileEffectParameters(
        tau2=0.2, rho=0.9, noise_scale=(1.0, 1.0), components=("floor", "meas")
    ).to_dict()
    assert raw["persistent_scale"] == [0.0, 0.0]
    raw.pop("persistent_scale")
    assert TileEffectParameters.from_dict(raw).persistent_scale == (0.0, 0.0)


@pytest.mark.parametrize("share", [0.3, 1.0])
def test_place_share_moves_an_unseen_tiles_tau2_to_the_test_noise(share: float) -> None:
    """With ``place_share = c`` an unseen tile keeps ``lambda v + c tau²`` as its tile
    variance and ``(1 - c) tau²`` goes to its noise; a measured tile's rows and every row's
    ``tile_var + noise_var`` are those of ``c = 1``."""
    rng = np.random.default_rng(5)
    tiles, times, r = _rows(rng, 30, tau2=0.2, rho=0.9, noise=0.05)
    comp = np.column_stack([np.full(r.size, 0.02), np.full(r.size, 0.03)])
    params = TileEffectParameters(
        tau2=0.2, rho=0.9, noise_scale=(1.0, 1.0), components=("floor", "meas"), latent_scale=1.5
    )
    effect = _effect(dataclasses.replace(params, place_share=share), rng, tiles, times, r, comp)
    q_tiles = np.array([tiles[0], "never-seen", "never-seen"])
    kw = {
        "tiles": q_tiles,
        "times": np.array([3.0, 3.0, 7.0]),
        "var_f": np.array([0.01, 0.02, 0.04]),
        "components": np.full((3, 2), 0.02),
    }
    pred = effect.predict(**kw)
    whole = effect.predict(**kw, place_share=1.0)
    assert pred.seen.tolist() == [True, False, False]
    np.testing.assert_allclose(pred.tile_var[1:], 1.5 * kw["var_f"][1:] + share * 0.2, rtol=1e-12)
    np.testing.assert_allclose(whole.tile_var[1:], 1.5 * kw["var_f"][1:] + 0.2, rtol=1e-12)
    np.testing.assert_allclose(
        pred.tile_var + pred.noise_var, whole.tile_var + whole.noise_var, rtol=1e-12
    )
    assert pred.tile_var[0] == whole.tile_var[0] and pred.noise_var[0] == whole.noise_var[0]
    np.testing.assert_array_equal(pred.shift, whole.shift)


def test_first_rows_conditions_on_the_leading_rows_only() -> None:
    rng = np.random.default_rng(6)
    tiles, times, r = _rows(rng, 20, tau2=0.2, rho=0.9, noise=0.05)
    comp = np.full((r.size, 1), 0.05)
    params = TileEffectParameters(tau2=0.2, rho=0.9, noise_scale=(1.0,), components=("meas",))
    effect = _effect(params, rng, tiles, times, r, comp)
    n = int(np.flatnonzero(tiles == tiles[-1])[0])  # every row of the last tile left out
    head = effect.first_rows(n)
    assert head.params is effect.params and head.tiles.size == n
    kw = {"times": np.array([5.0]), "var_f": np.array([0.01]), "components": np.array([[0.05]])}
    assert effect.predict(tiles=tiles[-1:], **kw).seen[0]
    assert not head.predict(tiles=tiles[-1:], **kw).seen[0]
    np.testing.assert_array_equal(
        head.predict(tiles=tiles[:1], **kw).shift, effect.predict(tiles=tiles[:1], **kw).shift
    )


def test_the_place_share_round_trips_and_old_files_read_as_one() -> None:
    params = TileEffectParameters(
        tau2=0.2, rho=0.9, noise_scale=(1.0,), components=("meas",), place_share=0.35
    )
    raw = params.to_dict()
    assert TileEffectParameters.from_dict(raw).place_share == 0.35
    raw.pop("place_share")
    assert TileEffectParameters.from_dict(raw).place_share == 1.0
    with pytest.raises(ValueError, match="place_share"):
        dataclasses.replace(params, place_share=0.0)


def test_an_unseen_tile_keeps_at_least_the_gps_variance_under_a_place_share() -> None:
    """``split_unseen_prior`` with ``lambda`` near 0: ``c tau²`` alone would map an unmeasured
    place narrower than the GP's own ``v_f``; it keeps ``v_f`` where the whole prior holds it
    (all of the prior where ``v_f`` exceeds it), moves only the rest to the noise, and leaves
    measured rows and every row's total alone."""
    from geodbk.tile_effect import TileEffectPrediction, split_unseen_prior

    lam, tau2, c = 1e-6, 0.2, 0.3
    var_f = np.array([0.01, 0.1, 0.5, 0.1])
    seen = np.array([False, False, False, True])
    pred = TileEffectPrediction(
        shift=np.zeros(4),
        tile_var=np.where(seen, 0.05, lam * var_f + tau2),
        noise_var=np.full(4, 0.3),
        persistent_var=np.zeros(4),
        seen=seen,
    )
    out = split_unseen_prior(pred, var_f=var_f, latent_scale=lam, place_share=c)
    want = [lam * 0.01 + c * tau2, 0.1, lam * 0.5 + tau2, 0.05]  # c P; v_f; the whole prior; seen
    np.testing.assert_allclose(out.tile_var, want, rtol=1e-12)
    np.testing.assert_allclose(out.tile_var + out.noise_var, pred.tile_var + pred.noise_var)
    assert out.noise_var[3] == pred.noise_var[3]
    assert split_unseen_prior(pred, var_f=var_f, latent_scale=lam, place_share=1.0) is pred


def test_a_place_share_above_1_takes_an_unseen_tile_s_width_from_one_test_s_noise() -> None:
    """``split_unseen_prior`` with ``c > 1``: an unmeasured tile's variance grows to ``lambda
    v_f + c P`` out of one test's own noise, at most all of it (the persistent part stays
    the testers'), so every row's total and the measured rows are unchanged, the tile
    quantity never passes one test's, and it widens with ``c``."""
    from geodbk.tile_effect import TileEffectPrediction, split_unseen_prior

    lam, tau2 = 1.0, 0.1
    var_f = np.array([0.02, 0.02, 0.02, 0.02])
    seen = np.array([False, False, False, True])
    noise = np.array([0.3, 0.05, 0.3, 0.3])
    persistent = np.array([0.0, 0.0, 0.28, 0.0])
    pred = TileEffectPrediction(
        shift=np.zeros(4),
        tile_var=np.where(seen, 0.04, lam * var_f + tau2),
        noise_var=noise,
        persistent_var=persistent,
        seen=seen,
    )
    total = pred.tile_var + pred.noise_var
    out = split_unseen_prior(pred, var_f=var_f, latent_scale=lam, place_share=2.0)
    # 0.02 + 2 P where the noise allows; all of a small noise; not the persistent part
    want = [0.02 + 2 * tau2, 0.12 + 0.05, 0.12 + 0.02, 0.04]
    np.testing.assert_allclose(out.tile_var, want, rtol=1e-12)
    np.testing.assert_allclose(out.tile_var + out.noise_var, total, rtol=1e-12)
    assert np.all(out.noise_var >= out.persistent_var - 1e-15)
    wider = split_unseen_prior(pred, var_f=var_f, latent_scale=lam, place_share=3.0)
    assert np.all(wider.tile_var >= out.tile_var) and wider.tile_var[0] > out.tile_var[0]
    assert np.all(wider.tile_var <= total + 1e-15) and wider.tile_var[3] == pred.tile_var[3]


@pytest.mark.parametrize("share", [0.3, 0.999, 1.001, 2.0])
def test_a_prior_below_the_gps_variance_is_kept_at_every_place_share(share: float) -> None:
    """An unmeasured tile's prior below ``lambda v_f`` (the GP prior less what a field
    explains, ``gp_unseen_variance``) holds no offset to split: every place share keeps it,
    as ``c = 1`` does, so the split is continuous at 1 and a share below 1 never widens a
    row; a row above ``lambda v_f`` still moves with ``c``."""
    from geodbk.tile_effect import TileEffectPrediction, split_unseen_prior

    lam = 1.0
    var_f = np.array([0.10, 0.10])
    seen = np.array([False, False])
    pred = TileEffectPrediction(
        shift=np.zeros(2),
        tile_var=np.array([0.06, 0.20]),  # below v_f (a field explained 0.04); above it
        noise_var=np.full(2, 0.5),
        persistent_var=np.zeros(2),
        seen=seen,
    )
    out = split_unseen_prior(pred, var_f=var_f, latent_scale=lam, place_share=share)
    assert out.tile_var[0] == pytest.approx(0.06, rel=1e-12)
    assert out.tile_var[1] == pytest.approx(0.10 + share * 0.10, rel=1e-12)
    np.testing.assert_allclose(out.tile_var + out.noise_var, pred.tile_var + pred.noise_var)


def test_the_place_share_is_bounded() -> None:
    """The tile effect's and the local layer's place share lie in (0, MAX_PLACE_SHARE]; a
    saved 2 loads."""
    from geodbk.local_layer import SpatialParameters
    from geodbk.tile_effect import MAX_PLACE_SHARE, TileEffectParameters

    layer = SpatialParameters(sigma2=0.05, range_km=1.0, tau2={"all": 0.1}, place_share=2.0)
    assert SpatialParameters.from_dict(layer.to_dict()).place_share == 2.0
    with pytest.raises(ValueError, match="place_share"):
        dataclasses.replace(layer, place_share=MAX_PLACE_SHARE + 0.5)

    base = TileEffectParameters(tau2=0.1, rho=0.5, noise_scale=(1.0,), components=("floor",))
    assert dataclasses.replace(base, place_share=2.0).place_share == 2.0
    raw = dataclasses.replace(base, place_share=MAX_PLACE_SHARE).to_dict()
    assert TileEffectParameters.from_dict(raw).place_share == MAX_PLACE_SHARE
    for bad in (0.0, -1.0, MAX_PLACE_SHARE + 0.5):
        with pytest.raises(ValueError, match="place_share"):
            dataclasses.replace(base, place_share=bad)


def _tests_rows(rng: np.random.Generator, n_tiles: int, *, gamma: float, s2_meas: float = 0.3):
    """Tiles over 8 quarters with an AR(1) offset, 1-20 tests a row, noise components
    ``[0.05, s2_meas / tests]`` and the residual's mean moved by ``gamma (c_meas - mean)``."""
    tiles, times, comp = [], [], []
    for j in range(n_tiles):
        q = np.sort(rng.choice(8, size=int(rng.integers(2, 9)), replace=False)).astype(float)
        tiles += [f"t{j:03d}"] * q.size
        times += list(q)
        comp += [[0.05, s2_meas / t] for t in rng.integers(1, 21, q.size)]
    tiles_a, times_a, comp_a = np.array(tiles), np.array(times), np.array(comp)
    y = np.empty(tiles_a.size)
    for tile in np.unique(tiles_a):
        rows = np.flatnonzero(tiles_a == tile)
        t = times_a[rows]
        cov = 0.2 * 0.9 ** np.abs(t[:, None] - t[None, :]) + np.diag(comp_a[rows].sum(1))
        y[rows] = rng.multivariate_normal(np.zeros(rows.size), cov)
    y += gamma * (comp_a[:, 1] - comp_a[:, 1].mean())
    return tiles_a, times_a, y, comp_a


def _fit_with_components(tiles, times, y, comp, val, **kw) -> TileEffect:
    return TileEffect.fit(
        tiles=tiles[~val],
        times=times[~val],
        residual=y[~val],
        var_f=np.zeros((~val).sum()),
        components=comp[~val],
        val_tiles=tiles[val],
        val_times=times[val],
        val_residual=y[val],
        val_var_f=np.zeros(val.sum()),
        val_components=comp[val],
        component_names=("floor", "meas"),
        **kw,
    )


def test_fit_recovers_the_tests_shift_and_lowers_validation_nll() -> None:
    """Rows of fewer tests sit lower (gamma < 0): the fit finds gamma near the truth, no
    shift for the floor (the same at every row) and the training mean as the centre, and
    the shift lowers the validation NLL; with ``tests_mean=False`` gamma stays 0."""
    rng = np.random.default_rng(11)
    tiles, times, y, comp = _tests_rows(rng, 500, gamma=-1.2)
    val = rng.random(y.size) < 0.2
    moved = _fit_with_components(tiles, times, y, comp, val)
    still = _fit_with_components(tiles, times, y, comp, val, tests_mean=False)
    gamma, centre = moved.params.tests_shift, moved.params.tests_centre
    assert gamma[0] == 0.0 and -1.7 < gamma[1] < -0.7
    np.testing.assert_allclose(centre, comp[~val].mean(0))
    assert still.params.tests_shift == (0.0, 0.0)
    assert moved.params.val_nll < still.params.val_nll - 0.005


def test_a_shift_that_puts_fewer_tests_above_more_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rows of fewer tests sitting higher (gamma > 0, what a GP far from its data can leave):
    the fit warns and keeps no shift, the same parameters as ``tests_mean=False``."""
    rng = np.random.default_rng(12)
    tiles, times, y, comp = _tests_rows(rng, 400, gamma=+1.2)
    val = rng.random(y.size) < 0.2
    with caplog.at_level("WARNING", logger="geodbk"):
        fitted = _fit_with_components(tiles, times, y, comp, val)
    assert fitted.params.tests_shift == (0.0, 0.0)
    assert "fitted without the shift" in caplog.text
    still = _fit_with_components(tiles, times, y, comp, val, tests_mean=False)
    dropped = fitted.params.tests_shift_dropped
    assert dropped is not None and dropped[1] > 0.5  # the fitted shift, recorded
    assert dataclasses.replace(fitted.params, tests_shift_dropped=None) == still.params
    assert still.params.tests_shift_dropped is None
    raw = fitted.params.to_dict()
    assert TileEffectParameters.from_dict(raw) == fitted.params
    assert "tests_shift_dropped" not in still.params.to_dict()
    # latency: quiet tiles are the slower places, so the same shift is kept
    kept = _fit_with_components(tiles, times, y, comp, val, fewer_tests_lower=False)
    assert kept.params.tests_shift[1] > 0.5


def test_the_plausibility_of_a_tests_shift() -> None:
    """gamma_meas > 0 is refused; gamma_dev > 0 is allowed while the one-test, one-device row
    stays at or below the centre; no shift is always plausible."""
    from geodbk.tile_effect import tests_shift_is_plausible

    names = ("floor", "meas", "dev")
    comp = np.array([[0.05, 0.4, 0.2], [0.05, 0.04, 0.05], [0.05, 0.2, 0.1]])
    centre = comp.mean(0)
    assert tests_shift_is_plausible((0.0, 0.0, 0.0), names, comp, centre)
    assert tests_shift_is_plausible((0.0, -1.0, 0.5), names, comp, centre)
    assert not tests_shift_is_plausible((0.0, 0.3, -2.0), names, comp, centre)
    assert not tests_shift_is_plausible((0.0, -0.2, 2.0), names, comp, centre)


def test_a_tests_shift_moves_an_observation_not_the_tile() -> None:
    """With gamma, the tile's posterior is the dense reference on the rows' residuals (as
    without it), and a row's own shift ``gamma (c - c0)`` is reported apart from it."""
    rng = np.random.default_rng(12)
    gamma, centre = (0.0, -1.0), (0.05, 0.1)
    plain = TileEffectParameters(
        tau2=0.3, rho=0.9, noise_scale=(1.0, 1.0), components=("floor", "meas"), latent_scale=0.5
    )
    tiles = np.array(["a"] * 4 + ["b"] * 3)
    times = np.array([0, 1, 2, 3, 0, 2, 5], dtype=float)
    comp = np.column_stack([np.full(7, 0.05), 0.3 / rng.integers(1, 10, 7)])
    residual = rng.normal(size=7)
    moved = dataclasses.replace(plain, tests_shift=gamma, tests_centre=centre)
    effect = _effect(moved, rng, tiles, times, residual, comp)
    q = {"tiles": ["a", "b", "c"], "times": [4.0, 4.0, 4.0], "var_f": [0.01, 0.02, 0.03]}
    q_comp = np.array([[0.05, 0.3], [0.05, 0.03], [0.05, 0.1]])
    got = effect.predict(**q, components=q_comp)
    for i, tile in enumerate(q["tiles"]):
        mean, var = _dense_tile(effect, tile, 4.0, q["var_f"][i])
        assert got.shift[i] == pytest.approx(mean, abs=1e-8)
        assert got.tile_var[i] == pytest.approx(var, abs=1e-8)
    np.testing.assert_allclose(got.tests_shift, [-0.2, 0.07, 0.0], atol=1e-12)
    # an observation's mean carries it; the latent (tile) prediction does not
    from geodbk.tile_effect import predict_with_tile_effect

    class _GP:
        def predict_dist(self, X, quantity, **kw):
            from geodbk.predictive import Prediction

            n = len(X)
            return Prediction(mean=np.zeros(n), var=np.full(n, 0.01), var_f=np.full(n, 0.01))

        def noise_components(self, n, **kw):
            return ("floor", "meas"), q_comp

    at = {"tiles": q["tiles"], "times": q["times"]}
    obs = predict_with_tile_effect(_GP(), effect, np.zeros((3, 2)), **at)
    tile = predict_with_tile_effect(_GP(), effect, np.zeros((3, 2)), **at, quantity="latent")
    np.testing.assert_allclose(obs.mean - tile.mean, got.tests_shift, atol=1e-12)


def test_old_files_without_a_tests_shift_read_as_no_shift() -> None:
    raw = TileEffectParameters(
        tau2=0.2, rho=0.9, noise_scale=(1.0, 1.0), components=("floor", "meas")
    ).to_dict()
    assert raw["tests_shift"] == [0.0, 0.0]
    for key in ("tests_shift", "tests_centre"):
        raw.pop(key)
    params = TileEffectParameters.from_dict(raw)
    assert params.tests_shift == (0.0, 0.0) and params.tests_centre == (0.0, 0.0)
    round_trip = dataclasses.replace(params, tests_shift=(0.0, -1.1), tests_centre=(0.1, 0.2))
    assert TileEffectParameters.from_dict(round_trip.to_dict()) == round_trip


def _two_noise_effect(rng: np.random.Generator, **params: object) -> TileEffect:
    """A tile effect with ``tau²`` 0.2 and noise components (floor, meas) refitted by (1.0,
    0.4), conditioned on 30 tiles' rows."""
    tiles, times, r = _rows(rng, 30, tau2=0.2, rho=0.9, noise=0.05)
    comp = np.column_stack([np.full(r.size, 0.02), np.full(r.size, 0.03)])
    base = TileEffectParameters(
        tau2=0.2, rho=0.9, noise_scale=(1.0, 0.4), components=("floor", "meas"), latent_scale=1.5
    )
    return _effect(dataclasses.replace(base, **params), rng, tiles, times, r, comp)


def test_the_gp_prior_gives_an_unseen_tile_the_gps_own_variance() -> None:
    """``UNSEEN_GP``: an unseen tile's tile variance is ``v + sum_k max(1 - kappa_k, 0) c_k``
    (at ``tile_components`` when given) and its test adds ``kappa'c`` of its own
    components; measured tiles' rows and the shifts are the tile effect's prior's."""
    from geodbk.tile_effect import UNSEEN_EFFECT, UNSEEN_GP

    effect = _two_noise_effect(np.random.default_rng(6), unseen_prior=UNSEEN_GP)
    tau2_prior = copy.copy(effect)
    tau2_prior.params = dataclasses.replace(effect.params, unseen_prior=UNSEEN_EFFECT)
    comp = np.array([[0.02, 0.05], [0.02, 0.05], [0.02, 0.01]])
    kw = {
        "tiles": np.array([effect.tiles[0], "never-seen", "never-seen"]),
        "times": np.array([3.0, 3.0, 7.0]),
        "var_f": np.array([0.01, 0.02, 0.04]),
        "components": comp,
    }
    gp, tau2 = effect.predict(**kw), tau2_prior.predict(**kw)
    persistent = comp @ np.array([0.0, 0.6])
    np.testing.assert_allclose(gp.tile_var[1:], (kw["var_f"] + persistent)[1:], rtol=1e-12)
    np.testing.assert_allclose(gp.noise_var[1:], (comp @ np.array([1.0, 0.4]))[1:], rtol=1e-12)
    assert gp.tile_var[0] == tau2.tile_var[0] and gp.noise_var[0] == tau2.noise_var[0]
    np.testing.assert_array_equal(gp.shift, tau2.shift)
    typical = effect.predict(**kw, tile_components=[0.02, 0.1])
    np.testing.assert_allclose(typical.tile_var[1:], kw["var_f"][1:] + 0.06, rtol=1e-12)
    assert np.all(typical.tile_var + typical.noise_var >= typical.tile_var)


@pytest.mark.parametrize("spread", [0.0, 0.2])
def test_the_unseen_prior_is_chosen_by_the_rows_of_unseen_tiles(spread: float) -> None:
    """Rows of unseen tiles whose offsets spread as ``tau²`` (0.2) keep the tile effect's
    prior; rows without an offset beyond the GP's noise choose the GP's; both NLLs are
    recorded, and too few such rows change nothing."""
    from geodbk.tile_effect import UNSEEN_EFFECT, UNSEEN_GP, choose_unseen_prior

    rng = np.random.default_rng(7)
    effect = _two_noise_effect(rng)
    n_tiles, per = 150, 2
    tiles = np.repeat([f"new{j}" for j in range(n_tiles)], per)
    offset = np.repeat(rng.normal(0.0, np.sqrt(spread) if spread else 0.0, n_tiles), per)
    comp = np.column_stack([np.full(tiles.size, 0.02), np.full(tiles.size, 0.03)])
    rows = {
        "tiles": tiles,
        "times": np.zeros(tiles.size),
        "var_f": np.full(tiles.size, 0.01),
        "components": comp,
    }
    # the GP's own variance of such a row: v + floor + meas
    residual = offset + rng.normal(0.0, np.sqrt(0.01 + 0.05), tiles.size)
    chosen = choose_unseen_prior(effect, residual=residual, **rows)
    want = UNSEEN_EFFECT if spread else UNSEEN_GP
    assert chosen.params.unseen_prior == want
    scores = chosen.params.val_nll_unseen
    assert scores is not None and scores[want] < scores[UNSEEN_GP if spread else UNSEEN_EFFECT]
    assert effect.params.unseen_prior == UNSEEN_EFFECT  # the copy carries the choice
    few = {k: v[:20] for k, v in rows.items()}
    assert choose_unseen_prior(effect, residual=residual[:20], **few) is effect
    again = TileEffectParameters.from_dict(json.loads(json.dumps(chosen.params.to_dict())))
    assert again == chosen.params


def test_tile_ids_as_integer_keys_choose_the_same_objective_as_their_quadkeys() -> None:
    """A Categorical of :func:`geodbk.geo.quadkey.tile_keys` stands for its quadkeys wherever
    tile ids are compared as strings: the objective and its rows are the same."""
    rng = np.random.default_rng(4)
    names = np.array(["".join(map(str, rng.integers(0, 4, 16))) for _ in range(40)])
    train = rng.choice(names, 400)
    val = np.concatenate([rng.choice(names[:30], 300), rng.choice(names[30:], 50)])

    def as_keys(ids: np.ndarray) -> pd.Categorical:
        keys = tile_keys(*quadkey_to_tile(ids))
        return pd.Categorical(keys, categories=np.unique(keys))

    np.testing.assert_array_equal(tile_id_strings(as_keys(val)), val)
    by_name = choose_objective(train, val, seed=1)
    by_key = choose_objective(as_keys(train), as_keys(val), seed=1)
    assert by_key[0] == by_name[0] == "validation"
    np.testing.assert_array_equal(by_key[1], by_name[1])
