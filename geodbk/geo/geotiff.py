"""GeoTIFF / Cloud-Optimised GeoTIFF writing with rioxarray.

One multi-band float32 file per dataset: each band is one variable, its description the variable
name, NaN replaced by ``nodata`` (default -9999), DEFLATE compression, 256-pixel tiles, and for
COG internal overviews (the GDAL ``COG`` driver builds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from geodbk.atomic import atomic_path

#: Nodata value written outside the region.
DEFAULT_NODATA = -9999.0


def write_geotiff(
    ds: Any,
    path: str | Path,
    *,
    variables: Sequence[str],
    fmt: str = "gtiff",
    nodata: float = DEFAULT_NODATA,
    compress: str = "DEFLATE",
    tags: dict[str, str] | None = None,
) -> Path:
    """Write ``variables`` of ``ds`` as one multi-band GeoTIFF, atomically.

    Parameters
    ----------
    ds
        :class:`xarray.Dataset` with dims ``(y, x)`` and a CRS (rioxarray ``spatial_ref``).
        Dask-backed datasets are written window by window (bounded memory) for ``gtiff``.
    path
        Destination ``.tif``.
    variables
        Variables to write, in band order; the band descriptions are these names.
    fmt
        ``gtiff`` (tiled GeoTIFF) or ``cog`` (Cloud-Optimised GeoTIFF with overviews).
    nodata
        Value written where the data are NaN.
    compress
        GDAL compression (``DEFLATE``, ``LZW``, ``ZSTD``, ``NONE``).
    tags
        Extra dataset-level GDAL metadata tags.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    import rioxarray  # noqa: F401  (registers .rio)

    fmt = fmt.lower()
    if fmt not in ("gtiff", "cog"):
        raise ValueError(f"format must be 'gtiff' or 'cog', got {fmt!r}")
    if not variables:
        raise ValueError("no variables to write")
    missing = [v for v in variables if v not in ds.data_vars]
    if missing:
        raise ValueError(f"variables not in dataset: {missing}")
    crs = ds.rio.crs
    bands = []
    for name in variables:
        band = ds[name].astype(np.float32)
        bands.append(band.where(~np.isnan(band), np.float32(nodata)).drop_attrs())
    import xarray as xr

    arr = xr.concat(bands, dim="band").assign_coords(band=np.arange(1, len(variables) + 1))
    arr = arr.transpose("band", "y", "x")
    arr.attrs = {"long_name": tuple(variables)}
    arr = arr.rio.write_crs(crs or "EPSG:4326").rio.write_nodata(np.float32(nodata))
    arr.rio.set_spatial_dims(x_dim="x", y_dim="y", inplace=True)
    options: dict[str, Any] = {"compress": compress}
    if fmt == "cog":
        options.update(driver="COG", overview_resampling="average", blocksize=256)
    else:
        options.update(driver="GTiff", tiled=True, blockxsize=256, blockysize=256)
    path = Path(path)
    with atomic_path(path) as tmp:
        arr.rio.to_raster(tmp, tags=tags or {}, windowed=(fmt == "gtiff"), **options)
    return path


def read_band_descriptions(path: str | Path) -> tuple[str | None, ...]:
    """Band descriptions of a GeoTIFF (for checks and tests)."""
    import rasterio

    with rasterio.open(path) as src:
        return tuple(src.descriptions)
