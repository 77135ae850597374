"""The tile effect's training hold-out (tile and block splits: no validation tile measured)."""

from __future__ import annotations

import numpy as np
import pytest
from tile_tables import fit_effect_on_masks

from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.tile_effect import (
    HOLDOUT_FLOOR,
    MIN_OBJECTIVE_ROWS,
    TileEffect,
    choose_objective,
    fit_tile_effect,
    holdout_rows,
)


def test_holdout_takes_one_row_of_a_share_of_multi_row_tiles() -> None:
    rng = np.random.default_rng(0)
    tiles = np.array([f"t{i}" for i in rng.integers(0, 400, 2000)] + ["single"])
    mask = holdout_rows(tiles, seed=3, share=0.25, floor=0)
    held = tiles[mask]
    assert len(set(held)) == held.size  # one row per chosen tile
    counts = {t: int((tiles == t).sum()) for t in set(held)}
    assert min(counts.values()) >= 2 and "single" not in counts
    multi = sum(1 for t in set(tiles) if (tiles == t).sum() >= 2)
    assert held.size == round(0.25 * multi)
    assert (mask == holdout_rows(tiles, seed=3, share=0.25, floor=0)).all()
    assert (mask != holdout_rows(tiles, seed=4, share=0.25, floor=0)).any()
    assert not holdout_rows(np.array(["a", "b"])).any()


def test_holdout_floor_takes_up_to_half_the_multi_row_tiles() -> None:
    tiles = np.repeat([f"t{i:03d}" for i in range(300)], 3)
    assert holdout_rows(tiles, share=0.2).sum() == 150  # min(HOLDOUT_FLOOR, 300 // 2)
    many = np.repeat([f"t{i:04d}" for i in range(5000)], 2)
    assert holdout_rows(many, share=0.2).sum() == 1000  # 20% is above the floor
    assert holdout_rows(np.array(["a", "a", "b"])).sum() == 1


def test_choose_objective_prefers_validation_rows_of_measured_tiles() -> None:
    train = np.repeat([f"t{i:03d}" for i in range(200)], 2)
    kind, mask = choose_objective(train, train[:MIN_OBJECTIVE_ROWS])
    assert kind == "validation" and mask.shape == (MIN_OBJECTIVE_ROWS,) and mask.all()
    unseen = np.array([f"u{i}" for i in range(500)])  # leave-tile-out: no val tile measured
    kind, mask = choose_objective(train, unseen, seed=1)
    assert kind == "training hold-out" and mask.shape == train.shape
    assert (mask == holdout_rows(train, seed=1)).all()


def test_holdout_rows_are_left_out_of_the_conditioning_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(4)
    x, y, ids, time, tile = _tiles_with_offsets(120, 3, rng)
    val = tile % 10 == 0
    train = ~val
    model = DBKRegressor(rank=8, hidden=8, epochs=2, batch_size=64, device="cpu", seed=0)
    model.fit(x[train], y[train], x[val], y[val])
    seen: dict[str, np.ndarray] = {}
    original = TileEffect.fit.__func__  # type: ignore[attr-defined]

    def spy(cls: type, **kw: object) -> TileEffect:
        seen.update({k: np.asarray(kw[k]) for k in ("tiles", "times", "val_tiles", "val_times")})
        return original(cls, **kw)

    monkeypatch.setattr(TileEffect, "fit", classmethod(spy))
    effect = fit_effect_on_masks(model, x=x, y=y, ids=ids, times=time, train=train, val=val)
    held = holdout_rows(ids[train], seed=0)
    assert seen["val_tiles"].size == held.sum() == effect.params.objective_rows
    cond = set(zip(seen["tiles"].tolist(), seen["times"].tolist(), strict=True))
    obj = set(zip(seen["val_tiles"].tolist(), seen["val_times"].tolist(), strict=True))
    assert not cond & obj and len(cond) == train.sum() - held.sum()
    assert set(seen["val_tiles"]) <= set(seen["tiles"])  # each predicted from its tile's rows
    assert effect.tiles.size == train.sum() + val.sum()  # then conditioned on every row


def _tiles_with_offsets(n_tiles: int, quarters: int, rng: np.random.Generator):
    centre = rng.uniform(-1, 1, size=(n_tiles, 2))
    offset = rng.normal(0.0, 0.4, n_tiles)
    tile = np.repeat(np.arange(n_tiles), quarters)
    time = np.tile(np.arange(quarters, dtype=float), n_tiles)
    x = centre[tile]
    y = np.sin(2 * x[:, 0]) + offset[tile] + rng.normal(0, 0.1, tile.size)
    return x, y, np.array([f"t{j:03d}" for j in tile]), time, tile


def test_leave_tile_out_split_fits_on_a_training_holdout() -> None:
    rng = np.random.default_rng(1)
    x, y, ids, time, tile = _tiles_with_offsets(200, 4, rng)
    val = tile % 10 == 0  # whole tiles held out: no validation tile has training rows
    train = ~val
    model = DBKRegressor(rank=16, hidden=16, epochs=5, batch_size=64, device="cpu", seed=0)
    model.fit(x[train], y[train], x[val], y[val])
    effect = fit_effect_on_masks(model, x=x, y=y, ids=ids, times=time, train=train, val=val)
    p = effect.params
    assert p.objective == "training hold-out"
    assert p.objective_rows == min(HOLDOUT_FLOOR, 180 // 2)
    # the held-out rows are predicted far better from their tiles' other rows
    assert p.val_nll is not None and p.val_nll_without is not None
    assert p.val_nll < p.val_nll_without - 0.2
    assert effect.tiles.size == train.sum() + val.sum()


def test_too_few_measured_tiles_is_refused() -> None:
    rng = np.random.default_rng(2)
    x, y, ids, time, _ = _tiles_with_offsets(30, 1, rng)  # one quarter: no tile twice
    model = DBKRegressor(rank=8, hidden=8, epochs=2, batch_size=16, device="cpu", seed=0)
    model.fit(x[:20], y[:20], x[20:], y[20:])
    with pytest.raises(DataError, match="2\\+ rows"):
        fit_tile_effect(
            model,
            X=x[:20],
            y=y[:20],
            tiles=ids[:20],
            times=time[:20],
            X_val=x[20:],
            y_val=y[20:],
            tiles_val=ids[20:],
            times_val=time[20:],
        )
