"""Regular lon/lat grids over a region and the region mask, evaluated in row blocks.

A :class:`Grid` has cell-centre coordinates ``x`` (lon, ascending) and ``y`` (lat, descending,
north-up like a raster). Its default resolution is that of Ookla's zoom-16 tiles (about 610 m)
coarsened, when needed, so the grid has at most ``max_cells`` cells.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from affine import Affine
from shapely.geometry.base import BaseGeometry

from geodbk.geo.frame import geometry_in_frame

#: Default cap on the number of grid cells (rows x columns).
DEFAULT_MAX_CELLS = 1_000_000
#: Zoom of Ookla tiles, the default grid resolution.
DEFAULT_ZOOM = 16


@dataclass(frozen=True)
class Grid:
    """A north-up regular lon/lat grid (EPSG:4326).

    Attributes
    ----------
    x
        Cell-centre longitudes, ascending, shape (nx,).
    y
        Cell-centre latitudes, descending, shape (ny,).
    dx, dy
        Cell size in degrees (both positive).
    """

    x: np.ndarray
    y: np.ndarray
    dx: float
    dy: float

    @property
    def shape(self) -> tuple[int, int]:
        """(ny, nx)."""
        return (len(self.y), len(self.x))

    @property
    def size(self) -> int:
        return len(self.y) * len(self.x)

    @property
    def frame_west(self) -> float:
        """West end of the turn of longitude centred on the grid (``middle - 180``): a geometry
        in [-180, 180] longitudes is moved into ``[frame_west, frame_west + 360)`` before it
        meets a grid across the 180° meridian (:func:`geodbk.geo.frame.geometry_in_frame`)."""
        return 0.5 * float(self.x[0] + self.x[-1]) - 180.0

    def row_blocks(self, block_rows: int) -> Iterator[slice]:
        """Yield row slices of at most ``block_rows`` rows covering the grid."""
        if block_rows < 1:
            raise ValueError("block_rows must be >= 1")
        for start in range(0, len(self.y), block_rows):
            yield slice(start, min(start + block_rows, len(self.y)))

    def transform(self, rows: slice | None = None) -> Affine:
        """The affine transform (pixel corner to lon/lat) of the grid, or of rows ``rows``."""
        top = self.y[0] if rows is None else self.y[rows][0]
        return Affine(
            self.dx, 0.0, float(self.x[0]) - self.dx / 2, 0.0, -self.dy, float(top) + self.dy / 2
        )


def tile_size_deg(zoom: int, lat: float) -> tuple[float, float]:
    """Width and height in degrees of a web-mercator tile of ``zoom`` at latitude ``lat``."""
    if not 0 <= zoom <= 23:
        raise ValueError(f"tile zoom must be within 0..23, got {zoom}")
    dx = 360.0 / 2**zoom
    return dx, dx * math.cos(math.radians(lat))


def _cell_counts(
    bounds: tuple[float, float, float, float], dx: float, dy: float
) -> tuple[int, int]:
    """Columns and rows of whole ``dx`` x ``dy`` cells that cover ``bounds``."""
    lon_min, lat_min, lon_max, lat_max = (float(v) for v in bounds)
    return max(1, math.ceil((lon_max - lon_min) / dx)), max(1, math.ceil((lat_max - lat_min) / dy))


def _cell_count(bounds: tuple[float, float, float, float], dx: float, dy: float) -> int:
    nx, ny = _cell_counts(bounds, dx, dy)
    return nx * ny


def make_grid(
    bounds: tuple[float, float, float, float],
    *,
    resolution: float | None = None,
    tile_zoom: int | None = None,
    max_cells: int | None = DEFAULT_MAX_CELLS,
) -> Grid:
    """Regular grid covering ``bounds`` = (lon_min, lat_min, lon_max, lat_max).

    Parameters
    ----------
    bounds
        Region bounding box in degrees.
    resolution
        Cell size in degrees (square cells in degrees). Exclusive with ``tile_zoom``.
    tile_zoom
        Use the size of a web-mercator tile of this zoom at the region's central latitude.
    max_cells
        When neither is given, the zoom-16 default is coarsened by a common factor until the
        grid has at most this many cells. Ignored when a resolution or zoom is given.

    Returns
    -------
    Grid
        Cells whose centres lie inside ``bounds`` expanded to whole cells.
    """
    lon_min, lat_min, lon_max, lat_max = (float(v) for v in bounds)
    if not (lon_max > lon_min and lat_max > lat_min):
        raise ValueError(f"empty bounds {bounds}")
    if resolution is not None and tile_zoom is not None:
        raise ValueError("give resolution or tile_zoom, not both")
    if resolution is not None:
        if not resolution > 0:
            raise ValueError(f"resolution must be > 0, got {resolution}")
        dx = dy = float(resolution)
    else:
        zoom = DEFAULT_ZOOM if tile_zoom is None else int(tile_zoom)
        dx, dy = tile_size_deg(zoom, 0.5 * (lat_min + lat_max))
        if tile_zoom is None and max_cells is not None:
            cells = ((lon_max - lon_min) / dx) * ((lat_max - lat_min) / dy)
            if cells > max_cells:
                factor = math.sqrt(cells / max_cells)
                dx, dy = dx * factor, dy * factor
            # whole cells round the counts up: coarsen on until the grid fits max_cells
            while _cell_count(bounds, dx, dy) > max(int(max_cells), 1):
                grow = math.sqrt(_cell_count(bounds, dx, dy) / max(int(max_cells), 1))
                dx, dy = dx * grow * (1 + 1e-9), dy * grow * (1 + 1e-9)
    nx, ny = _cell_counts(bounds, dx, dy)
    x = lon_min + dx * (np.arange(nx) + 0.5)
    y = lat_max - dy * (np.arange(ny) + 0.5)
    return Grid(x=x, y=y, dx=dx, dy=dy)


def region_mask(
    geometry: BaseGeometry | Mapping[str, Any], grid: Grid, rows: slice | None = None
) -> np.ndarray:
    """Boolean mask, True where the cell centre lies inside ``geometry``, by rasterising the
    polygons onto the grid's transform (``rasterio.features.geometry_mask``: a cell is inside
    when its centre is) rather than testing every centre against the polygons.

    Parameters
    ----------
    geometry
        Region polygon(s) in EPSG:4326, or their GeoJSON-like mapping
        (``__geo_interface__``), which a caller masking many blocks converts once (after
        :func:`geodbk.geo.frame.geometry_in_frame` with ``west=grid.frame_west``; a shapely
        geometry is moved here).
    grid
        The grid.
    rows
        Only these rows (for block-wise evaluation); default all.

    Returns
    -------
    numpy.ndarray
        ``bool`` array of shape (rows, nx).
    """
    from rasterio.features import geometry_mask

    n_rows = len(grid.y) if rows is None else len(grid.y[rows])
    if n_rows == 0 or (isinstance(geometry, BaseGeometry) and geometry.is_empty):
        return np.zeros((n_rows, len(grid.x)), dtype=bool)
    if isinstance(geometry, BaseGeometry):
        geometry = geometry_in_frame(geometry, west=grid.frame_west)
    mask = geometry_mask(
        [geometry], out_shape=(n_rows, len(grid.x)), transform=grid.transform(rows), invert=True
    )
    return np.asarray(mask, dtype=bool)


def block_rows_for(nx: int, *, max_block_cells: int = 262_144) -> int:
    """Rows per block so that a block holds at most ``max_block_cells`` cells (>= 1 row)."""
    return max(1, max_block_cells // max(nx, 1))
