"""A run's saved models: load a target's bundle and its tile effect, save the tile effect."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from geodbk.errors import ModelFileError
from geodbk.estimator import DBKRegressor
from geodbk.geo.tile_effect_files import load_tile_effect as load_tile_effect_files
from geodbk.geo.tile_effect_files import save_tile_effect as save_tile_effect_files
from geodbk.geo.tile_effect_files import tile_effect_files
from geodbk.tile_effect import TileEffectParameters
from pipelines.rundir import RunDir, require_model, stale_model_message

log = logging.getLogger("geodbk")


def save_tile_effect(model_dir: Path, effect: Any) -> None:
    """Write ``effect`` next to the model, or remove a stale one (``effect=None``)."""
    if effect is not None:
        save_tile_effect_files(effect, model_dir)
        return
    for path in tile_effect_files(model_dir):
        path.unlink(missing_ok=True)


def load_model(rd: RunDir, target: str) -> Any:
    """Load the bundle of ``target`` (raises ModelFileError with the train command if absent)."""
    path = require_model(rd, target)
    model = DBKRegressor.load(path)
    scale = (getattr(model, "y_mean_", 0.0), getattr(model, "y_std_", 1.0))
    if not (np.isfinite(scale).all() and scale[1] > 0):
        raise ModelFileError(
            f"{path}/model.json holds a target mean/sd of {scale[0]!r}/{scale[1]!r} (a finite "
            f"mean and a positive sd are needed); the file is damaged: retrain with `geodbk "
            f"train --run {rd.root} --target {target}`"
        )
    md = getattr(model, "metadata_", None) or {}
    if md.get("target") not in (None, target):
        raise ModelFileError(f"{path} holds a {md.get('target')!r} model, not {target!r}")
    log.info("read model %s", path)
    stale = stale_model_message(rd, target, md)
    if stale:
        log.warning("%s", stale)
    return model


def _canonical_effect(recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The tile-effect parameters a model's metadata records, as ``to_dict`` writes them now
    (a model trained before a parameter existed records it with its default)."""
    try:
        return TileEffectParameters.from_dict(recorded).to_dict()
    except (TypeError, ValueError, KeyError):
        return None


def load_tile_effect(rd: RunDir, target: str, model: Any) -> Any:
    """The tile effect saved with ``target``'s model, or ``None`` when it was trained without.

    Raises :class:`~geodbk.errors.ModelFileError` when the files and the model's metadata
    disagree (a tile effect from another training run), with the command that fixes it.
    """
    md = getattr(model, "metadata_", None) or {}
    folder = rd.model_dir(target)
    expected = md.get("tile_effect")
    if expected is None:
        return None
    try:
        effect = load_tile_effect_files(folder)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSON, Arrow, missing keys
        raise ModelFileError(
            f"the tile effect saved with the {target} model ({folder / 'tile_effect.json'} and "
            f"tile_effect_rows.parquet) is missing or unreadable ({type(exc).__name__}: {exc}); "
            f"retrain: geodbk train --run {rd.root} --target {target}"
        ) from None
    if effect.params.to_dict() != _canonical_effect(expected):
        raise ModelFileError(
            f"{folder}: the tile effect files do not belong to this model (another training "
            f"run wrote them); retrain with `geodbk train --run {rd.root} --target {target} "
            "--tile-effect`"
        )
    return effect
