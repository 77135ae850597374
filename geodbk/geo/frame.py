"""A region's frame: its longitudes, across the 180° meridian too, and their [-1, 1]² scaling.

Tables, quadkeys and geometries keep longitudes in [-180, 180]. A region's *frame* is the
shortest arc of longitude that covers it, ``[west, east]`` with ``west`` in [-180, 180] and
``east < west + 360``; across the 180° meridian ``east`` exceeds 180. Scalings and grids work
in the frame, so that the model's inputs and the maps are continuous across the meridian;
geometry tests and quadkeys take longitudes back to [-180, 180] (:func:`native_longitude`).
:class:`Scaling` maps the frame's box to the model's inputs in [-1, 1]².
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from geodbk.geo.longitude import native_longitude, wrap_longitude, wrap_near

__all__ = [
    "Scaling",
    "frame_bounds",
    "geometry_in_frame",
    "longitude_arc",
    "native_box",
    "native_boxes",
    "tile_polygons",
]


def longitude_arc(lon: npt.ArrayLike) -> tuple[float, float]:
    """``(west, east)`` of the shortest arc covering the longitudes (``east`` may exceed 180).

    The arc leaves out the largest gap between neighbouring longitudes around the circle. When
    that gap is the one across the 180° meridian, the arc is ``(min, max)``, unchanged: always
    so when ``max - min <= 180`` (then no other gap can be wider), which needs no sort.
    """
    lon_a = native_longitude(np.asarray(lon, dtype=np.float64).ravel())
    lon_a = lon_a[np.isfinite(lon_a)]
    if lon_a.size == 0:
        raise ValueError("no finite longitude")
    west, east = float(lon_a.min()), float(lon_a.max())
    if east - west <= 180.0:
        return west, east
    lon_a = np.unique(lon_a)
    gaps = np.diff(lon_a)
    i = int(np.argmax(gaps))
    if gaps[i] <= west + 360.0 - east:
        return west, east
    return float(lon_a[i + 1]), float(lon_a[i]) + 360.0


def frame_bounds(geometry: BaseGeometry | npt.ArrayLike) -> tuple[float, float, float, float]:
    """``(west, south, east, north)`` of a geometry, or of an array of them (EPSG:4326), in its
    frame: its bounds, or, when its vertices' shortest arc of longitude crosses the 180°
    meridian, that arc."""
    w, s, e, n = (float(v) for v in shapely.total_bounds(geometry))
    if e - w <= 180.0:
        return (w, s, e, n)
    west, east = longitude_arc(shapely.get_coordinates(geometry)[:, 0])
    return (west, s, east, n)


def geometry_in_frame(geometry: BaseGeometry, *, west: float) -> BaseGeometry:
    """The geometry with each part moved by whole turns so that its centroid's longitude lies
    in ``[west, west + 360)`` (a region split at the 180° meridian made whole for a grid in its
    frame); unchanged when no part moves."""
    w, _, e, _ = shapely.bounds(geometry)
    if w >= west and e < west + 360.0:  # every part is already in the turn
        return geometry
    parts = shapely.get_parts(geometry)
    if parts.size == 0:
        return geometry
    cx = shapely.get_x(shapely.centroid(parts))
    shift = wrap_longitude(cx, west=west) - cx
    if not np.any(shift != 0.0):
        return geometry
    moved = [
        shapely.transform(p, lambda xy, d=d: xy + np.array([d, 0.0])) if d != 0.0 else p
        for p, d in zip(parts, shift, strict=True)
    ]
    return shapely.union_all(moved)


def native_boxes(
    west: float, south: float, east: float, north: float
) -> list[tuple[float, float, float, float]]:
    """The box ``[west, east] x [south, north]`` as ``(west, south, east, north)`` boxes in
    [-180, 180] longitudes: itself, or its two halves either side of the 180° meridian when
    ``east`` exceeds 180."""
    if east <= 180.0:
        return [(west, south, east, north)]
    return [(west, south, 180.0, north), (-180.0, south, east - 360.0, north)]


def native_box(west: float, south: float, east: float, north: float) -> BaseGeometry:
    """:func:`native_boxes` as one polygon, or a multipolygon of the two halves."""
    boxes = [shapely.box(*b) for b in native_boxes(west, south, east, north)]
    return boxes[0] if len(boxes) == 1 else shapely.MultiPolygon(boxes)


def tile_polygons(
    west: npt.ArrayLike, south: npt.ArrayLike, east: npt.ArrayLike, north: npt.ArrayLike
) -> npt.NDArray[np.object_]:
    """Rectangular shapely polygons (counter-clockwise) from bounds arrays."""
    return np.asarray(shapely.box(west, south, east, north, ccw=True), dtype=object)


@dataclass(frozen=True)
class Scaling:
    """Affine map of lon/lat to [-1, 1]²: ``x1 = 2 (lon - lon_min) / (lon_max - lon_min) - 1``.

    The bounds are those of the region's frame (:func:`frame_bounds`): across the 180°
    meridian ``lon_max`` exceeds 180, and a longitude is first moved by whole turns into the
    half-turn either side of the frame's middle.
    """

    lon_min: float
    lon_max: float
    lat_min: float
    lat_max: float

    @classmethod
    def from_bounds(cls, bounds: tuple[float, float, float, float] | npt.ArrayLike) -> Scaling:
        """Scaling from ``(west, south, east, north)``; a degenerate side is widened by 1e-6°."""
        w, s, e, n = (float(v) for v in np.asarray(bounds, dtype=float))
        if not e > w:
            w, e = w - 1e-6, e + 1e-6
        if not n > s:
            s, n = s - 1e-6, n + 1e-6
        return cls(lon_min=w, lon_max=e, lat_min=s, lat_max=n)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scaling:
        """Inverse of :meth:`to_dict`."""
        return cls(
            float(d["lon_min"]), float(d["lon_max"]), float(d["lat_min"]), float(d["lat_max"])
        )

    def to_dict(self) -> dict[str, float]:
        """JSON-ready dict (the ``scaling`` entry of the table metadata)."""
        return {
            "lon_min": self.lon_min,
            "lon_max": self.lon_max,
            "lat_min": self.lat_min,
            "lat_max": self.lat_max,
        }

    def scale(
        self, lon: npt.ArrayLike, lat: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Map lon/lat to ``(x1, x2)``."""
        lon_f = wrap_near(lon, centre=0.5 * (self.lon_min + self.lon_max))
        x1 = 2.0 * (lon_f - self.lon_min) / (self.lon_max - self.lon_min) - 1.0
        x2 = (
            2.0 * (np.asarray(lat, dtype=float) - self.lat_min) / (self.lat_max - self.lat_min)
            - 1.0
        )
        return x1, x2
