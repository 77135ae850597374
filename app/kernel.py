"""Kernel slices k(., x_ref) over the region grid and the preset reference points.

With the deep basis kernel, ``k(x, x') = phi(x) . phi(x')``; once ``phi`` of the grid is cached
a new slice is one matrix-vector product. Slices are shown normalised by their maximum over the
grid (as in the seed paper's kernel-slice figures), so every panel runs from at most 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from app.colormaps import format_lonlat


@dataclass(frozen=True)
class RefPoint:
    """A reference location for a kernel slice or a point inspection."""

    name: str
    lon: float
    lat: float
    description: str = ""

    @property
    def label(self) -> str:
        """Name with coordinates, for captions."""
        return f"{self.name} ({format_lonlat(self.lon, self.lat, 3)})"


def normalise_slice(values: NDArray[np.floating]) -> NDArray[np.float64]:
    """Divide a kernel slice by its maximum over the grid (NaN cells ignored).

    Parameters
    ----------
    values
        ``k(x_i, x_ref)`` for the grid cells (NaN outside the region).

    Returns
    -------
    ndarray
        The slice with maximum exactly 1 over finite cells; NaN where the input is NaN. If the
        maximum is not positive (a degenerate kernel), the slice is returned all-NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if not finite.any():
        return np.full(v.shape, np.nan)
    peak = float(np.max(v[finite]))
    if not peak > 0:
        return np.full(v.shape, np.nan)
    out: NDArray[np.float64] = np.where(finite, v / peak, np.nan)
    return out


def kernel_slice(
    phi_grid: NDArray[np.floating], phi_ref: NDArray[np.floating]
) -> NDArray[np.float64]:
    """``phi(grid) @ phi(x_ref)``: one matrix-vector product, returned as float64."""
    ref = np.asarray(phi_ref, dtype=phi_grid.dtype).reshape(-1)
    out: NDArray[np.float64] = (phi_grid @ ref).astype(np.float64)
    return out


def _unique_locations(tiles: pd.DataFrame) -> pd.DataFrame:
    """One row per tile location (quadkey), with its total tests and urban flag."""
    agg = tiles.groupby("quadkey", sort=False).agg(
        lon=("lon", "first"),
        lat=("lat", "first"),
        x1=("x1", "first"),
        x2=("x2", "first"),
        urban=("urban", "first"),
        tests=("tests", "sum"),
    )
    return agg.reset_index()


def _km_coords(lon: NDArray[np.floating], lat: NDArray[np.floating]) -> NDArray[np.float64]:
    """Local equirectangular projection to kilometres (good enough for neighbour distances)."""
    lat0 = float(np.mean(lat))
    x = (np.asarray(lon, float) - float(np.mean(lon))) * 111.32 * np.cos(np.radians(lat0))
    y = (np.asarray(lat, float) - lat0) * 110.57
    out: NDArray[np.float64] = np.column_stack([x, y])
    return out


def preset_points(tiles: pd.DataFrame, k: int = 5) -> list[RefPoint]:
    """Choose an urban, a rural and a remote reference location from the observed tiles.

    Data density around a tile is measured by the distance to its ``k``-th nearest other tile
    location (small = dense), so the choice does not depend on the region's size.

    Parameters
    ----------
    tiles
        The tile table (columns ``quadkey``, ``lon``, ``lat``, ``urban``, ``tests``).
    k
        Neighbour rank used for the density.

    Returns
    -------
    list of RefPoint
        * Urban: the urban tile with the densest neighbourhood (ties: most tests).
        * Rural: the rural tile whose neighbourhood density is the median among rural tiles.
        * Remote: the tile farthest from any other observed tile.
        Missing kinds (no urban or no rural tiles) are left out.
    """
    from scipy.spatial import cKDTree

    if tiles.empty:
        return []
    loc = _unique_locations(tiles)
    xy = _km_coords(loc["lon"].to_numpy(), loc["lat"].to_numpy())
    n = len(loc)
    points: list[RefPoint] = []

    def at(kind: str, i: int, note: str) -> RefPoint:
        return RefPoint(kind, float(loc.lon[i]), float(loc.lat[i]), note)

    if n < 2:
        return [at("Remote", 0, "the only observed tile")]
    kk = min(k, n - 1)
    dist, _ = cKDTree(xy).query(xy, k=kk + 1)
    dk = dist[:, kk]  # distance to the k-th other tile
    d1 = dist[:, 1]  # distance to the nearest other tile
    urban = loc["urban"].to_numpy(dtype=bool)
    tests = loc["tests"].to_numpy()
    if urban.any():
        idx = np.flatnonzero(urban)
        best = int(idx[np.lexsort((-tests[idx], dk[idx]))[0]])
        points.append(
            at("Urban", best, f"densest urban tile: {kk} other tiles within {dk[best]:.2g} km")
        )
    if (~urban).any():
        idx = np.flatnonzero(~urban)
        med = np.median(dk[idx])
        pick = int(idx[np.argmin(np.abs(dk[idx] - med))])
        note = f"typical rural tile: {kk} other tiles within {dk[pick]:.2g} km (median)"
        points.append(at("Rural", pick, note))
    far = int(np.argmax(d1))
    points.append(
        at("Remote", far, f"most isolated tile: nearest other observation {d1[far]:.2g} km away")
    )
    return points
