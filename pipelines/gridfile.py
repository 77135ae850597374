"""Stream a large (y, x) grid to a NetCDF-4 file with bounded memory.

The grid is written row block by row block, in order, straight into a NetCDF-4 (HDF5) file
through h5netcdf, compressed (HDF5's deflate with byte shuffle), at a hidden temporary path
next to the destination; :meth:`GridWriter.close` moves it onto the destination atomically.
Chunks are tiles of at most ``CHUNK_CELLS`` cells (``CHUNK_COLS`` columns wide, or as many rows
as the caller writes per block), so that the ocean or land around a region falls in chunks
holding only the fill value, which are not stored at all (readers get the fill value). Blocks
are gathered into whole rows of chunks, whose chunks are encoded here, in parallel threads
(the encoder releases the GIL), and written raw. The deflate streams come from ISA-L
(``isal.isal_zlib``; the standard library's ``zlib`` where isal is not installed): the zlib
format HDF5's deflate filter reads, at about four times zlib's speed (a few % larger). Peak
memory is one row block plus one row of chunks, whatever the grid size. Paths and attributes
may hold any Unicode text. CF conventions (``Conventions = "CF-1.8"``): float variables carry
``_FillValue`` NaN, bool variables are int8 with ``dtype = "bool"`` (xarray decodes them to
bool), every grid variable has ``grid_mapping = "spatial_ref"`` and the ``spatial_ref``
variable holds the CRS as rioxarray writes it. Read with ``xr.open_dataset(path)`` (engine
``h5netcdf``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5netcdf
import numpy as np

try:  # ISA-L's deflate: the same zlib format, about four times zlib's speed
    from isal import isal_zlib as deflate
except ImportError:  # an install without isal: the standard library's, slower
    import zlib as deflate  # type: ignore[no-redef]

from geodbk.atomic import disk_error
from geodbk.errors import DataError

log = logging.getLogger("geodbk")

#: CF version the grids follow.
CONVENTIONS = "CF-1.8"
#: Deflate level of the grid variables (ISA-L's 0-3; 1: fast, about zlib level 1's size;
#: NaN-filled ocean compresses to almost nothing).
COMPRESSION_LEVEL = 1
#: Cells per HDF5 chunk at most (64 KB of float32): small enough that the chunks holding both
#: land and ocean, which are stored, hold little ocean.
CHUNK_CELLS = 16_384
#: Columns per HDF5 chunk at most (a narrower grid's chunks span its width).
CHUNK_COLS = 256
#: Room kept free beyond a block's bytes: HDF5 metadata and headers.
SPACE_MARGIN = 1 << 20
#: Bytes of written chunks HDF5 may hold per variable before writing them (its chunk cache).
CHUNK_CACHE = 1 << 20
#: Key of a block's data mask among its variables (not a valid variable name).
_DATA_MASK = "\x00data_mask"


def encode_chunk(values: np.ndarray, *, level: int = COMPRESSION_LEVEL) -> bytes:
    """One chunk as HDF5's shuffle + deflate filters store it: the bytes regrouped by their
    position in each element (byte 0 of every element, then byte 1, ...), then deflate in the
    zlib format."""
    flat = np.ascontiguousarray(values).reshape(-1)
    size = flat.dtype.itemsize
    shuffled = flat.view(np.uint8).reshape(-1, size).T.copy() if size > 1 else flat.view(np.uint8)
    return deflate.compress(shuffled.data, level)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged user may still write in ``folder``'s file system."""
    st = os.statvfs(folder)
    return int(st.f_bavail) * int(st.f_frsize)


def _attr(value: Any) -> Any:
    """Attribute value for NetCDF-4 (str, number, 1-D array)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list | tuple):
        return np.asarray(value, dtype=np.float64)
    if isinstance(value, str | int | float | np.ndarray | np.number):
        return value
    return str(value)


def fill_value(dtype: Any, attrs: Mapping[str, Any]) -> np.ndarray:
    """The ``_FillValue`` of a grid variable: NaN for floats; an integer variable (e.g. class
    codes) names its own in ``attrs["_FillValue"]``."""
    dt = np.dtype(dtype)
    if np.issubdtype(dt, np.integer):
        if "_FillValue" not in attrs:
            raise ValueError("an integer grid variable needs a '_FillValue' attribute")
        return np.array(attrs["_FillValue"], dtype=dt)
    return np.array(np.nan, dtype=dt)


def stored_alike(a: tuple[Any, Mapping[str, Any]], b: tuple[Any, Mapping[str, Any]]) -> bool:
    """Whether two grid variables ``(dtype, attrs)`` are stored alike (the same dtype and fill
    value), so that the chunks of one block of values serve both."""
    dt = np.dtype(a[0])
    if dt != np.dtype(b[0]):
        return False
    if dt == np.dtype(bool):
        return True
    fa, fb = fill_value(dt, a[1]), fill_value(dt, b[1])
    return bool(np.array_equal(fa, fb, equal_nan=bool(np.issubdtype(dt, np.floating))))


@contextlib.contextmanager
def open_grid(path: str | Path, *, fix: str, **kwargs: Any) -> Iterator[Any]:
    """``xarray.open_dataset(path, **kwargs)`` as a context manager; a file that is not a
    readable grid (cut short by a killed or failed write or a partial copy, or another file
    under the grid's name) is a :class:`~geodbk.errors.DataError` naming it and ``fix`` (the
    command that writes it again)."""
    import xarray as xr

    try:
        ds = xr.open_dataset(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{path} is not a readable grid ({type(exc).__name__}: {exc}); it may have been cut "
            f"short (a killed or failed write, a partial copy): write it again with `{fix}`"
        ) from None
    with ds:
        yield ds


def grid_attrs(path: str | Path, *, fix: str) -> dict[str, Any]:
    """The global attributes of the grid at ``path``, as ``open_grid(path).attrs`` gives them
    (bytes decoded to text), read from the file's root group alone: opening the dataset reads
    every variable's header (about 0.06 s for a tile map's 24 data variables, 12 times this).

    A file h5netcdf cannot open (a NetCDF-3 file, say) is read through :func:`open_grid`, so an
    unreadable one is the same :class:`~geodbk.errors.DataError` naming it and ``fix``."""
    try:
        with h5netcdf.File(path, "r") as nc:
            return {
                k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                for k, v in nc.attrs.items()
            }
    except (OSError, ValueError):
        with open_grid(path, fix=fix) as ds:
            return dict(ds.attrs)


def sweep_spools(path: Path) -> list[Path]:
    """Remove what a killed writer of ``path`` left next to it: hidden temporaries
    ``.NAME.*`` (files or folders; callers hold the run's target lock, so none is in use).
    Returns what was removed."""
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
    """Write variables of a (y, x) grid in row blocks into a NetCDF-4 file, then move it into
    place.

    Parameters
    ----------
    path
        Destination ``.nc``.
    x, y
        1-D coordinates (lon ascending, lat descending).
    variables
        ``{name: (dtype, attrs)}``; dtype float32, float64, bool, or an integer type whose
        attrs give its ``_FillValue``.
    attrs
        Global attributes.
    crs_attrs
        Attributes of the ``spatial_ref`` variable (from rioxarray's ``write_crs``).
    chunk_rows
        Rows per chunk; a caller that writes blocks of this many rows has each block written
        as it comes, without gathering. Default: tiles of ``CHUNK_COLS`` columns.
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
        chunk_rows: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.x = np.asarray(x, dtype=np.float64)
        self.y = np.asarray(y, dtype=np.float64)
        self.variables = {n: (np.dtype(d), dict(a)) for n, (d, a) in variables.items()}
        self.attrs = dict(attrs)
        self.crs_attrs = dict(crs_attrs)
        sweep_spools(self.path)
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.part.nc")
        self._written = 0
        if chunk_rows is None:
            self._chunk_cols = max(1, min(len(self.x), CHUNK_COLS))
            self._chunk_rows = max(1, min(len(self.y), CHUNK_CELLS // self._chunk_cols))
        else:
            self._chunk_rows = max(1, min(len(self.y), chunk_rows))
            self._chunk_cols = max(1, min(len(self.x), CHUNK_CELLS // self._chunk_rows))
        # the rows before _next_row that are not yet a whole row of chunks
        self._pending: dict[str, np.ndarray] = {}
        self._next_row = 0
        self._fills: dict[str, Any] = {}  # each variable's fill value, set by _layout
        self._chunk_writers: dict[str, Any] = {}  # each variable's HDF5 dataset id, by _layout
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
        self._ensure_space(0)
        try:
            self._nc: Any = h5netcdf.File(self._tmp, "w")
        except OSError as exc:
            named = disk_error(exc, self.path)
            if named is exc:
                raise
            raise named from exc
        try:
            self._layout(self._nc)
        except BaseException:
            self.abort()
            raise

    def _ensure_space(self, n_bytes: int) -> None:
        """Refuse (``ENOSPC``, naming :attr:`path`) to write ``n_bytes`` more where the disk
        lacks room for them uncompressed, plus what HDF5's chunk cache may still hold and
        :data:`SPACE_MARGIN`. HDF5 cannot report a full disk: its write errors are lost in its
        clean-up, and the process may then crash, so the room is checked before each block."""
        cached = min(self._written, CHUNK_CACHE * len(self.variables))
        need = n_bytes + cached + SPACE_MARGIN
        free = free_bytes(self.path.parent)
        if free < need:
            log.error(
                "%s: the next block needs about %.1f MB and %.1f MB are free",
                self.path,
                need / 1e6,
                free / 1e6,
            )
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    def write_rows(
        self,
        rows: slice,
        values: Mapping[str, np.ndarray],
        *,
        data_mask: np.ndarray | None = None,
    ) -> None:
        """Write rows ``rows`` of every variable, the blocks in order from row 0;
        ``values[name]`` has shape (rows, nx).

        ``data_mask`` (rows, nx) bool: the caller's promise that every variable holds its fill
        value outside it. Chunks without a masked cell are then skipped for every variable
        from the mask alone; without it each variable's values are tested. Give it with
        every block or with none.
        """
        nx = len(self.x)
        n_rows = rows.stop - rows.start
        n_bytes = sum(max(dt.itemsize, 1) * n_rows * nx for dt, _ in self.variables.values())
        self._ensure_space(n_bytes)
        blocks = {}
        for name, (dt, _) in self.variables.items():
            arr = np.asarray(values[name])
            if arr.shape != (n_rows, nx):
                raise ValueError(f"{name}: block shape {arr.shape}, expected {(n_rows, nx)}")
            blocks[name] = arr.astype(np.int8 if dt == np.dtype(bool) else dt, copy=False)
        if data_mask is not None:
            if data_mask.shape != (n_rows, nx):
                raise ValueError(f"data_mask shape {data_mask.shape}, expected {(n_rows, nx)}")
            blocks[_DATA_MASK] = np.asarray(data_mask, dtype=bool)
        self._gather(rows, blocks)
        self._written += n_bytes

    def _gather(self, rows: slice, blocks: Mapping[str, np.ndarray]) -> None:
        """Add the rows to the pending ones and write every whole row of chunks they complete
        (the last row of chunks when the grid's last row arrives)."""
        cr, ny = self._chunk_rows, len(self.y)
        if rows.start != self._next_row:
            raise ValueError(
                f"rows {rows.start}:{rows.stop} out of order: row {self._next_row} next"
            )
        pending = self._pending
        if pending and pending.keys() != blocks.keys():
            raise ValueError("data_mask must be given with every block or with none")
        start = rows.start - (len(next(iter(pending.values()))) if pending else 0)
        merged = (
            {name: np.concatenate([pending[name], arr]) for name, arr in blocks.items()}
            if pending
            else dict(blocks)
        )
        n = rows.stop - start
        done = n if rows.stop == ny else n - n % cr
        for offset in range(0, done, cr):
            views: dict[int, np.ndarray] = {}  # one view per array: shared blocks stay shared
            part = {
                name: views.setdefault(id(arr), arr[offset : offset + cr])
                for name, arr in merged.items()
            }
            self._write_chunks((start + offset) // cr, part)
        # a copy: the caller may reuse its block arrays
        self._pending = (
            {name: arr[done:].copy() for name, arr in merged.items()} if done < n else {}
        )
        self._next_row = rows.stop

    def _write_chunks(self, index: int, blocks: Mapping[str, np.ndarray]) -> None:
        """Row ``index`` of chunks of every variable: encoded in parallel
        (:func:`encode_chunk`), written raw; a chunk of fill values only is left unallocated."""
        cr, cw, nx = self._chunk_rows, self._chunk_cols, len(self.x)
        n_cols = -(-nx // cw)
        data_mask = blocks.get(_DATA_MASK)
        stored = (
            None
            if data_mask is None
            else np.flatnonzero(~self._fill_only(data_mask, False, n_cols))
        )
        chunks: dict[tuple[str, int], np.ndarray] = {}
        # the variables each encoded array is written to: a variable given the very array of
        # an earlier one, stored alike, shares its chunks
        names_of: dict[str, list[str]] = {}
        first: dict[int, str] = {}
        for name, arr in blocks.items():
            if name == _DATA_MASK:
                continue
            earlier = first.setdefault(id(arr), name)
            if earlier != name and stored_alike(self.variables[earlier], self.variables[name]):
                names_of[earlier].append(name)
                continue
            names_of[name] = [name]
            cols = (
                stored
                if stored is not None
                else np.flatnonzero(~self._fill_only(arr, self._fills[name], n_cols))
            )
            for col in cols:
                start = int(col) * cw
                tile = arr[:, start : start + cw]
                if tile.shape != (cr, cw):  # at the grid's edge: pad with the fill
                    padded = np.full((cr, cw), self._fills[name], dtype=arr.dtype)
                    padded[: tile.shape[0], : tile.shape[1]] = tile
                    tile = padded
                chunks[(name, start)] = tile
        # compressing while the next block is computed was slower on 2 cores (torch's threads
        # and the encoder's compete), so the block's chunks are encoded together and written now
        encoded = self._pool.map(encode_chunk, chunks.values())
        for (owner, start), data in zip(chunks, encoded, strict=True):
            for name in names_of[owner]:
                self._chunk_writers[name].write_direct_chunk((index * cr, start), data)

    def _fill_only(self, arr: np.ndarray, fill: Any, n_cols: int) -> np.ndarray:
        """(n_cols,) bool: whether each chunk column of ``arr`` (rows, nx) holds only ``fill``."""
        cw = self._chunk_cols
        nan_fill = np.issubdtype(arr.dtype, np.floating) and bool(np.isnan(fill))
        is_fill: np.ndarray = np.isnan(arr) if nan_fill else np.equal(arr, fill)
        padded = np.ones(n_cols * cw, dtype=bool)
        padded[: arr.shape[1]] = is_fill.all(axis=0)
        return np.asarray(padded.reshape(n_cols, cw).all(axis=1))

    def close(self) -> Path:
        """Move the complete file onto :attr:`path`; every row must have been written."""
        try:
            if self._next_row < len(self.y):
                raise ValueError(f"{len(self.y) - self._next_row} grid rows were never written")
            self._pool.shutdown()
            self._nc.close()
            with open(self._tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(self._tmp, self.path)
        except OSError as exc:
            self.abort()
            named = disk_error(exc, self.path)
            if named is exc:
                raise
            raise named from exc
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file without writing the destination."""
        with contextlib.suppress(Exception):
            self._pool.shutdown(cancel_futures=True)
        with contextlib.suppress(Exception):
            self._nc.close()
        with contextlib.suppress(OSError):
            self._tmp.unlink()

    def _layout(self, nc: Any) -> None:
        ny, nx = len(self.y), len(self.x)
        nc.dimensions = {"y": ny, "x": nx}
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
            v = nc.create_variable(name, (name,), "f8", data=values)
            v.attrs.update(attrs)
        ref = nc.create_variable("spatial_ref", (), "i4", data=np.int32(0))
        ref.attrs.update({k: _attr(val) for k, val in self.crs_attrs.items()})
        chunks = (self._chunk_rows, self._chunk_cols)
        for name, (dt, attrs) in self.variables.items():
            is_bool = dt == np.dtype(bool)
            # bool is stored as int8 with HDF5's default fill, 0
            self._fills[name] = np.int8(0) if is_bool else fill_value(dt, attrs)
            var = nc.create_variable(
                name,
                ("y", "x"),
                np.int8 if is_bool else dt,
                chunks=chunks,
                compression="gzip",
                compression_opts=COMPRESSION_LEVEL,
                shuffle=True,
                fillvalue=None if is_bool else self._fills[name],
            )
            self._chunk_writers[name] = var._h5ds.id
            if is_bool:
                var.attrs["dtype"] = "bool"  # xarray decodes int8 + this to bool
            var.attrs.update({k: _attr(val) for k, val in attrs.items() if k != "_FillValue"})
            var.attrs["grid_mapping"] = "spatial_ref"
            var.attrs["coordinates"] = "spatial_ref"
        nc.attrs.update({k: _attr(val) for k, val in self.attrs.items()})
        nc.attrs.setdefault("Conventions", CONVENTIONS)
