"""Regions: a state from a Census state-boundary file, any polygon file, a bounding box."""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from geodbk.atomic import atomic_write_text
from geodbk.errors import DataError
from geodbk.geo.frame import Scaling, frame_bounds, native_box
from geodbk.geo.longitude import wrap_longitude

WGS84 = "EPSG:4326"

log = logging.getLogger("geodbk")

_STATE_CODE_FIELDS = ("STUSPS", "STUSPS20", "STUSPS10", "STUSAB", "POSTAL")
_STATE_NAME_FIELDS = ("NAME", "NAME20", "NAME10")
_STATE_FIPS_FIELDS = ("GEOID", "STATEFP", "GEOID20", "STATEFP20", "GEOID10", "STATEFP10")


#: Vector formats looked for inside a zip archive.
_ZIP_LAYER_SUFFIXES = (".shp", ".gpkg", ".geojson", ".json")
#: Separator of ``ARCHIVE.zip!member`` (the layer to read inside a zip with several).
ZIP_MEMBER_SEPARATOR = "!"


def _is_junk(member: str) -> bool:
    """macOS resource forks (``__MACOSX/``, ``._name``) and other hidden entries."""
    parts = member.split("/")
    return "__MACOSX" in parts or any(part.startswith(".") for part in parts if part)


def zip_layer(path: Path, member: str | None = None, *, what: str = "vector") -> str:
    """The GDAL path (``/vsizip/ARCHIVE/member``) of the vector layer inside a zip archive.

    The archive may hold the layer in a folder, beside macOS ``__MACOSX/._*`` entries (skipped).
    With several layers, ``member`` (a member path or file name) chooses one; without it the
    error lists them and says how to choose (``ARCHIVE.zip!member.shp``).
    """
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/") and not _is_junk(n)]
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"{path}: not a readable zip archive ({exc})") from exc
    layers = [n for n in names if n.lower().endswith(_ZIP_LAYER_SUFFIXES)]
    if member is not None:
        chosen = [n for n in layers if n == member or n.rsplit("/", 1)[-1] == member]
        if len(chosen) != 1:
            raise DataError(
                f"{path}: no single layer {member!r} in the archive; it holds "
                f"{', '.join(layers) or 'no vector layer'}"
            )
        return f"/vsizip/{path.resolve()}/{chosen[0]}"
    if not layers:
        raise DataError(
            f"{path}: the zip archive holds no {what} layer (.shp, .gpkg or .geojson); it holds "
            f"{', '.join(names[:10]) or 'nothing'}"
        )
    if len(layers) > 1:
        raise DataError(
            f"{path}: the zip archive holds {len(layers)} layers ({', '.join(layers)}); name "
            f"the {what} layer as {path}{ZIP_MEMBER_SEPARATOR}{layers[0].rsplit('/', 1)[-1]}"
        )
    return f"/vsizip/{path.resolve()}/{layers[0]}"


def _source(path: str | Path, *, what: str) -> tuple[Path, str, str | None]:
    """``(file on disk, what GDAL opens, its layer)`` for a vector path: a zip archive
    (optionally ``ARCHIVE.zip!member``) resolves to its one layer (:func:`zip_layer`); a file of
    several layers (a GeoPackage) needs ``FILE.gpkg!layer``, and the error lists them."""
    text = str(path)
    member = None
    if ZIP_MEMBER_SEPARATOR in text and not Path(text).exists():
        text, member = text.split(ZIP_MEMBER_SEPARATOR, 1)
    p = Path(text)
    if not p.exists():
        raise DataError(f"{p}: no such {what} file")
    if p.suffix.lower() == ".zip" or (member is not None and zipfile.is_zipfile(p)):
        return p, zip_layer(p, member, what=what), None
    try:
        import pyogrio

        layers = [str(name) for name in pyogrio.list_layers(str(p))[:, 0]]
    except Exception:  # not a vector file: reading it says so
        return p, str(p), member
    if member is not None and member not in layers:
        raise DataError(f"{p}: no layer {member!r} in the file; it holds {', '.join(layers)}")
    if member is None and len(layers) > 1:
        raise DataError(
            f"{p}: the file holds {len(layers)} layers ({', '.join(layers)}); name the {what} "
            f"layer after a '{ZIP_MEMBER_SEPARATOR}': {p}{ZIP_MEMBER_SEPARATOR}LAYER"
        )
    return p, str(p), member


def lonlat_without_crs(gdf: gpd.GeoDataFrame, *, shown: str | Path) -> gpd.GeoDataFrame:
    """A file's features read without a CRS, as EPSG:4326 when their coordinates are lon/lat
    degrees (logged); projected coordinates (metres, feet) are refused.

    Parameters
    ----------
    gdf
        The features, ``crs`` ``None``.
    shown
        The file as named in messages.

    Raises
    ------
    DataError
        When the coordinates are out of the lon/lat range: the file lost its CRS (a shapefile
        without its ``.prj``).
    """
    bounds = np.asarray(gdf.total_bounds, dtype=np.float64)
    if np.isfinite(bounds).all():
        w, s, e, n = bounds
        if not (-180 <= w <= e <= 180 and -90 <= s <= n <= 90):
            raise DataError(
                f"{shown} has no coordinate reference system and its coordinates are not lon/lat "
                "degrees; give the file with its CRS (e.g. the shapefile's .prj)"
            )
    log.warning("%s has no CRS; taking it as lon/lat (EPSG:4326)", shown)
    return gdf.set_crs(WGS84)


def read_vector(
    path: str | Path,
    *,
    bbox: tuple[float, float, float, float] | None = None,
    what: str = "vector",
) -> gpd.GeoDataFrame:
    """Read a vector file (shapefile zip, GeoJSON, GeoPackage, ...) and reproject it to EPSG:4326.

    Parameters
    ----------
    path
        The file. A zip archive is searched for its layer (:func:`zip_layer`: in a folder, with
        macOS ``__MACOSX`` entries skipped); ``ARCHIVE.zip!name.shp`` picks one of several.
    bbox
        Optional ``(west, south, east, north)`` in EPSG:4326: only features intersecting it are
        read (the box is transformed to the file's CRS first); the frame's ``attrs["clipped"]``
        says whether that left any out.
    what
        What the file is, for error messages (e.g. ``"urban-area"``).

    Raises
    ------
    DataError
        If the file is missing, unreadable, has no geometry, or has no CRS and coordinates
        that are not lon/lat (:func:`lonlat_without_crs`).
    """
    p, source, layer = _source(path, what=what)
    try:
        import pyogrio

        file_bbox, in_file = None, None
        if bbox is not None:
            info = pyogrio.read_info(source, layer=layer)
            in_file = info.get("features")
            crs = info.get("crs")
            # without a CRS the file's units are unknown: read it all, filter once in degrees
            file_bbox = bbox if crs else None
            if crs and gpd.GeoSeries([shapely.box(*bbox)], crs=WGS84).crs != crs:
                file_bbox = tuple(
                    gpd.GeoSeries([shapely.box(*bbox)], crs=WGS84).to_crs(crs).total_bounds
                )
        gdf = (
            gpd.read_file(source, bbox=file_bbox, layer=layer)
            if file_bbox is not None
            else gpd.read_file(source, layer=layer)
        )
    except Exception as exc:
        raise DataError(
            f"{p}: cannot read this {what} file ({type(exc).__name__}: {exc}); use a shapefile "
            "zip, GeoJSON or GeoPackage"
        ) from exc
    if "geometry" not in gdf or not isinstance(gdf, gpd.GeoDataFrame):
        raise DataError(f"{p}: the {what} file has no geometry")
    if gdf.crs is None:
        gdf = lonlat_without_crs(gdf, shown=p)
        if bbox is not None and file_bbox is None:
            in_file = len(gdf)
            gdf = gdf[gdf.geometry.intersects(shapely.box(*bbox))]
    elif gdf.crs != WGS84:
        gdf = gdf.to_crs(WGS84)
    usable = gdf.geometry.notna() & ~gdf.geometry.is_empty
    null = int((~usable).sum())
    if len(gdf) and null == len(gdf):
        raise DataError(
            f"{p}: every one of the {len(gdf)} {what} geometries is null or empty (a damaged "
            "or incomplete .shp?), so nothing could be labelled or mapped; use an intact copy"
        )
    gdf = gdf[usable].reset_index(drop=True)
    gdf.attrs["null_geometries"] = null  # dropped here; callers record the count
    # whether ``bbox`` left features of the file out (a count of -1 or none: unknown, so yes)
    gdf.attrs["clipped"] = in_file is not None and (in_file < 0 or in_file > len(gdf) + null)
    return gdf


@dataclass(frozen=True)
class Region:
    """A study region: its boundary (EPSG:4326) and where it came from.

    Attributes
    ----------
    name
        Display name (``Hawaii``, a file stem, ``bbox``).
    geometry
        (Multi)polygon, EPSG:4326.
    kind
        ``state``, ``polygon``, ``bbox`` or ``tiles`` (extent of the data, no filter given).
    source
        The name of the file it was read from (``None`` for a bbox); no local path is kept,
        since the region is recorded in outputs.
    attrs
        Extra identifiers (``STUSPS``, ``GEOID``, ...).
    """

    name: str
    geometry: BaseGeometry
    kind: str
    source: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """``(west, south, east, north)`` in [-180, 180] longitudes (a filter's box: across the
        180° meridian it spans every longitude)."""
        w, s, e, n = self.geometry.bounds
        return (float(w), float(s), float(e), float(n))

    @property
    def extent(self) -> tuple[float, float, float, float]:
        """``(west, south, east, north)`` in the region's frame
        (:func:`geodbk.geo.frame.frame_bounds`: ``east`` exceeds 180 across the 180°
        meridian); scalings and grids span this."""
        return frame_bounds(self.geometry)

    def contains(self, lon: npt.ArrayLike, lat: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Vectorised test of which points lie inside (or on the boundary of) the region."""
        lon_a = np.asarray(lon, dtype=float)
        lat_a = np.asarray(lat, dtype=float)
        if self.kind == "bbox":
            w, s, e, n = self.extent
            lon_f = wrap_longitude(lon_a, west=w)
            return (lon_f >= w) & (lon_f <= e) & (lat_a >= s) & (lat_a <= n)
        geom = self.geometry
        shapely.prepare(geom)
        return np.asarray(shapely.intersects_xy(geom, lon_a, lat_a), dtype=bool)

    def overlaps(self, polygons: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Which ``polygons`` (tiles, EPSG:4326) overlap the region: a tile at the edge of a
        generalised coastline may overlap it with its centre outside."""
        geom = self.geometry
        shapely.prepare(geom)
        return np.asarray(shapely.intersects(geom, np.asarray(polygons)), dtype=bool)

    def scaling(self) -> Scaling:
        """The [-1, 1]² scaling by the region's bounding box in its frame (:attr:`extent`)."""
        return Scaling.from_bounds(self.extent)

    def to_geodataframe(self) -> gpd.GeoDataFrame:
        """One-row GeoDataFrame (EPSG:4326) with name, kind and attrs, for ``region.geojson``."""
        props = {"name": self.name, "kind": self.kind, "source": self.source or ""}
        props.update({k: str(v) for k, v in self.attrs.items()})
        return gpd.GeoDataFrame(
            {k: [v] for k, v in props.items()}, geometry=[self.geometry], crs=WGS84
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (the ``region`` entry of the table metadata)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "bounds": list(self.bounds),
            "extent": list(self.extent),
            "attrs": {k: str(v) for k, v in self.attrs.items()},
        }


def _dissolve(gdf: gpd.GeoDataFrame) -> BaseGeometry:
    geom = shapely.union_all(shapely.make_valid(gdf.geometry.to_numpy()))
    polys = [g for g in shapely.get_parts(geom) if g.geom_type in ("Polygon", "MultiPolygon")]
    if not polys:
        raise DataError("the region file has no polygons")
    return shapely.union_all(polys) if len(polys) > 1 else polys[0]


def state_region(states_file: str | Path, state: str) -> Region:
    """A state's region from a Census state-boundary file (e.g. ``cb_2018_us_state_500k.zip``).

    Parameters
    ----------
    states_file
        Any vector file with ``STUSPS``/``NAME``/``GEOID`` (or ``STATEFP``) fields.
    state
        Postal code (``HI``), name (``Hawaii``) or FIPS code (``15``), case-insensitive.
    """
    gdf = read_vector(states_file, what="state-boundary")
    key = str(state).strip()
    match = np.zeros(len(gdf), dtype=bool)
    fields = [f for f in (*_STATE_CODE_FIELDS, *_STATE_NAME_FIELDS) if f in gdf.columns]
    for f in fields:
        match |= gdf[f].astype(str).str.strip().str.casefold().to_numpy() == key.casefold()
    if key.isdigit():
        for f in (f for f in _STATE_FIPS_FIELDS if f in gdf.columns):
            match |= gdf[f].astype(str).str.strip().str.zfill(2).to_numpy() == key.zfill(2)
    if not fields and not any(f in gdf.columns for f in _STATE_FIPS_FIELDS):
        raise DataError(
            f"{states_file}: not a state-boundary file (no STUSPS, NAME or GEOID field); "
            "use cb_2018_us_state_500k.zip or pass the boundary with --region"
        )
    if not match.any():
        code_f = next(
            (f for f in _STATE_CODE_FIELDS if f in gdf.columns), fields[0] if fields else None
        )
        known = sorted(gdf[code_f].astype(str))[:60] if code_f else []
        raise DataError(
            f"{states_file}: no state {state!r} (give a postal code, name or FIPS code; "
            f"the file has: {', '.join(known)})"
        )
    rows = gdf[match]
    first = rows.iloc[0]
    attrs = {f: first[f] for f in ("STUSPS", "NAME", "GEOID", "STATEFP") if f in rows.columns}
    name_f = next((f for f in _STATE_NAME_FIELDS if f in rows.columns), None)
    name = str(first[name_f]) if name_f else key
    return Region(
        name=name,
        geometry=_dissolve(rows),
        kind="state",
        source=Path(states_file).name,
        attrs=attrs,
    )


def polygon_region(path: str | Path) -> Region:
    """The union of all polygons of a vector file as the region."""
    gdf = read_vector(path, what="region")
    if gdf.empty:
        raise DataError(f"{path}: the region file has no features")
    try:
        geom = _dissolve(gdf)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None
    name_f = next((f for f in ("NAME", "name", *_STATE_NAME_FIELDS) if f in gdf.columns), None)
    name = str(gdf.iloc[0][name_f]) if name_f and len(gdf) == 1 else Path(path).stem
    return Region(name=name, geometry=geom, kind="polygon", source=Path(path).name)


def polygonal_part(geom: BaseGeometry | None) -> BaseGeometry | None:
    """The polygonal part of a geometry (None for null, empty, points or lines): an
    intersection's lines and points along a shared edge dropped."""
    if geom is None or geom.is_empty:
        return None
    if geom.geom_type in ("Polygon", "MultiPolygon"):
        return geom
    parts = [p for p in shapely.get_parts(geom) if p.geom_type in ("Polygon", "MultiPolygon")]
    return shapely.union_all(parts) if parts else None


def bbox_region(west: float, south: float, east: float, north: float) -> Region:
    """A bounding-box region (degrees, EPSG:4326). ``west > east`` is a box across the 180°
    meridian (as in GeoJSON), e.g. ``172 51 -129 72`` for Alaska with its far Aleutians; such a
    box wider than half the globe is refused as swapped."""
    w, s, e, n = (float(v) for v in (west, south, east, north))
    if not (-180 <= w <= 180 and -180 <= e <= 180 and w != e and -90 <= s < n <= 90):
        raise DataError(
            f"bad --bbox {w} {s} {e} {n}: give WEST SOUTH EAST NORTH in degrees (longitudes in "
            "-180..180) with south < north and west < east (west > east: across the 180° "
            "meridian)"
        )
    if w > e and e + 360.0 - w > 180.0:
        raise DataError(
            f"bad --bbox {w} {s} {e} {n}: west > east is a box across the 180° meridian, here "
            f"{e + 360.0 - w:g}° wide; give WEST SOUTH EAST NORTH with west < east (--bbox {e} "
            f"{s} {w} {n}?)"
        )
    geometry = native_box(w, s, e if e > w else e + 360.0, n)
    return Region(name="bbox", geometry=geometry, kind="bbox")


def resolve_region(
    *,
    state: str | None = None,
    states_file: str | Path | None = None,
    region: str | Path | None = None,
    bbox: tuple[float, float, float, float] | None = None,
) -> Region | None:
    """Build the region from exactly one of: ``state`` + ``states_file``, ``region``, ``bbox``.

    Returns ``None`` when none is given.
    """
    given = [
        n for n, v in (("--state", state), ("--region", region), ("--bbox", bbox)) if v is not None
    ]
    if len(given) > 1:
        raise DataError(f"give only one of --state, --region, --bbox (got {', '.join(given)})")
    if state is not None:
        if states_file is None:
            raise DataError(
                "--state needs --states-file (a Census state-boundary file such as "
                "cb_2018_us_state_500k.zip; `geodbk download` fetches it)"
            )
        return state_region(states_file, state)
    if region is not None:
        return polygon_region(region)
    if bbox is not None:
        if len(bbox) != 4:
            raise DataError("--bbox needs 4 numbers: WEST SOUTH EAST NORTH")
        return bbox_region(*bbox)
    return None


def write_region_geojson(region: Region, path: str | Path) -> None:
    """Write the region boundary to a GeoJSON file atomically."""

    atomic_write_text(path, region.to_geodataframe().to_json(drop_id=True))
