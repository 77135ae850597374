"""Lazy (Dask-backed) predictive grids for very large maps, written window by window.

:func:`grid_dataset` returns an :class:`xarray.Dataset` whose variables are Dask arrays: nothing
is computed until the data are written, and then one chunk (``chunks=(rows, cols)`` cells, all
variables) at a time. :func:`write_grid_geotiff` streams it into a tiled GeoTIFF (or a COG) with
:func:`geodbk.geo.geotiff.write_geotiff`, so memory is bounded by a few chunks whatever the grid
size (a 16384 x 16384 national grid included); see ``docs/scaling.md`` and
``benchmarks/bench_scaling.py``.

The variables are those of ``geodbk predict`` (:func:`pipelines.predict.predict_block`), as
float32, NaN outside ``geometry``. A time-aware model (``geodbk train --time``) is evaluated at
one quarter (``quarter``; default the latest quarter of its table), its inputs built by
:func:`pipelines.rundir.model_inputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from geodbk.errors import DataError
from geodbk.geo.geotiff import write_geotiff
from geodbk.geo.grids import Grid
from geodbk.geo.longitude import native_longitude
from geodbk.geo.timeaxis import format_quarter, quarter_index
from pipelines.predict import predict_block
from pipelines.rundir import TargetSpec, model_inputs, scale_lonlat, time_scaling_of

__all__ = ["DEFAULT_CHUNKS", "grid_dataset", "write_grid_geotiff"]

#: Default chunk (rows, columns): multiples of the 256-pixel GeoTIFF tile, ~1 M cells.
DEFAULT_CHUNKS = (1024, 1024)


def _axis_chunks(size: int, chunk: int) -> tuple[int, ...]:
    chunk = max(1, int(chunk))
    full, rest = divmod(size, chunk)
    return (chunk,) * full + ((rest,) if rest else ())


def grid_dataset(
    model: Any,
    spec: TargetSpec,
    grid: Grid,
    *,
    scaling: dict[str, float],
    thresholds: Sequence[float],
    geometry: Any = None,
    chunks: tuple[int, int] = DEFAULT_CHUNKS,
    chunk_size: int = 65536,
    quarter: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Any:
    """A Dask-backed dataset of the predictive grid (computed chunk by chunk when written).

    Parameters
    ----------
    model
        A fitted :class:`geodbk.DBKRegressor` (or anything with its ``predict``).
    spec
        The target (units, thresholds' names).
    grid
        The lon/lat grid.
    scaling
        Input scaling of the model (``lon_min``, ``lon_max``, ``lat_min``, ``lat_max``).
    thresholds
        Natural-unit thresholds of the exceedance variables.
    geometry
        Region polygon(s) (EPSG:4326); cells whose centre is outside are NaN. ``None``: none.
    chunks
        Dask chunk ``(rows, columns)``.
    chunk_size
        Rows per model evaluation inside a chunk.
    quarter
        Time-aware models: the quarter to map (default: the latest of the metadata's
        ``quarters``); pooled models must get ``None``.
    metadata
        The model's bundle metadata (default ``model.metadata_``): says whether the model is
        time-aware and holds its time scaling.

    Returns
    -------
    xarray.Dataset
        Float32 variables on ``(y, x)`` with CRS EPSG:4326, each a Dask array; attributes
        ``target``, ``resolution_deg``, ``time_aware``, ``quarter`` and ``quarter_status``.

    Raises
    ------
    DataError
        A quarter for a pooled model, or no quarter known for a time-aware one.
    """
    import dask.array as da
    import rioxarray  # noqa: F401  (registers .rio)
    import shapely
    import xarray as xr

    md = dict(metadata if metadata is not None else getattr(model, "metadata_", None) or {})
    ts = time_scaling_of(md)
    if ts is None:
        if quarter is not None:
            raise DataError(
                "this model pools all quarters (trained without --time); retrain with "
                "`geodbk train --time` to map one quarter"
            )
        label, status = "pooled", "pooled"
    else:
        if quarter is None:
            known = sorted(md.get("quarters") or [], key=quarter_index)
            if not known:
                raise DataError("a time-aware model needs a quarter (its metadata lists none)")
            quarter = known[-1]
        quarter = format_quarter(quarter_index(quarter))
        label, status = quarter, ts.describe(quarter)

    def inputs(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        return model_inputs(scale_lonlat(lon, lat, scaling), md, quarter=quarter)

    thr = tuple(float(t) for t in thresholds)
    probe = inputs(grid.x[:1], grid.y[:1])
    names = list(predict_block(model, spec, probe, thr, chunk_size=chunk_size))
    ny, nx = grid.shape
    if geometry is not None:
        shapely.prepare(geometry)

    def block(block_info: dict[Any, Any] | None = None) -> np.ndarray:
        assert block_info is not None
        (_, _), (y0, y1), (x0, x1) = block_info[None]["array-location"]
        lon2, lat2 = np.meshgrid(grid.x[x0:x1], grid.y[y0:y1])
        out = np.full((len(names), y1 - y0, x1 - x0), np.nan, dtype=np.float32)
        if geometry is None:
            mask = np.ones(lon2.shape, dtype=bool)
        else:
            mask = np.asarray(
                shapely.intersects_xy(geometry, native_longitude(lon2), lat2), dtype=bool
            )
        if mask.any():
            X = inputs(lon2[mask], lat2[mask])
            values = predict_block(model, spec, X, thr, chunk_size=chunk_size)
            for i, name in enumerate(names):
                out[i][mask] = values[name]
        return out

    stacked = da.map_blocks(
        block,
        dtype=np.float32,
        chunks=((len(names),), _axis_chunks(ny, chunks[0]), _axis_chunks(nx, chunks[1])),
        meta=np.empty((0, 0, 0), dtype=np.float32),
    )
    ds = xr.Dataset(
        {name: (("y", "x"), stacked[i]) for i, name in enumerate(names)},
        coords={"y": grid.y, "x": grid.x},
        attrs={
            "target": spec.name,
            "resolution_deg": [grid.dx, grid.dy],
            "time_aware": int(ts is not None),
            "quarter": label,
            "quarter_status": status,
        },
    )
    return ds.rio.write_crs("EPSG:4326")


def write_grid_geotiff(
    ds: Any,
    path: str | Path,
    *,
    fmt: str = "gtiff",
    variables: Sequence[str] | None = None,
    tags: dict[str, str] | None = None,
) -> Path:
    """Compute ``ds`` chunk by chunk and write it as a multi-band GeoTIFF (or COG).

    Uses Dask's synchronous scheduler (one chunk in memory at a time, the thread count set by
    ``OMP_NUM_THREADS`` for the model), then :func:`geodbk.geo.geotiff.write_geotiff`.
    """
    import dask

    names = list(variables) if variables is not None else list(ds.data_vars)
    with dask.config.set(scheduler="synchronous"):
        return write_geotiff(ds, path, variables=names, fmt=fmt, tags=tags)
