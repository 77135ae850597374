"""A tile effect's files (geodbk.geo.tile_effect_files); round trips are in
tests/test_tile_effect.py, next to the fits they save."""

from __future__ import annotations

from pathlib import Path

import pytest

from geodbk.errors import ModelFileError
from geodbk.geo.tile_effect_files import (
    has_tile_effect,
    load_tile_effect,
    save_tile_effect,
    tile_effect_files,
)
from geodbk.tile_effect import TileEffect, TileEffectParameters


def test_an_incomplete_pair_is_refused_with_the_fix(tmp_path: Path) -> None:
    params = TileEffectParameters(tau2=0.5, rho=1.0, noise_scale=(1.0,), components=("noise",))
    effect = TileEffect(
        params, tiles=["a"], times=[0.0], residual=[1.0], var_f=[0.0], components=[[0.1]]
    )
    assert not has_tile_effect(tmp_path)
    save_tile_effect(effect, tmp_path / "m")
    doc, rows = tile_effect_files(tmp_path / "m")
    assert doc.is_file() and rows.is_file() and has_tile_effect(tmp_path / "m")
    rows.unlink()
    with pytest.raises(ModelFileError, match=r"no complete tile effect.*geodbk train"):
        load_tile_effect(tmp_path / "m")
