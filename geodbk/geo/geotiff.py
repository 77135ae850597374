"""GeoTIFF / Cloud-Optimised GeoTIFF writing with rioxarray.

One multi-band float32 file per dataset: each band is one variable, its description the variable
name, its units (GDAL's band unit type) and tags as given, NaN replaced by ``nodata`` (default
-9999), DEFLATE compression, 256-pixel tiles, and for COG internal overviews (the GDAL ``COG``
driver builds them from a tiled GeoTIFF, which carries the band metadata and colour table over).
"""

from __future__ import annotations

import contextlib
import errno
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geodbk.atomic import DISK_ERRNOS, atomic_path

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
    descriptions: Sequence[str] | None = None,
    dtype: str = "float32",
    units: Sequence[str] | None = None,
    band_tags: Sequence[dict[str, str]] | None = None,
    colormap: dict[int, tuple[int, int, int, int]] | None = None,
    category_names: Sequence[str] | None = None,
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
    descriptions
        Band descriptions, one per variable (default: the variable names).
    dtype
        Band type: ``float32`` (default) or an integer type such as ``uint8`` for class codes
        (values are rounded; give a ``nodata`` the type can hold, e.g. 255; COG overviews of
        integer bands take the nearest value instead of the average).
    units
        Unit of each band (GDAL's unit type, shown by QGIS and ``gdalinfo``; ``""`` for none),
        one per variable.
    band_tags
        GDAL metadata of each band, one dict per variable.
    colormap
        Colour table of a single ``uint8``/``uint16`` band: ``{value: (r, g, b, alpha)}``.
    category_names
        Names of the codes 0, 1, ... of a single integer band (GDAL's category names, which
        QGIS and ``gdalinfo`` show as the classes' labels). GeoTIFF has no tag for them, so they
        go to GDAL's sidecar ``PATH.aux.xml`` (:func:`write_category_names`).

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
    out_type = np.dtype(dtype)
    if np.issubdtype(out_type, np.integer) and not (
        np.iinfo(out_type).min <= nodata <= np.iinfo(out_type).max
    ):
        raise ValueError(f"nodata {nodata} does not fit the band type {out_type}")
    if descriptions is not None and len(descriptions) != len(variables):
        raise ValueError("give one description per variable")
    for name, given in (("units", units), ("band_tags", band_tags)):
        if given is not None and len(given) != len(variables):
            raise ValueError(f"give one of {name} per variable")
    if colormap is not None and (len(variables) != 1 or out_type not in (np.uint8, np.uint16)):
        raise ValueError("a colour table needs one uint8 or uint16 band")
    if category_names is not None and (len(variables) != 1 or out_type.kind not in "iu"):
        raise ValueError("category names need one integer band")
    bands = []
    for name in variables:
        band = ds[name].astype(np.float32)
        band = band.where(~np.isnan(band), np.float32(nodata))
        if out_type != np.float32:
            band = band.round().astype(out_type)
        bands.append(band.drop_attrs())
    import xarray as xr

    arr = xr.concat(bands, dim="band").assign_coords(band=np.arange(1, len(variables) + 1))
    arr = arr.transpose("band", "y", "x")
    arr.attrs = {"long_name": tuple(descriptions if descriptions is not None else variables)}
    arr = arr.rio.write_crs(crs or "EPSG:4326").rio.write_nodata(out_type.type(nodata))
    arr.rio.set_spatial_dims(x_dim="x", y_dim="y", inplace=True)
    # class codes are not averaged into overviews
    resampling = "average" if out_type.kind == "f" else "nearest"
    path = Path(path)
    _write_tiled(
        arr,
        path,
        fmt=fmt,
        compress=compress,
        tags=tags or {},
        resampling=resampling,
        meta=_BandMetadata(units=units, tags=band_tags, colormap=colormap),
    )
    if category_names is not None:
        write_category_names(path, category_names)
    return path


#: Variable attributes copied into each GeoTIFF band's tags (GDAL band metadata).
BAND_TAG_ATTRIBUTES = ("long_name", "quantity", "threshold", "flag_values", "flag_meanings")


def band_tags(ds: Any, bands: list[str]) -> list[dict[str, str]]:
    """The GDAL metadata of each band: the grid variable's ``long_name`` (what the value is,
    e.g. ``predictive median download of the grid's quantity`` for ``mean_natural``),
    ``quantity``, ``threshold`` and CF flags where it has them (:data:`BAND_TAG_ATTRIBUTES`),
    so that a GeoTIFF read without its NetCDF grid still says what each band holds."""
    return [
        {k: str(ds[b].attrs[k]) for k in BAND_TAG_ATTRIBUTES if k in ds[b].attrs} for b in bands
    ]


def write_category_names(path: str | Path, names: Sequence[str]) -> Path:
    """Write GDAL's PAM sidecar ``PATH.aux.xml`` naming the codes 0, 1, ... of band 1 of the
    raster at ``path`` (``<PAMDataset><PAMRasterBand band="1"><CategoryNames>``), atomically;
    returns the sidecar's path. GDAL reads it with the raster and merges what it adds later
    (statistics, for one) into it."""
    root = ET.Element("PAMDataset")
    band = ET.SubElement(root, "PAMRasterBand", band="1")
    categories = ET.SubElement(band, "CategoryNames")
    for name in names:
        ET.SubElement(categories, "Category").text = str(name)
    ET.indent(root)
    sidecar = Path(path).with_name(Path(path).name + ".aux.xml")
    with atomic_path(sidecar) as tmp:
        ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=False)
    return sidecar


@dataclass(frozen=True)
class _BandMetadata:
    """What GDAL keeps per band besides the data: units, tags and a colour table, set on the
    tiled GeoTIFF before any copy into a COG (which carries them over)."""

    units: Sequence[str] | None = None
    tags: Sequence[dict[str, str]] | None = None
    colormap: dict[int, tuple[int, int, int, int]] | None = None

    def apply(self, path: Path) -> None:
        """Write the metadata into the GeoTIFF at ``path`` (opened for update)."""
        if self.units is None and self.tags is None and self.colormap is None:
            return
        import rasterio

        with rasterio.open(path, "r+") as dst:
            if self.units is not None:
                dst.units = tuple(str(u) for u in self.units)
            for bidx, band in enumerate(self.tags or [], start=1):
                if band:
                    dst.update_tags(bidx, **{k: str(v) for k, v in band.items()})
            if self.colormap is not None:
                dst.write_colormap(1, self.colormap)


#: Free bytes under which a failed GDAL write is taken for a full disk.
_NEARLY_FULL = 1 << 20


def _disk_errno(exc: BaseException, folder: Path) -> int | None:
    """The ``errno`` of a write the disk refused, from GDAL's message or, as GDAL often says
    only "Write failed", from the file system itself; ``None`` for any other failure."""
    code = getattr(exc, "errno", None)
    if code in DISK_ERRNOS:
        return int(code)
    text = str(exc)
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
        if os.strerror(code) in text:
            return code
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if st.f_bavail * st.f_frsize < _NEARLY_FULL:
        return errno.ENOSPC
    return None


@contextlib.contextmanager
def _disk_errors(path: Path) -> Iterator[None]:
    """Raise a write the disk refused (GDAL: a ``RasterioIOError`` or ``CPLE_*`` error without
    ``errno``) as an ``OSError`` with its ``errno``, naming ``path``: the command line then
    answers with its one message and exit code instead of a traceback. Used inside
    :func:`~geodbk.atomic.atomic_path`, while the partial file still takes its room."""
    try:
        yield
    except Exception as exc:
        code = _disk_errno(exc, Path(path).parent)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from exc


def _is_dask(data: Any) -> bool:
    try:
        from dask.base import is_dask_collection
    except ImportError:  # pragma: no cover - dask is a dependency of the pipelines
        return False
    return bool(is_dask_collection(data))


def _write_tiled(
    arr: Any,
    path: Path,
    *,
    fmt: str,
    compress: str,
    tags: dict[str, str],
    resampling: str = "average",
    meta: _BandMetadata | None = None,
) -> None:
    """Write a (band, y, x) array as a tiled GeoTIFF, atomically; ``meta`` is set on it and,
    for ``cog``, it is then copied into a COG by GDAL's ``COG`` driver, which builds the
    overviews from the file, not from memory.

    A Dask-backed array is written chunk by chunk with bounded memory: it is rechunked to all
    bands x multiples of the 256-pixel tile, so each chunk is computed once and written as
    whole tiles (``dask.array.store`` through rioxarray with a lock).
    """
    import threading

    import rasterio.shutil

    meta = meta or _BandMetadata()
    lazy = _is_dask(arr.data)
    if lazy:
        ny, nx = arr.shape[1], arr.shape[2]
        ychunk = _tile_multiple(max(arr.chunks[1]), ny)
        xchunk = _tile_multiple(max(arr.chunks[2]), nx)
        arr = arr.chunk({"band": -1, "y": ychunk, "x": xchunk})
    written: dict[str, Any] = {"lock": threading.Lock()} if lazy else {"windowed": True}
    gtiff = {
        "driver": "GTiff",
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "bigtiff": "IF_SAFER",  # > 4 GB (a 16384^2 x 16-band grid is ~6 GB compressed)
    }
    with atomic_path(path) as tmp, _disk_errors(path):
        if fmt == "gtiff":
            arr.rio.to_raster(tmp, tags=tags, compress=compress, **written, **gtiff)
            meta.apply(tmp)
            return
        plain = Path(str(tmp) + ".plain.tif")
        try:
            with _disk_errors(path):  # judged while the partial files still take their room
                arr.rio.to_raster(plain, tags=tags, compress="NONE", **written, **gtiff)
                meta.apply(plain)
                rasterio.shutil.copy(
                    plain,
                    tmp,
                    driver="COG",
                    compress=compress,
                    blocksize=256,
                    overview_resampling=resampling,
                    bigtiff="IF_SAFER",
                )
        finally:
            plain.unlink(missing_ok=True)


def _tile_multiple(chunk: int, size: int, tile: int = 256) -> int:
    """A chunk length that is a multiple of ``tile`` (or the whole axis when smaller)."""
    if size <= tile:
        return size
    return max(tile, (int(chunk) // tile) * tile)
