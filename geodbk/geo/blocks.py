"""Spatial blocks: the square cells of lon/lat in which a block split holds out its rows.

A block is a cell of the lon/lat grid of ``block_size`` degrees anchored at 0°, 0°; rows of one
block share their split label (:func:`geodbk.geo.table.block_split`), so the block, not the tile,
is the unit in which a block split's validation and test rows were held out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from geodbk.geo.quadkey import lonlat_to_tile, tile_keys, valid_quadkeys

__all__ = ["PLACE_TEXT", "PLACE_ZOOM", "block_keys", "calibration_places", "held_out_units"]

#: Zoom of the parent tile that is a scored tile's place off a block split: about 10 km at
#: the equator (9 km on Hawaii), where the correlation of neighbouring tiles' residuals has
#: fallen to about 0.03 (0.20 within 0.8 km, 0.11 within 3 km, 0.03 within 6 km).
PLACE_ZOOM = 12
#: What a place is, for captions and reports.
PLACE_TEXT = (
    f"a tile's held-out block on a block split, otherwise its zoom-{PLACE_ZOOM} parent tile, "
    "about 10 km across"
)


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


def calibration_places(
    tiles: npt.ArrayLike,
    *,
    lon: npt.ArrayLike | None = None,
    lat: npt.ArrayLike | None = None,
    split: dict[str, Any] | None = None,
) -> np.ndarray:
    """A label of each row's place, for a coverage counted by place: on a block split, the
    block it was held out in (:func:`held_out_units`); otherwise the tile at
    :data:`PLACE_ZOOM` that holds its ``lon``/``lat`` (a :func:`geodbk.geo.quadkey.tile_keys`
    integer) or, without them, its quadkey's first :data:`PLACE_ZOOM` digits (the parent's
    quadkey; a tile id that is no quadkey is its own place). Neighbouring tiles share their
    errors, so a coverage's interval counted by tile claims more independent checks than it
    has."""
    if lon is not None and lat is not None:
        units = held_out_units(lon, lat, split)
        if units is not None:
            return units
        x, y = lonlat_to_tile(lon, lat, PLACE_ZOOM)
        return tile_keys(x, y, np.full_like(x, PLACE_ZOOM))
    ids = np.asarray(tiles).astype(str)
    return np.where(valid_quadkeys(ids), ids.astype(f"<U{PLACE_ZOOM}"), ids)
