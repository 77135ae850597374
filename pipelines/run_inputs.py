"""What a run holds besides its tiles and models: the region and urban polygons, the zoom-16
tile of a point, and the quarters the tile table covers."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.errors import DataError
from geodbk.geo.quadkey import TILE_ZOOM, lonlat_to_tile, tile_keys, tile_to_quadkey
from geodbk.geo.timeaxis import format_quarter, quarter_index
from pipelines.rundir import RunDir

log = logging.getLogger("geodbk")


def read_region(rd: RunDir) -> Any:
    """Union of the polygons in ``RUN/region.geojson`` (EPSG:4326)."""
    return read_polygons(rd.region, what="region")


def read_urban(rd: RunDir, *, target: str) -> Any:
    """Union of the urban polygons in ``RUN/urban_areas.geojson`` (EPSG:4326, prepared).

    Raises
    ------
    DataError
        When the run has no urban layer (the model's noise floor per urban/rural class then
        cannot be applied on the grid).
    """
    import shapely

    if not rd.urban_areas.is_file():
        raise DataError(
            f"the {target} model has a noise floor per urban/rural class but {rd.urban_areas} "
            f"is missing; re-run `geodbk ingest` with the urban layer the model was trained "
            f"with, or retrain without +urban (`geodbk train --noise tests+devices`)"
        )
    geom = read_polygons(rd.urban_areas, what="urban layer")
    shapely.prepare(geom)
    return geom


def read_polygons(path: Path, *, what: str) -> Any:
    """Union of the polygons in a GeoJSON file (EPSG:4326); ``what`` names it in errors."""
    import geopandas as gpd

    fix = "write it again with `geodbk ingest` (the run's ingest_report.json lists its inputs)"
    try:
        gdf = gpd.read_file(path)
    except Exception as exc:  # pyogrio raises several types
        raise DataError(f"cannot read {what} {path}: {exc}; {fix}") from exc
    if gdf.empty:
        raise DataError(f"{what} {path} has no features; {fix}")
    if gdf.crs is not None and gdf.crs.to_epsg() != 4326:
        gdf = gdf.to_crs(4326)
    log.info("read %s", path)
    return gdf.geometry.union_all()


def region_kind(rd: RunDir) -> str | None:
    """How ingest found the run's region (``region.geojson``'s ``kind``: ``bbox``, ``tiles``
    for the tiles' extent, or a state or polygon file's kind); ``None`` when it says nothing."""
    try:
        kind = json.loads(rd.region.read_text())["features"][0]["properties"].get("kind")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def region_area_caveat(rd: RunDir) -> str | None:
    """A sentence to put beside area shares when the run's region is a rectangle (``--bbox``,
    or the tiles' extent when ingest got no region): its area counts water and land without
    people. ``None`` for a state or polygon region, or when ``region.geojson`` says nothing."""
    kind = region_kind(rd)
    if kind not in ("bbox", "tiles"):
        return None
    what = "a bounding box (--bbox)" if kind == "bbox" else "the tiles' extent (no region given)"
    return (
        f"The region is {what}, so its area counts water and land without people; ingest with "
        "--state or --region (e.g. a state or county boundary) for shares of the land."
    )


def tile_ids(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """The zoom-16 quadkey of the tile holding each point."""
    x, y = lonlat_to_tile(lon, lat, TILE_ZOOM)
    return tile_to_quadkey(x, y, TILE_ZOOM)


def tile_codes(lon: np.ndarray, lat: np.ndarray) -> pd.Categorical[int]:
    """The zoom-16 tile of each point as a ``pandas.Categorical``: the distinct tiles'
    integer keys (:func:`geodbk.geo.quadkey.tile_keys`, sorted) and one code per point. The
    tile effect and the local layer look tiles up once per distinct tile, not once per point
    (a map has many cells per tile), and never make quadkey strings for them."""
    x, y = lonlat_to_tile(lon, lat, TILE_ZOOM)
    keys, codes = np.unique(tile_keys(x, y, TILE_ZOOM), return_inverse=True)
    return pd.Categorical.from_codes(
        codes.reshape(-1), categories=pd.Index(keys, dtype=np.int64), validate=False
    )


def pooled_label(observed: list[str]) -> str:
    """The quarter label of a pooled model's map: ``pooled 2019Q1:2023Q4`` over the quarters
    ``observed`` (sorted), ``pooled 2023Q4`` for one quarter, ``pooled`` for none."""
    if not observed:
        return "pooled"
    span = observed[0] if observed[0] == observed[-1] else f"{observed[0]}:{observed[-1]}"
    return f"pooled {span}"


def observed_quarters(rd: RunDir, metadata: dict[str, Any]) -> list[str]:
    """The tile table's quarters, sorted: model metadata ``quarters`` (time-aware models), its
    ``tiles_metadata.quarters``, else the ``quarter`` column of ``tiles.parquet``."""
    quarters = metadata.get("quarters") or (metadata.get("tiles_metadata") or {}).get("quarters")
    if not quarters:
        import pyarrow.parquet as pq

        if "quarter" in pq.read_schema(rd.tiles).names:
            col = pq.read_table(rd.tiles, columns=["quarter"]).column("quarter")
            quarters = [str(q) for q in col.unique().to_pylist() if q is not None]
    return sorted(
        {format_quarter(quarter_index(str(q))) for q in quarters or []}, key=quarter_index
    )
