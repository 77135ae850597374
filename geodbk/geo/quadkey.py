"""Vectorised Bing-maps quadkeys: quadkey <-> tile x/y/zoom <-> bounds / centroid (numpy).

Everything works on whole arrays at once: the only Python loops run over the (at most 23)
digit positions or not at all, never over rows. Conventions follow the web-mercator XYZ scheme
(``mercantile``): ``x`` grows eastwards, ``y`` southwards, zoom ``z`` = number of digits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from geodbk.geo.longitude import native_longitude

#: Deepest zoom a quadkey may have here (tile indices fit in int64; Bing maps stop at 23).
MAX_ZOOM = 23
#: Ookla's tiles are zoom-16 quadkeys (16 digits).
TILE_ZOOM = 16

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _as_codes(quadkeys: Sequence[str] | npt.ArrayLike) -> tuple[npt.NDArray[np.uint8], IntArray]:
    """Quadkeys as an ``(n, w)`` array of ASCII codes (0-padded) and their lengths."""
    arr = np.asarray(quadkeys)
    if arr.size == 0:
        arr = arr.astype("U1").reshape(0)
    if arr.dtype.kind == "O":
        arr = arr.astype(str)
    if arr.dtype.kind == "U":
        width = max(arr.dtype.itemsize // 4, 1)
        codes32 = np.ascontiguousarray(arr).view(np.uint32).reshape(arr.shape[0], width)
        codes = np.where(codes32 > 255, 255, codes32).astype(np.uint8)
    elif arr.dtype.kind == "S":
        width = max(arr.dtype.itemsize, 1)
        codes = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape[0], width)
    else:
        raise TypeError(f"quadkeys must be strings, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError("quadkeys must be a 1-D array")
    lengths = (codes != 0).sum(axis=1).astype(np.int64)
    return codes, lengths


def valid_quadkeys(quadkeys: Sequence[str] | npt.ArrayLike) -> BoolArray:
    """Return a boolean mask: which entries are well-formed quadkeys (digits 0-3, zoom 1-23)."""
    return _valid_codes(*_as_codes(quadkeys))


def _valid_codes(codes: npt.NDArray[np.uint8], lengths: IntArray) -> BoolArray:
    """:func:`valid_quadkeys` of quadkeys given as :func:`_as_codes`."""
    width = codes.shape[1]
    pos = np.arange(width)
    inside = pos[None, :] < lengths[:, None]
    # Embedded NULs (non-contiguous) would give lengths that disagree with the first NUL.
    contiguous = ((codes != 0) == inside).all(axis=1)
    digits_ok = np.where(inside, (codes >= 48) & (codes <= 51), True).all(axis=1)
    return contiguous & digits_ok & (lengths >= 1) & (lengths <= MAX_ZOOM)


def quadkey_to_tile(
    quadkeys: Sequence[str] | npt.ArrayLike,
) -> tuple[IntArray, IntArray, IntArray]:
    """Convert quadkeys to tile indices.

    Parameters
    ----------
    quadkeys
        1-D array-like of quadkey strings (zoom 1-23).

    Returns
    -------
    x, y, z
        int64 arrays: tile column, tile row and zoom.

    Raises
    ------
    ValueError
        If any quadkey is malformed (use :func:`valid_quadkeys` to filter first).
    """
    codes, lengths = _as_codes(quadkeys)
    n, width = codes.shape
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    ok = _valid_codes(codes, lengths)
    if not ok.all():
        bad = np.asarray(quadkeys)[~ok][:3]
        raise ValueError(f"malformed quadkeys (digits 0-3, 1-{MAX_ZOOM} of them): {list(bad)}")
    # digit d at position p of a zoom-z key adds (d & 1) << (z-1-p) to x and (d >> 1) to y
    digits = np.where(codes != 0, codes - np.uint8(48), np.uint8(0))
    pos = np.arange(width, dtype=np.int64)
    x = np.zeros(n, dtype=np.int64)
    y = np.zeros(n, dtype=np.int64)
    for zoom in np.unique(lengths):  # one matrix-vector product per zoom (usually one)
        rows = slice(None) if zoom == lengths[0] and (lengths == zoom).all() else lengths == zoom
        weight = np.where(pos < zoom, np.left_shift(1, np.maximum(zoom - 1 - pos, 0)), 0)
        d = digits[rows]
        x[rows] = (d & 1).astype(np.int64) @ weight
        y[rows] = (d >> 1).astype(np.int64) @ weight
    return x, y, lengths


def tile_to_quadkey(x: npt.ArrayLike, y: npt.ArrayLike, z: npt.ArrayLike) -> npt.NDArray[np.str_]:
    """Convert tile indices to quadkey strings (numpy unicode array).

    Parameters
    ----------
    x, y, z
        Tile column, row and zoom (broadcastable integer arrays; zoom 1-23).
    """
    xa, ya, za = np.broadcast_arrays(
        np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64), np.asarray(z, dtype=np.int64)
    )
    xa, ya, za = xa.ravel(), ya.ravel(), za.ravel()
    if xa.size == 0:
        return np.zeros(0, dtype="U1")
    if za.min() < 1 or za.max() > MAX_ZOOM:
        raise ValueError(f"zoom must be in 1..{MAX_ZOOM}")
    if (xa < 0).any() or (ya < 0).any() or (xa >> za).any() or (ya >> za).any():
        raise ValueError("tile x/y out of range for their zoom")
    width = int(za.max())
    uniform = bool((za == width).all())
    # digit `pos` (from the left) of each key, one column at a time: ASCII '0'-'3', or NUL past
    # a key's zoom (numpy's bytes strings end at the first trailing NUL)
    codes = np.zeros((xa.size, width), dtype=np.uint8)
    for pos in range(width):
        shift = width - 1 - pos if uniform else np.maximum(za - 1 - pos, 0)
        digit = (((xa >> shift) & 1) | (((ya >> shift) & 1) << 1)) + 48
        codes[:, pos] = digit if uniform else np.where(za > pos, digit, 0)
    return codes.view(f"S{width}").ravel().astype(f"U{width}")


#: Bits of x and of y in a :func:`tile_keys` key (``MAX_ZOOM`` fits).
_KEY_BITS = 24


def tile_keys(x: npt.ArrayLike, y: npt.ArrayLike, z: npt.ArrayLike) -> IntArray:
    """One int64 key per XYZ tile, ``z << 48 | x << 24 | y``: distinct for distinct tiles at
    any zoom 1-23, and cheaper to sort, look up and carry than quadkey strings (a map's cells
    name their tiles this way, :func:`pipelines.run_inputs.tile_codes`)."""
    xa, ya, za = np.broadcast_arrays(
        np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64), np.asarray(z, dtype=np.int64)
    )
    if xa.size and (za.min() < 1 or za.max() > MAX_ZOOM):
        raise ValueError(f"zoom must be in 1..{MAX_ZOOM}")
    if xa.size and ((xa < 0).any() or (ya < 0).any() or (xa >> za).any() or (ya >> za).any()):
        raise ValueError("tile x/y out of range for their zoom")
    return (za << 2 * _KEY_BITS | xa << _KEY_BITS | ya).ravel()


def keys_to_tile(keys: npt.ArrayLike) -> tuple[IntArray, IntArray, IntArray]:
    """The ``(x, y, z)`` of :func:`tile_keys` keys (a ValueError names a key that no tile has)."""
    k = np.asarray(keys).reshape(-1)
    if k.dtype.kind not in "iu":
        raise TypeError(f"tile keys must be integers, got dtype {k.dtype}")
    k = k.astype(np.int64)
    mask = (1 << _KEY_BITS) - 1
    x, y, z = k >> _KEY_BITS & mask, k & mask, k >> 2 * _KEY_BITS
    bad = (z < 1) | (z > MAX_ZOOM) | (k < 0) | ((x | y) >> np.clip(z, 0, MAX_ZOOM) != 0)
    if bad.any():
        raise ValueError(f"not tile keys (z << 48 | x << 24 | y): {k[bad][:3].tolist()}")
    return x, y, z


def tile_ids_to_tile(tiles: Sequence[str] | npt.ArrayLike) -> tuple[IntArray, IntArray, IntArray]:
    """``(x, y, z)`` of tile ids given as quadkey strings or as :func:`tile_keys` integers."""
    arr = np.asarray(tiles)
    return keys_to_tile(arr) if arr.dtype.kind in "iu" else quadkey_to_tile(arr)


def tile_bounds(
    x: npt.ArrayLike, y: npt.ArrayLike, z: npt.ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Return ``(west, south, east, north)`` in degrees (EPSG:4326) of XYZ tiles."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    n = np.exp2(np.asarray(z, dtype=np.float64))
    west = xa / n * 360.0 - 180.0
    east = (xa + 1.0) / n * 360.0 - 180.0
    north = np.degrees(np.arctan(np.sinh(np.pi * (1.0 - 2.0 * ya / n))))
    south = np.degrees(np.arctan(np.sinh(np.pi * (1.0 - 2.0 * (ya + 1.0) / n))))
    return west, south, east, north


def quadkey_bounds(
    quadkeys: Sequence[str] | npt.ArrayLike,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Return ``(west, south, east, north)`` of quadkeys' tiles."""
    return tile_bounds(*quadkey_to_tile(quadkeys))


def quadkey_centroid(quadkeys: Sequence[str] | npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Return ``(lon, lat)`` of the tiles' centroids (centre of the lon/lat rectangle); the
    tiles as quadkeys or as :func:`tile_keys`."""
    west, south, east, north = tile_bounds(*tile_ids_to_tile(quadkeys))
    return (west + east) / 2.0, (south + north) / 2.0


def lonlat_to_tile(lon: npt.ArrayLike, lat: npt.ArrayLike, zoom: int) -> tuple[IntArray, IntArray]:
    """Return the XYZ tile ``(x, y)`` at ``zoom`` containing each lon/lat point (a longitude
    beyond [-180, 180], as on a grid across the 180° meridian, is taken back by whole turns)."""
    lon_a = native_longitude(lon)
    lat_a = np.clip(np.asarray(lat, dtype=np.float64), -85.05112877980659, 85.05112877980659)
    n = 2.0**zoom
    x = np.floor((lon_a + 180.0) / 360.0 * n)
    s = np.sin(np.radians(lat_a))
    y = np.floor((0.5 - np.log((1.0 + s) / (1.0 - s)) / (4.0 * np.pi)) * n)
    top = int(n) - 1
    return np.clip(x, 0, top).astype(np.int64), np.clip(y, 0, top).astype(np.int64)
