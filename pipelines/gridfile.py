"""Stream a large (y, x) grid to a NetCDF file with bounded memory.

The grid is written row block by row block into per-variable spool files (raw big-endian
arrays on disk, next to the destination); :meth:`GridWriter.close` then assembles a classic
NetCDF (64-bit offset, "CDF-2") file by copying each spool into place in 1 MiB pieces, and moves
it onto the destination atomically. Peak memory is one row block, whatever the grid size.

The classic format is used because it is readable by xarray's built-in ``scipy`` engine with
no HDF5 library (``xr.open_dataset(path)``); it has no compression. CF conventions: float
variables carry ``_FillValue`` NaN, bool variables are int8 with ``dtype = "bool"`` (xarray
decodes them to bool), every grid variable has ``grid_mapping = "spatial_ref"`` and the
``spatial_ref`` variable holds the CRS as rioxarray writes it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from scipy.io import netcdf_file

from geodbk.atomic import atomic_path

log = logging.getLogger("geodbk")

_NC_TYPES = {np.dtype(np.float32): "f", np.dtype(np.float64): "d", np.dtype(np.int8): "b"}


class _StreamingNetCDF(netcdf_file):
    """scipy's classic-NetCDF writer, taking large variables' data from spool files."""

    def __init__(self, path: Path, sources: Mapping[str, Path]) -> None:
        super().__init__(str(path), "w", version=2)
        self.__dict__["_sources"] = dict(sources)

    def _write_var_data(self, name: str) -> None:
        sources: dict[str, Path] = self.__dict__["_sources"]
        if name not in sources:
            super()._write_var_data(name)
            return
        var = self.variables[name]
        begin = self.fp.tell()
        self.fp.seek(var._begin)
        self._pack_begin(begin)
        self.fp.seek(begin)
        with open(sources[name], "rb") as src:
            shutil.copyfileobj(src, self.fp, 1 << 20)
        count = var.data.size * var.data.itemsize
        self._write_var_padding(var, var._vsize - count)


def _attr(value: Any) -> Any:
    """Attribute value acceptable to the classic format (str, number, 1-D array)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list | tuple):
        return np.asarray(value, dtype=np.float64)
    if isinstance(value, str | int | float | np.ndarray | np.number):
        return value
    return str(value)


def sweep_spools(path: Path) -> list[Path]:
    """Remove what a killed writer of ``path`` left next to it: spool folders
    ``.NAME.*`` and atomic temporaries ``.NAME.*.part*`` (callers hold the run's target lock,
    so none is in use). Returns what was removed."""
    removed = []
    for leftover in Path(path).parent.glob(f".{Path(path).name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover)
    if removed:
        log.info("removed %d leftover temporary file(s) of %s", len(removed), path)
    return removed


class GridWriter:
    """Write variables of a (y, x) grid in row blocks, then assemble the NetCDF file.

    Parameters
    ----------
    path
        Destination ``.nc``.
    x, y
        1-D coordinates (lon ascending, lat descending).
    variables
        ``{name: (dtype, attrs)}``; dtype float32, float64 or bool.
    attrs
        Global attributes.
    crs_attrs
        Attributes of the ``spatial_ref`` variable (from rioxarray's ``write_crs``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        x: np.ndarray,
        y: np.ndarray,
        variables: Mapping[str, tuple[Any, dict[str, Any]]],
        attrs: Mapping[str, Any],
        crs_attrs: Mapping[str, Any],
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.x = np.asarray(x, dtype=np.float64)
        self.y = np.asarray(y, dtype=np.float64)
        self.variables = {n: (np.dtype(d), dict(a)) for n, (d, a) in variables.items()}
        self.attrs = dict(attrs)
        self.crs_attrs = dict(crs_attrs)
        sweep_spools(self.path)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        self._spools = {n: self._tmp / f"{n}.bin" for n in self.variables}
        self._rows_done = np.zeros(len(self.y), dtype=bool)
        for spool in self._spools.values():
            spool.touch()

    def _disk_dtype(self, name: str) -> np.dtype[Any]:
        dt = self.variables[name][0]
        return np.dtype(">i1") if dt == np.dtype(bool) else dt.newbyteorder(">")

    def write_rows(self, rows: slice, values: Mapping[str, np.ndarray]) -> None:
        """Write rows ``rows`` of every variable; ``values[name]`` has shape (rows, nx)."""
        nx = len(self.x)
        n_rows = rows.stop - rows.start
        for name in self.variables:
            arr = np.asarray(values[name])
            if arr.shape != (n_rows, nx):
                raise ValueError(f"{name}: block shape {arr.shape}, expected {(n_rows, nx)}")
            dt = self._disk_dtype(name)
            with open(self._spools[name], "r+b") as fh:
                fh.seek(rows.start * nx * dt.itemsize)
                fh.write(arr.astype(dt).tobytes())
        self._rows_done[rows] = True

    def close(self) -> Path:
        """Assemble the file atomically at :attr:`path`; every row must have been written."""
        try:
            if not self._rows_done.all():
                raise ValueError(f"{int((~self._rows_done).sum())} grid rows were never written")
            with atomic_path(self.path) as tmp:
                nc = _StreamingNetCDF(tmp, self._spools)
                try:
                    self._layout(nc)
                finally:
                    nc.close()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        """Remove the spool files without writing the destination."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _layout(self, nc: Any) -> None:
        nc.createDimension("y", len(self.y))
        nc.createDimension("x", len(self.x))
        for name, values, attrs in (
            (
                "y",
                self.y,
                {
                    "units": "degrees_north",
                    "standard_name": "latitude",
                    "long_name": "latitude",
                    "axis": "Y",
                },
            ),
            (
                "x",
                self.x,
                {
                    "units": "degrees_east",
                    "standard_name": "longitude",
                    "long_name": "longitude",
                    "axis": "X",
                },
            ),
        ):
            v = nc.createVariable(name, "d", (name,))
            v[:] = values
            for k, val in attrs.items():
                setattr(v, k, val)
        ref = nc.createVariable("spatial_ref", "i", ())
        ref.data[()] = 0
        for k, val in self.crs_attrs.items():
            setattr(ref, k, _attr(val))
        for name, (dt, attrs) in self.variables.items():
            code = "b" if dt == np.dtype(bool) else _NC_TYPES[dt]
            var = nc.createVariable(name, code, ("y", "x"))
            if code in "fd":
                var._FillValue = np.array(np.nan, dtype=dt)
            else:
                var._attributes["dtype"] = "bool"  # xarray decodes int8 + this to bool
            for k, val in attrs.items():
                setattr(var, k, _attr(val))
            var.grid_mapping = "spatial_ref"
            var.coordinates = "spatial_ref"
        for k, val in self.attrs.items():
            setattr(nc, k, _attr(val))
