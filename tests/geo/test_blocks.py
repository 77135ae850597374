"""Spatial blocks: the block split's cells and the unit a row was held out in."""

from __future__ import annotations

import numpy as np

from geodbk.geo.blocks import PLACE_ZOOM, block_keys, calibration_places, held_out_units
from geodbk.geo.quadkey import keys_to_tile, lonlat_to_tile, tile_to_quadkey
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


def test_a_tiles_place_is_its_parent_tile_or_its_held_out_block() -> None:
    # zoom-16 tiles: two in one zoom-12 parent, one in the next parent east
    lon, lat = np.array([-157.8, -157.801, -157.7]), np.array([21.3, 21.3, 21.3])
    x, y = lonlat_to_tile(lon, lat, 16)
    quadkeys = tile_to_quadkey(x, y, np.full(3, 16))
    by_key = calibration_places(quadkeys)
    assert by_key[0] == by_key[1] != by_key[2]
    assert list(by_key) == [q[:PLACE_ZOOM] for q in quadkeys]  # the parents' quadkeys
    by_position = calibration_places(quadkeys, lon=lon, lat=lat, split={"kind": "tile"})
    px, py, pz = keys_to_tile(by_position)
    assert (pz == PLACE_ZOOM).all() and (px == x >> 4).all() and (py == y >> 4).all()
    # ids that are no quadkeys are their own places
    assert list(calibration_places(np.array(["a7", "a7", "b9"]))) == ["a7", "a7", "b9"]
    # on a block split the place is the block the tile was held out in
    lon, lat = np.array([-157.81, -157.89, -157.79]), np.array([21.31, 21.39, 21.31])
    split = {"kind": "block", "block_size_deg": 0.1}
    on_blocks = calibration_places(quadkeys, lon=lon, lat=lat, split=split)
    assert np.array_equal(on_blocks, block_keys(lon, lat, block_size=0.1))
