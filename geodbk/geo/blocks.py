"""Spatial blocks: the square cells of lon/lat in which a block split holds out its rows.

A block is a cell of the lon/lat grid of ``block_size`` degrees anchored at 0°, 0°; rows of one
block share their split label (:func:`geodbk.geo.table.block_split`), so the block, not the tile,
is the unit in which a block split's validation and test rows were held out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["block_keys", "held_out_units"]


def block_keys(
    lon: npt.ArrayLike, lat: npt.ArrayLike, *, block_size: float
) -> npt.NDArray[np.int64]:
    """One integer per block: ``floor(lon / b) * 10000019 + floor(lat / b)``."""
    bx = np.floor(np.asarray(lon, dtype=float) / block_size).astype(np.int64)
    by = np.floor(np.asarray(lat, dtype=float) / block_size).astype(np.int64)
    return bx * 10_000_019 + by


def held_out_units(
    lon: npt.ArrayLike, lat: npt.ArrayLike, split: dict[str, Any] | None
) -> npt.NDArray[np.int64] | None:
    """The block in which each row was held out under the split a tile table's metadata
    describes (its ``split`` entry, with ``kind`` and ``block_size_deg``); ``None`` for the
    other splits, whose held-out unit is the tile or the row."""
    if not split or split.get("kind") != "block" or not split.get("block_size_deg"):
        return None
    return block_keys(lon, lat, block_size=float(split["block_size_deg"]))
