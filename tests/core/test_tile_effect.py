"""The tile effect (geodbk.tile_effect): dense float64 reference, fitting, persistence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodbk import likelihoods
from geodbk.errors import DataError, ModelFileError
from geodbk.tile_effect import TileEffect, TileEffectParameters


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


def _dense_tile(effect: TileEffect, tile: str, time: float, var_f: float) -> tuple[float, float]:
    """Posterior mean and variance of the tile's GP error plus offset by the dense joint
    Gaussian (float64): K = tau² rho^|dt| + lambda sqrt(v v'), E = diag(kappa' c)."""
    p = effect.params
    prior = p.tau2 + p.latent_scale * var_f
    rows = np.flatnonzero(effect.tiles == tile)
    rows = rows[np.argsort(effect.times[rows], kind="stable")][-effect.max_rows :]
    if rows.size == 0:
        return 0.0, prior
    t, v = effect.times[rows], effect.var_f[rows]
    K = p.tau2 * p.rho ** np.abs(t[:, None] - t[None, :]) + p.latent_scale * np.sqrt(np.outer(v, v))
    E = np.diag(effect.components[rows] @ np.array(p.noise_scale))
    k = p.tau2 * p.rho ** np.abs(time - t) + p.latent_scale * np.sqrt(var_f * v)
    sol = np.linalg.solve(K + E, np.column_stack([effect.residual[rows], k]))
    return float(k @ sol[:, 0]), float(prior - k @ sol[:, 1])


def test_prediction_matches_the_dense_reference() -> None:
    rng = np.random.default_rng(0)
    tiles, times, r = _rows(rng, 30, tau2=0.3, rho=0.8, noise=0.2)
    comp = np.column_stack([np.full(r.size, 0.1), rng.uniform(0.01, 0.2, r.size)])
    params = TileEffectParameters(
        tau2=0.25, rho=0.7, noise_scale=(0.6, 1.3), components=("floor", "meas"), latent_scale=1.7
    )
    effect = TileEffect(
        params,
        tiles=tiles,
        times=times,
        residual=r,
        var_f=rng.uniform(0.0, 0.05, r.size),
        components=comp,
        max_rows=5,  # truncates the tiles seen in more than 5 quarters
    )
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


def _split(tiles, times, y, rng):
    val = rng.random(y.size) < 0.2
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
    assert 0.2 < p.tau2 < 0.45
    assert p.rho > 0.8
    # the GP noise was 0.2 for a true 0.1: the refit halves it
    assert 0.35 < p.noise_scale[0] < 0.7
    assert p.val_nll is not None and p.val_nll_without is not None
    assert p.val_nll < p.val_nll_without - 0.1


def test_fit_without_an_offset_keeps_the_noise() -> None:
    rng = np.random.default_rng(2)
    tiles, times, y = _rows(rng, 400, tau2=1e-8, rho=0.5, noise=0.2)
    effect = TileEffect.fit(**_split(tiles, times, y, rng))
    assert effect.params.tau2 < 0.02
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
    effect.save(tmp_path)
    assert TileEffect.exists(tmp_path)
    back = TileEffect.load(tmp_path)
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
        TileEffect.load(tmp_path)


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
