"""Read a list of places to predict at: quadkeys, lon/lat columns or point geometries.

:func:`read_locations` takes a parquet (plain or GeoParquet), CSV, GeoJSON or GeoPackage file
(e.g. a list of serviceable locations) and returns each row's lon/lat in EPSG:4326 plus the
input's own columns (its ids). The place of a row is, in this order of preference, the centre of its
``quadkey`` tile, its ``lon``/``lat`` columns (also ``longitude``/``latitude``, ``lng``,
``x``/``y``), or its point geometry (reprojected to EPSG:4326; other geometries use their
representative point).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.errors import DataError
from geodbk.geo.longitude import native_longitude
from geodbk.geo.quadkey import TILE_ZOOM, lonlat_to_tile, quadkey_centroid, valid_quadkeys
from geodbk.geo.tile_columns import padded_number_quadkeys, padded_quadkeys

__all__ = ["LAT_NAMES", "LON_NAMES", "Locations", "read_locations"]

log = logging.getLogger("geodbk")

#: Column names read as longitude / latitude (case-insensitive), in order of preference.
LON_NAMES = ("lon", "longitude", "lng", "long", "x")
LAT_NAMES = ("lat", "latitude", "y")
_SUFFIXES = {
    ".parquet": "parquet",
    ".geoparquet": "parquet",
    ".csv": "csv",
    ".txt": "csv",
    ".xlsx": "excel",
    ".xls": "excel",
}
_GEOJSON = (".geojson", ".json", ".gpkg")
#: Vector files read through :func:`geodbk.geo.regions.read_vector` (a zip's one layer).
_ZIPPED = (".zip", ".shp")


@dataclass(frozen=True)
class Locations:
    """Places read from a file.

    Attributes
    ----------
    ids
        The input's own columns (geometry dropped), one row per place.
    lon, lat
        EPSG:4326 coordinates (float64); NaN for a row without a place (a blank cell or a
        missing geometry), see :attr:`located`.
    source
        How the places were found: ``quadkey``, ``lon/lat`` or ``geometry``.
    """

    ids: pd.DataFrame
    lon: np.ndarray
    lat: np.ndarray
    source: str

    @property
    def located(self) -> np.ndarray:
        """True for the rows that have a place."""
        return np.isfinite(self.lon) & np.isfinite(self.lat)


def _read_frame(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    try:
        if suffix in _GEOJSON:
            import geopandas as gpd

            return gpd.read_file(path)
        if _SUFFIXES.get(suffix) == "parquet":
            import pyarrow.parquet as pq

            if b"geo" in (pq.read_schema(path).metadata or {}):
                import geopandas as gpd

                return gpd.read_parquet(path)
            return pd.read_parquet(path)
        if _SUFFIXES.get(suffix) == "csv":
            return pd.read_csv(
                path,
                dtype=str,
                keep_default_na=False,
                encoding="utf-8-sig",
                skiprows=_note_lines(path),
            )
        if _SUFFIXES.get(suffix) == "excel":  # ids as text, as in a CSV
            return pd.read_excel(path, dtype=str, keep_default_na=False)
        if suffix in _ZIPPED:
            # local: geodbk.geo.regions imports geopandas, which only vector files need
            from geodbk.geo.regions import read_vector

            return read_vector(path, what="locations")
    except DataError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    except Exception as exc:  # pyogrio / pyarrow raise several types of their own
        raise DataError(f"cannot read {path}: {exc}") from exc
    raise DataError(
        f"{path}: unknown file type {suffix!r}; give a .parquet, .csv, .xlsx, .geojson, .gpkg "
        "or shapefile .zip file"
    )


def _note_lines(path: Path) -> int:
    """The lines opening a CSV that start with ``"# "``: the notes above the header of
    geodbk's own CSVs (``predict --at``, ``service --at``: what they hold, the licence), so one
    can be read back as places. A header such as ``#id,lon,lat`` is not one."""
    count = 0
    with open(path, encoding="utf-8-sig", errors="replace") as handle:
        for line in handle:
            if not line.startswith("# "):
                break
            count += 1
    return count


def _column(frame: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    """The first column of ``frame`` named one of ``names``, ignoring case and the spaces
    around a name (a CSV written with ", " between its fields has " lat "), or ``None``."""
    lower = {str(c).strip().lower(): str(c) for c in frame.columns}
    return next((lower[n] for n in names if n in lower), None)


def _blank(values: pd.Series) -> np.ndarray:
    """Cells with nothing in them: missing, or text that is only spaces."""
    text = values.astype("string").str.strip()
    return np.asarray((values.isna() | (text == "")).fillna(True), dtype=bool)


def _numbers(frame: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """The column as float64; a blank cell is NaN (a row without a place), any other cell that
    is not a number is refused."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values) & ~_blank(frame[column]))
    if bad.size:
        raise DataError(
            f"{path}: column {column!r} has {bad.size} value(s) that are not numbers (first at "
            f"row {int(bad[0]) + 1}: {frame[column].iloc[bad[0]]!r}); fix or drop those rows"
        )
    return values


def _from_quadkeys(frame: pd.DataFrame, column: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = frame[column]
    short = 0
    if pd.api.types.is_numeric_dtype(raw):  # numbers lost a quadkey's leading zeros
        raw, short = padded_number_quadkeys(raw, zoom=TILE_ZOOM)
    elif _SUFFIXES.get(path.suffix.lower()) in ("csv", "excel"):  # numbers written as text
        text = pd.Series(np.where(_blank(raw), "", raw.astype(str).str.strip()), dtype=str)
        raw, short = padded_quadkeys(text, zoom=TILE_ZOOM)
    if short:
        log.warning(
            "%s: column %r holds quadkeys written as numbers; %d zero-padded back to %d digits "
            "(store quadkeys as text)",
            path,
            column,
            short,
            TILE_ZOOM,
        )
    blank = _blank(raw)
    keys = raw.astype(str).str.strip().to_numpy()[~blank]
    bad = np.flatnonzero(~valid_quadkeys(keys))
    if bad.size:
        raise DataError(
            f"{path}: column {column!r} has {bad.size} value(s) that are not quadkeys (digits "
            f"0-3; first at row {int(np.flatnonzero(~blank)[bad[0]]) + 1}: {keys[bad[0]]!r}); fix "
            "or drop those rows"
        )
    lengths = np.unique([len(k) for k in keys])
    if lengths.size > 1:
        raise DataError(
            f"{path}: column {column!r} mixes quadkeys of {lengths.size} lengths "
            f"({', '.join(map(str, lengths))} digits), i.e. different zooms; usually leading "
            "zeros were lost on the way (the file was written with quadkeys as numbers): "
            "store them as text, all of one zoom (Ookla tiles: 16 digits)"
        )
    if lengths.size and int(lengths[0]) != TILE_ZOOM:
        raise DataError(
            f"{path}: column {column!r} holds {int(lengths[0])}-digit quadkeys, but the map's "
            f"tiles are zoom-{TILE_ZOOM} quadkeys of {TILE_ZOOM} digits; a spreadsheet drops "
            "a quadkey's leading 0 (store the quadkeys as text, e.g. quoted in the CSV), and a "
            "cut quadkey names a larger tile (use the original file, or give lon/lat columns)"
        )
    lon, lat = np.full(blank.size, np.nan), np.full(blank.size, np.nan)
    if keys.size:
        lon[~blank], lat[~blank] = quadkey_centroid(keys)
    return lon, lat


def _from_geometry(frame: Any, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Lon/lat of a GeoDataFrame's points (other geometries: a representative point)."""
    import shapely

    gdf = frame
    if gdf.crs is not None and gdf.crs.to_epsg() != 4326:
        gdf = gdf.to_crs(4326)
    geom = np.asarray(gdf.geometry.values, dtype=object)
    empty = shapely.is_missing(geom) | shapely.is_empty(geom)
    lon, lat = np.full(empty.size, np.nan), np.full(empty.size, np.nan)
    pts = shapely.point_on_surface(geom[~empty])
    lon[~empty], lat[~empty] = shapely.get_x(pts), shapely.get_y(pts)
    return lon, lat


def _warn_off_tile(
    frame: pd.DataFrame,
    columns: tuple[str, str],
    lon: np.ndarray,
    lat: np.ndarray,
    path: Path,
) -> None:
    """Log the rows whose lon/lat columns lie in another zoom-16 tile than their quadkey's
    (whose centre ``lon``, ``lat`` is used)."""
    given = [pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=np.float64) for c in columns]
    both = np.isfinite(lon) & np.isfinite(given[0]) & np.isfinite(given[1])
    both &= (np.abs(given[1]) <= 85.0) & (np.abs(given[0]) <= 360.0)
    if not both.any():
        return
    tx, ty = lonlat_to_tile(native_longitude(given[0][both]), given[1][both], TILE_ZOOM)
    qx, qy = lonlat_to_tile(lon[both], lat[both], TILE_ZOOM)
    off = np.flatnonzero((tx != qx) | (ty != qy))
    if off.size:
        log.warning(
            "%s: %d row(s) have %s/%s columns outside their quadkey's tile (first at row %d); "
            "the quadkey places them (drop the quadkey column to use %s/%s)",
            path,
            off.size,
            *columns,
            int(np.flatnonzero(both)[off[0]]) + 1,
            *columns,
        )


def read_locations(path: str | Path) -> Locations:
    """The places listed in ``path`` (see the module docstring).

    Raises
    ------
    DataError
        When the file is missing or unreadable, has no rows, has no quadkey, lon/lat or
        geometry column, or has values that are not quadkeys or numbers, or coordinates
        outside lon [-180, 360] / lat [-90, 90], or no row with a place; the message names the
        file and the column. Longitudes past 180 (a 0-360 convention) are taken back to
        [-180, 180]. A row with a blank place (an empty cell, a missing geometry) is kept with
        NaN coordinates and logged.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder; give the file that lists the places")
    if not path.is_file():
        raise DataError(
            f"{path}: no such file (give a .parquet, .csv, .geojson or .gpkg list of places)"
        )
    frame = _read_frame(path)
    if len(frame) == 0:
        raise DataError(f"{path} has no rows")
    geo_name = str(frame.geometry.name) if hasattr(frame, "crs") else None
    qk, lon_c, lat_c = (
        _column(frame, ("quadkey",)),
        _column(frame, LON_NAMES),
        _column(frame, LAT_NAMES),
    )
    if qk is not None:
        lon, lat = _from_quadkeys(frame, qk, path)
        source = "quadkey"
        if lon_c is not None and lat_c is not None:
            _warn_off_tile(frame, (lon_c, lat_c), lon, lat, path)
    elif lon_c is not None and lat_c is not None:
        lon, lat = _numbers(frame, lon_c, path), _numbers(frame, lat_c, path)
        source = "lon/lat"
    elif geo_name is not None:
        lon, lat = _from_geometry(frame, path)
        source = "geometry"
    else:
        names = list(map(str, frame.columns))
        other = next((d for d in (";", "\t", "|") if len(names) == 1 and d in names[0]), None)
        hint = f" (the file seems to separate its columns by {other!r}: save it with commas)"
        raise DataError(
            f"{path}: found no place columns among {names}{hint if other else ''}; give a "
            "'quadkey' column (text), 'lon'/'lat' columns (EPSG:4326 degrees) or point "
            "geometries (GeoJSON / GeoParquet)"
        )
    outside = np.flatnonzero((lon < -180) | (lon > 360) | (np.abs(lat) > 90))
    if outside.size:
        raise DataError(
            f"{path}: {outside.size} place(s) have coordinates outside lon [-180, 180] (or "
            f"0-360) / lat [-90, 90] (first at row {int(outside[0]) + 1}: {lon[outside[0]]}, "
            f"{lat[outside[0]]}); are the columns swapped or in a projected CRS?"
        )
    located = np.isfinite(lon) & np.isfinite(lat)
    if not located.any():
        raise DataError(f"{path}: no row has a place (every {source} cell is blank)")
    if not located.all():
        first = int(np.flatnonzero(~located)[0]) + 1
        log.warning(
            "%s: %d of %d rows have no place (blank %s; first at row %d): they are kept, "
            "without predictions (located = False)",
            path,
            int((~located).sum()),
            located.size,
            source,
            first,
        )
    lon = native_longitude(lon)
    ids = pd.DataFrame(frame.drop(columns=[geo_name])) if geo_name is not None else frame
    return Locations(ids=ids.reset_index(drop=True), lon=lon, lat=lat, source=source)
