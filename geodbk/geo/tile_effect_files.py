"""A fitted tile effect's files: ``tile_effect.json`` (its parameters) and
``tile_effect_rows.parquet`` (the rows it conditions on), next to the model bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.atomic import atomic_path, atomic_write_json
from geodbk.errors import ModelFileError
from geodbk.tile_effect import MAX_ROWS, TileEffect, TileEffectParameters

__all__ = ["has_tile_effect", "load_tile_effect", "save_tile_effect", "tile_effect_files"]

ROWS_FILE = "tile_effect_rows.parquet"
PARAMS_FILE = "tile_effect.json"


def tile_effect_files(folder: str | Path) -> tuple[Path, Path]:
    """The two files :func:`save_tile_effect` writes in ``folder``."""
    return Path(folder) / PARAMS_FILE, Path(folder) / ROWS_FILE


def has_tile_effect(folder: str | Path) -> bool:
    """Whether ``folder`` holds a saved tile effect."""
    return (Path(folder) / PARAMS_FILE).is_file()


def save_tile_effect(effect: TileEffect, folder: str | Path) -> None:
    """Write ``effect``'s two files in ``folder`` (each atomically)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cols: dict[str, Any] = {
        "tile": pa.array(effect.tiles, pa.large_string()),
        "time": effect.times,
        "residual": effect.residual,
        "var_f": effect.var_f,
        "group": pa.array(effect.groups, pa.string()),
    }
    for k, name in enumerate(effect.params.components):
        cols[f"noise_{name}"] = effect.components[:, k]
    with atomic_path(folder / ROWS_FILE) as tmp:
        pq.write_table(pa.table(cols), tmp)
    atomic_write_json(
        folder / PARAMS_FILE, {**effect.params.to_dict(), "max_rows": effect.max_rows}
    )


def load_tile_effect(folder: str | Path) -> TileEffect:
    """Read what :func:`save_tile_effect` wrote (:class:`ModelFileError` when incomplete)."""
    folder = Path(folder)
    params_path, rows_path = tile_effect_files(folder)
    if not params_path.is_file() or not rows_path.is_file():
        raise ModelFileError(
            f"{folder} has no complete tile effect ({PARAMS_FILE} + {ROWS_FILE}); "
            "retrain with `geodbk train --tile-effect`"
        )
    raw = json.loads(params_path.read_text())
    max_rows = int(raw.pop("max_rows", MAX_ROWS))
    params = TileEffectParameters.from_dict(raw)
    table = pq.read_table(rows_path)
    groups = table.column("group").to_pylist() if "group" in table.column_names else None
    comp = np.column_stack(
        [table.column(f"noise_{c}").to_numpy() for c in params.components]
    ).reshape(table.num_rows, len(params.components))
    return TileEffect(
        params,
        tiles=np.asarray(table.column("tile").to_pylist(), dtype=str),
        times=table.column("time").to_numpy(),
        residual=table.column("residual").to_numpy(),
        var_f=table.column("var_f").to_numpy(),
        components=comp,
        groups=groups,
        max_rows=max_rows,
    )
