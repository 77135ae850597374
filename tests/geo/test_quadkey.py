"""Vectorised quadkeys against mercantile."""

from __future__ import annotations

import numpy as np
import pytest

from geodbk.geo import quadkey as qk

mercantile = pytest.importorskip("mercantile", reason="the reference quadkeys need mercantile")


def _random_quadkeys(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    zooms = rng.integers(1, 24, n)
    return ["".join(map(str, rng.integers(0, 4, z))) for z in zooms]


def test_quadkey_to_tile_matches_mercantile() -> None:
    keys = _random_quadkeys(3000)
    x, y, z = qk.quadkey_to_tile(keys)
    expected = np.array([tuple(mercantile.quadkey_to_tile(k)) for k in keys])
    np.testing.assert_array_equal(np.column_stack([x, y, z]), expected)
    assert set(z.tolist()) == set(range(1, 24))


def test_tile_to_quadkey_round_trip_and_mercantile() -> None:
    keys = _random_quadkeys(3000, seed=1)
    x, y, z = qk.quadkey_to_tile(keys)
    back = qk.tile_to_quadkey(x, y, z)
    assert back.tolist() == keys
    assert [mercantile.quadkey(mercantile.Tile(a, b, c)) for a, b, c in zip(x, y, z, strict=True)][
        :50
    ] == keys[:50]


@pytest.mark.parametrize("zoom", [1, 16, 23])
def test_tile_to_quadkey_at_one_zoom_matches_mercantile(zoom: int) -> None:
    """One zoom for every tile (a map's zoom-16 tiles), the corners of the range included."""
    rng = np.random.default_rng(zoom)
    x = np.concatenate([[0, 2**zoom - 1, 0], rng.integers(0, 2**zoom, 500)])
    y = np.concatenate([[0, 2**zoom - 1, 2**zoom - 1], rng.integers(0, 2**zoom, 500)])
    keys = qk.tile_to_quadkey(x, y, zoom)
    expected = [
        mercantile.quadkey(mercantile.Tile(int(a), int(b), zoom)) for a, b in zip(x, y, strict=True)
    ]
    assert keys.tolist() == expected
    back_x, back_y, back_z = qk.quadkey_to_tile(keys)  # and back, every key of one zoom
    np.testing.assert_array_equal(back_x, x)
    np.testing.assert_array_equal(back_y, y)
    assert set(back_z.tolist()) == {zoom}


def test_bounds_and_centroid_match_mercantile() -> None:
    keys = _random_quadkeys(2000, seed=2)
    w, s, e, n = qk.quadkey_bounds(keys)
    ref = np.array([tuple(mercantile.bounds(mercantile.quadkey_to_tile(k))) for k in keys])
    np.testing.assert_allclose(np.column_stack([w, s, e, n]), ref, rtol=0, atol=1e-9)
    lon, lat = qk.quadkey_centroid(keys)
    np.testing.assert_allclose(lon, (ref[:, 0] + ref[:, 2]) / 2, atol=1e-9)
    np.testing.assert_allclose(lat, (ref[:, 1] + ref[:, 3]) / 2, atol=1e-9)


def test_lonlat_to_tile_matches_mercantile() -> None:
    rng = np.random.default_rng(3)
    lon = rng.uniform(-179.9, 179.9, 500)
    lat = rng.uniform(-80, 80, 500)
    x, y = qk.lonlat_to_tile(lon, lat, 16)
    ref = np.array([tuple(mercantile.tile(a, b, 16))[:2] for a, b in zip(lon, lat, strict=True)])
    np.testing.assert_array_equal(np.column_stack([x, y]), ref)


def test_valid_quadkeys_flags_bad_ones() -> None:
    keys = ["0123", "", "0124", "01a3", "0" * 24, "3" * 23, " 012", "0231100032001121"]
    assert qk.valid_quadkeys(np.array(keys, dtype=object)).tolist() == [
        True, False, False, False, False, True, False, True,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="malformed"):
        qk.quadkey_to_tile(["0124"])


def test_bytes_input_and_empty() -> None:
    _, _, z = qk.quadkey_to_tile(np.array([b"0231", b"1"]))
    assert z.tolist() == [4, 1]
    assert qk.quadkey_to_tile([])[0].shape == (0,)
    assert qk.tile_to_quadkey([], [], []).shape == (0,)
    with pytest.raises(ValueError):
        qk.tile_to_quadkey([4], [0], [2])


def test_longitudes_beyond_180_find_the_tile_a_turn_away() -> None:
    x, y = qk.lonlat_to_tile([190.0, -170.0, 179.999], [51.0, 51.0, 51.0], 16)
    assert x[0] == x[1] and y[0] == y[1] and x[2] == 2**16 - 1


def test_tile_keys_round_trip_at_every_zoom_and_name_distinct_tiles() -> None:
    keys = _random_quadkeys(3000, seed=5)
    x, y, z = qk.quadkey_to_tile(keys)
    ints = qk.tile_keys(x, y, z)
    assert ints.dtype == np.int64
    back = qk.keys_to_tile(ints)
    for got, want in zip(back, (x, y, z), strict=True):
        np.testing.assert_array_equal(got, want)
    # one key per distinct tile, whatever the zoom: "0" (zoom 1) and "00" (zoom 2) differ
    assert np.unique(ints).size == len(set(keys))
    assert qk.tile_keys(0, 0, 1) != qk.tile_keys(0, 0, 2)
    # the centre of a tile is the same from its key as from its quadkey
    lon_k, lat_k = qk.quadkey_centroid(ints)
    lon_q, lat_q = qk.quadkey_centroid(keys)
    np.testing.assert_array_equal(lon_k, lon_q)
    np.testing.assert_array_equal(lat_k, lat_q)
    np.testing.assert_array_equal(qk.tile_ids_to_tile(ints)[0], qk.tile_ids_to_tile(keys)[0])


def test_tile_keys_refuse_what_no_tile_has() -> None:
    with pytest.raises(ValueError, match="out of range"):
        qk.tile_keys(2, 0, 1)  # zoom 1 has x 0-1
    with pytest.raises(ValueError, match="zoom must be"):
        qk.tile_keys(0, 0, 24)
    good = int(qk.tile_keys(3, 1, 2)[0])
    with pytest.raises(ValueError, match="not tile keys"):
        qk.keys_to_tile([good, 5])  # zoom 0
    with pytest.raises(ValueError, match="not tile keys"):
        qk.keys_to_tile([(2 << 48) | (4 << 24)])  # x = 4 at zoom 2
    with pytest.raises(TypeError, match="integers"):
        qk.keys_to_tile(np.array([1.5]))
    assert qk.keys_to_tile(np.zeros(0, np.int64))[0].size == 0
