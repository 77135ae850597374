"""Spatial blocks: the block split's cells and the unit a row was held out in."""

from __future__ import annotations

import numpy as np

from geodbk.geo.blocks import block_keys, held_out_units
from geodbk.geo.table import block_split


def test_points_in_one_cell_share_a_block_and_neighbours_do_not() -> None:
    lon = np.array([-157.81, -157.89, -157.79, -157.81, 179.95, -179.95])
    lat = np.array([21.31, 21.39, 21.31, 21.41, 51.0, 51.0])
    keys = block_keys(lon, lat, block_size=0.1)
    assert keys[0] == keys[1]  # the same 0.1° cell
    assert len(set(keys[[0, 2, 3]])) == 3  # the cells east and north
    assert keys[4] != keys[5]  # either side of 180°


def test_the_block_split_labels_whole_blocks() -> None:
    rng = np.random.default_rng(0)
    lon = rng.uniform(-158.3, -157.6, 5000)
    lat = rng.uniform(21.2, 21.7, 5000)
    labels, info = block_split(lon, lat, seed=0, block_size=0.1)
    units = held_out_units(lon, lat, {"kind": "block", "block_size_deg": 0.1})
    assert units is not None
    for unit in np.unique(units):
        assert len(set(labels[units == unit])) == 1
    assert len(np.unique(units[labels == "val"])) == info["blocks"]["val"]


def test_other_splits_hold_out_tiles_or_rows() -> None:
    lon, lat = np.zeros(3), np.zeros(3)
    assert held_out_units(lon, lat, {"kind": "tile", "unit": "tile"}) is None
    assert held_out_units(lon, lat, {"kind": "random"}) is None
    assert held_out_units(lon, lat, None) is None
