"""Areas to summarise (counties, tracts, a user's service areas) and their cells on a map grid.

:func:`read_areas` reads a polygon file (GeoJSON, GeoPackage, shapefile or zipped shapefile,
GeoParquet), reprojects it to EPSG:4326, repairs invalid geometries (``shapely.make_valid``,
keeping the polygonal part) with a warning, flags rows without a polygon, and picks each
area's id (``id_column``, else a GEOID/FIPS/id-like column with unique values, else the row
number) and name. Overlapping polygons are split into layers of pairwise-disjoint ones
(:func:`disjoint_layers`, a spatial index over the polygons), so that
:meth:`Areas.rasterise` burns each layer into one int32 raster of polygon indices on a grid's
affine transform (``rasterio.features.rasterize``: a cell belongs to a polygon when its centre
does). :meth:`Areas.representative_cells` gives the cell under the representative point of a
polygon too small to hold a cell centre.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from geodbk.errors import DataError
from geodbk.geo.frame import geometry_in_frame, native_box
from geodbk.geo.grids import Grid
from geodbk.geo.longitude import native_longitude, wrap_longitude
from geodbk.geo.regions import _source, lonlat_without_crs, polygonal_part
from geodbk.local_layer import EARTH_RADIUS_KM

__all__ = [
    "ID_COLUMNS",
    "NAME_COLUMNS",
    "Areas",
    "cell_area_km2",
    "disjoint_layers",
    "read_areas",
]

log = logging.getLogger("geodbk")

WGS84 = "EPSG:4326"
#: Equal-area CRS for polygon areas (World Cylindrical Equal Area).
EQUAL_AREA = "EPSG:6933"
#: Id columns looked for (case-insensitive), in order; the first with unique values is used.
ID_COLUMNS = (
    "GEOID",
    "GEOID20",
    "GEOID10",
    "GEOIDFQ",
    "GEOIDFQ20",
    "AFFGEOID",
    "AFFGEOID20",
    "FIPS",
    "FIPS_CODE",
    "GEOFIPS",
    "id",
    "area_id",
    "fid",
)
#: Name columns looked for (case-insensitive), in order.
NAME_COLUMNS = ("NAMELSAD", "NAMELSAD20", "NAMELSAD10", "NAME", "NAME20", "NAME10", "area_name")
_PARQUET = (".parquet", ".geoparquet")
_FORMATS = "GeoJSON, GeoPackage, shapefile (.shp or zipped) or GeoParquet"


def cell_area_km2(lat: np.ndarray, dx: float, dy: float) -> np.ndarray:
    """Area in km² of lon/lat cells of ``dx`` x ``dy`` degrees centred at latitudes ``lat``:
    ``R² (dx dy in radians) cos(lat)`` on the sphere of radius ``R`` = 6371 km."""
    rad = math.radians(1.0)
    return EARTH_RADIUS_KM**2 * (dx * rad) * (dy * rad) * np.cos(np.radians(lat))


@dataclass
class Areas:
    """Polygons to summarise, in the file's row order.

    Attributes
    ----------
    frame
        The file's rows (EPSG:4326, geometries repaired), its own columns kept.
    ids, names
        Each area's id (text) and name (text, or ``None`` without a name column).
    id_column, name_column
        The columns they come from (``id_column`` ``None``: the row number, from 0).
    polygons
        Each row's polygonal geometry, ``None`` for a row without one (null, empty, points or
        lines): such a row is reported empty.
    layers
        Each polygon's layer of pairwise-disjoint polygons (-1 without a polygon).
    source
        The file's name (no directories: outputs record no local path).
    repaired, unusable
        How many rows were repaired by ``make_valid`` / have no polygon.
    """

    frame: gpd.GeoDataFrame
    ids: np.ndarray
    names: np.ndarray | None
    id_column: str | None
    name_column: str | None
    polygons: np.ndarray
    layers: np.ndarray
    source: str
    repaired: int = 0
    unusable: int = 0
    _tree_cache: tuple[shapely.STRtree, np.ndarray] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def n_layers(self) -> int:
        """Number of layers of pairwise-disjoint polygons (1 for a tiling like counties)."""
        return int(self.layers.max()) + 1 if (self.layers >= 0).any() else 0

    @property
    def usable(self) -> np.ndarray:
        """Rows with a polygon."""
        return self.layers >= 0

    def polygon_area_km2(self) -> np.ndarray:
        """Each polygon's area in km² (equal-area projection; NaN without a polygon)."""
        out = np.full(len(self), np.nan)
        ok = self.usable
        if ok.any():
            geo = gpd.GeoSeries(list(self.polygons[ok]), crs=WGS84).to_crs(EQUAL_AREA)
            out[ok] = geo.area.to_numpy() / 1e6
        return out

    def _tree(self) -> tuple[shapely.STRtree, np.ndarray]:
        if self._tree_cache is None:
            index = np.flatnonzero(self.usable)
            self._tree_cache = (shapely.STRtree(list(self.polygons[index])), index)
        return self._tree_cache

    def areas_of_points(self, lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(points, areas)``: every pair of a point and a polygon that holds it (a point in
        overlapping polygons is in several pairs), from the polygons' spatial index."""
        tree, index = self._tree()
        pts = shapely.points(native_longitude(lon), np.asarray(lat, dtype=np.float64))
        pairs = tree.query(pts, predicate="intersects")
        return pairs[0].astype(np.int64), index[pairs[1]].astype(np.int64)

    def rasterise(self, grid: Grid, rows: slice) -> list[np.ndarray]:
        """One int32 raster (len(rows), nx) per layer: the index of the polygon holding each
        cell centre, -1 for none (``rasterio.features.rasterize`` on the grid's transform)."""
        from rasterio.features import rasterize

        n_rows = len(grid.y[rows])
        shape = (n_rows, len(grid.x))
        out = [np.full(shape, -1, dtype=np.int32) for _ in range(self.n_layers)]
        if n_rows == 0 or not out:
            return out
        y = grid.y[rows]
        west_edge = float(native_longitude(grid.x[0] - grid.dx / 2))
        width = float(grid.x[-1] - grid.x[0]) + grid.dx
        box = native_box(west_edge, y[-1] - grid.dy / 2, west_edge + width, y[0] + grid.dy / 2)
        tree, index = self._tree()
        hits = index[tree.query(box, predicate="intersects")]
        transform = grid.transform(rows)
        west = grid.frame_west
        for layer in range(self.n_layers):
            chosen = hits[self.layers[hits] == layer]
            if chosen.size:
                shapes = ((geometry_in_frame(self.polygons[k], west=west), int(k)) for k in chosen)
                out[layer] = np.asarray(
                    rasterize(shapes, out_shape=shape, transform=transform, fill=-1, dtype="int32"),
                    dtype=np.int32,
                )
        return out

    def representative_cells(self, grid: Grid, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row, col)`` of the grid cell under the representative point
        (``shapely.point_on_surface``) of the polygons ``which``; -1 where it lies outside
        the grid."""
        idx = np.asarray(which, dtype=np.int64)
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        pts = shapely.point_on_surface(list(self.polygons[idx]))
        px = wrap_longitude(shapely.get_x(pts), west=grid.frame_west)
        py = shapely.get_y(pts)
        col = np.floor((px - (grid.x[0] - grid.dx / 2)) / grid.dx).astype(np.int64)
        row = np.floor(((grid.y[0] + grid.dy / 2) - py) / grid.dy).astype(np.int64)
        ny, nx = grid.shape
        inside = (col >= 0) & (col < nx) & (row >= 0) & (row < ny)
        return np.where(inside, row, -1), np.where(inside, col, -1)


def disjoint_layers(polygons: np.ndarray) -> np.ndarray:
    """Split polygons into layers whose members' interiors do not overlap (touching edges
    allowed): greedy colouring of the overlap graph from a spatial index
    (``shapely.STRtree``). ``None`` entries get -1."""
    geoms = np.asarray(polygons, dtype=object)
    layers = np.full(geoms.size, -1, dtype=np.int64)
    index = np.flatnonzero([g is not None for g in geoms])
    if index.size == 0:
        return layers
    valid = np.array(list(geoms[index]), dtype=object)
    tree = shapely.STRtree(valid)
    a, b = tree.query(valid, predicate="intersects")
    keep = a < b
    a, b = a[keep], b[keep]
    overlap = ~shapely.touches(valid[a], valid[b])
    a, b = a[overlap], b[overlap]
    neighbours: dict[int, list[int]] = {}
    for i, j in zip(a.tolist(), b.tolist(), strict=True):
        neighbours.setdefault(j, []).append(i)  # i < j: coloured before j
    colour = np.zeros(valid.size, dtype=np.int64)
    for j in range(valid.size):
        used = {int(colour[i]) for i in neighbours.get(j, ())}
        c = 0
        while c in used:
            c += 1
        colour[j] = c
    layers[index] = colour
    return layers


def _read_frame(path: Path, *, shown: str) -> gpd.GeoDataFrame:
    """The file as a GeoDataFrame (any CRS), or a DataError naming it and the formats."""

    text = str(path)
    is_parquet = path.suffix.lower() in _PARQUET
    try:
        if is_parquet:
            if not path.is_file():
                raise DataError(f"{shown}: no such areas file")
            import pyarrow.parquet as pq

            if b"geo" not in (pq.read_schema(path).metadata or {}):
                raise DataError(
                    f"{shown}: a parquet file without GeoParquet metadata (no geometry column "
                    f"known); write it with geopandas `to_parquet`, or give a {_FORMATS} file"
                )
            return gpd.read_parquet(path)
        _, source, layer = _source(text, what="areas")
        return gpd.read_file(source, layer=layer)
    except DataError:
        raise
    except Exception as exc:  # pyogrio, pyarrow and fiona raise several types of their own
        raise DataError(
            f"{shown}: cannot read this areas file ({type(exc).__name__}: {exc}); give a "
            f"{_FORMATS} file of polygons"
        ) from None


def _as_text(values: pd.Series) -> np.ndarray:
    """Ids as text: integral floats without ``.0`` (a FIPS column read as numbers)."""
    out = []
    for v in values.tolist():
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            out.append(str(int(v)))
        else:
            out.append(str(v))
    return np.array(out, dtype=object)


def _find(columns: list[str], candidates: tuple[str, ...]) -> list[str]:
    lower: dict[str, str] = {}
    for c in columns:
        lower.setdefault(c.lower(), c)
    return [lower[n.lower()] for n in candidates if n.lower() in lower]


def _pick_id(frame: pd.DataFrame, id_column: str | None, *, shown: str) -> str | None:
    """The id column: ``id_column`` (checked), else the first unique candidate, else None."""
    columns = [str(c) for c in frame.columns if c != frame.geometry.name]
    if id_column is not None:
        if id_column not in columns:
            close = _find(columns, (id_column,))
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DataError(
                f"{shown} has no column {id_column!r} (--id-column){hint}; its columns are: "
                f"{', '.join(columns) or 'none'}. Pass one of them with --id-column, or leave "
                "--id-column out to use a GEOID/FIPS/id column or the row number"
            )
        missing = int(frame[id_column].isna().sum())
        if missing:
            raise DataError(
                f"{shown}: column {id_column!r} (--id-column) is empty in {missing} of "
                f"{len(frame)} rows; fill it, or choose another column with --id-column"
            )
        return id_column
    skipped: list[str] = []
    for col in _find(columns, ID_COLUMNS) + _find(columns, NAME_COLUMNS):
        values = frame[col]
        if values.notna().all() and not values.duplicated().any():
            _warn_skipped_ids(frame, skipped, chosen=col, shown=shown)
            return col
        skipped.append(col)
    _warn_skipped_ids(frame, skipped, chosen=None, shown=shown)
    return None


def _warn_skipped_ids(
    frame: pd.DataFrame, skipped: list[str], *, chosen: str | None, shown: str
) -> None:
    """Warn about the id columns (:data:`ID_COLUMNS`) passed over for a repeated or missing
    value, naming the values: a later join on that column would need them."""
    for col in _find(skipped, ID_COLUMNS):
        values = frame[col]
        repeated = sorted({str(v) for v in values[values.duplicated(keep=False)].dropna()})
        why = (
            f"repeats {', '.join(repeated[:5])}" + (" ..." if len(repeated) > 5 else "")
            if repeated
            else f"is empty in {int(values.isna().sum())} rows"
        )
        log.warning(
            "%s: id column %r %s, so the areas are identified by %s instead; fix the file or "
            "pass --id-column %s to see the rows in question",
            shown,
            col,
            why,
            repr(chosen) if chosen else "their row number",
            col,
        )


def read_areas(path: str | Path, *, id_column: str | None = None) -> Areas:
    """Read a polygon file of areas and prepare it for rasterising.

    Parameters
    ----------
    path
        GeoJSON, GeoPackage, shapefile (``.shp`` or a zip, ``FILE.zip!layer.shp`` picking one
        of several layers) or GeoParquet. A file without a CRS is taken as EPSG:4326 when its
        coordinates are lon/lat.
    id_column
        The column that identifies each area; default: the first of :data:`ID_COLUMNS` (then
        :data:`NAME_COLUMNS`) present with unique, non-missing values, else the row number.

    Raises
    ------
    DataError
        Naming the file (and the column): unreadable file, no polygon in it, ``id_column``
        missing (the available columns listed) or with empty values, projected coordinates
        without a CRS.
    """
    p = Path(path)
    shown = p.name.split("!")[0] if "!" in p.name else p.name
    frame = _read_frame(p, shown=shown)
    if not isinstance(frame, gpd.GeoDataFrame) or frame.geometry.name not in frame:
        raise DataError(f"{shown}: no geometry column; give a {_FORMATS} file of polygons")
    if len(frame) == 0:
        raise DataError(f"{shown} holds no areas (0 rows)")
    if frame.crs is None:
        frame = lonlat_without_crs(frame, shown=shown)
    elif frame.crs != WGS84:
        frame = frame.to_crs(WGS84)
    frame = frame.reset_index(drop=True)
    geoms = np.array(frame.geometry.to_numpy(), dtype=object)
    present = np.array([g is not None and not g.is_empty for g in geoms], dtype=bool)
    invalid = np.zeros(geoms.size, dtype=bool)
    if present.any():
        invalid[present] = ~shapely.is_valid(list(geoms[present]))
    for k in np.flatnonzero(invalid):
        geoms[k] = shapely.make_valid(geoms[k])
    if invalid.any():
        log.warning(
            "%s: repaired %d invalid polygon(s) with shapely.make_valid (e.g. row %d)",
            shown,
            int(invalid.sum()),
            int(np.flatnonzero(invalid)[0]),
        )
    polygons = np.array([polygonal_part(g) for g in geoms], dtype=object)
    unusable = np.array([g is None for g in polygons], dtype=bool)
    if unusable.all():
        raise DataError(
            f"{shown}: none of its {len(frame)} rows holds a polygon (null, empty, point or line "
            "geometries); give a file of polygons (counties, tracts, service areas)"
        )
    if unusable.any():
        log.warning(
            "%s: %d of %d rows hold no polygon (null, empty, point or line geometry); they are "
            "reported empty",
            shown,
            int(unusable.sum()),
            len(frame),
        )
    frame = frame.set_geometry(gpd.GeoSeries(list(geoms), crs=WGS84, index=frame.index))
    id_col = _pick_id(frame, id_column, shown=shown)
    ids = _as_text(frame[id_col]) if id_col else np.array([str(i) for i in range(len(frame))])
    names_found = [
        c for c in _find([str(c) for c in frame.columns], NAME_COLUMNS) if c != frame.geometry.name
    ]
    name_col = names_found[0] if names_found else None
    names = None
    if name_col is not None:
        names = np.array(
            [None if pd.isna(v) else str(v) for v in frame[name_col].tolist()], dtype=object
        )
    log.info(
        "read %d areas from %s (id: %s%s)",
        len(frame),
        shown,
        id_col or "row number",
        f", name: {name_col}" if name_col else "",
    )
    return Areas(
        frame=frame,
        ids=ids,
        names=names,
        id_column=id_col,
        name_column=name_col,
        polygons=polygons,
        layers=disjoint_layers(polygons),
        source=shown,
        repaired=int(invalid.sum()),
        unusable=int(unusable.sum()),
    )
