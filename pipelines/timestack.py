"""Grids of several quarters stacked along a CF time dimension in one NetCDF-4 file.

``geodbk export --format netcdf`` writes ``RUN/exports/TARGET_quarters.nc``: every (y, x)
variable of the quarter grids becomes (time, y, x); ``time`` is the middle of each quarter in
days since 1970-01-01 (CF-1.8, ``calendar = "standard"``) with ``time_bnds`` the quarter's first
day and the next quarter's first day, and ``quarter`` the quarter's label. A pooled grid (one
map of all quarters) is one time step whose bounds span its pooled quarters. Written chunk by
chunk (one row block of one quarter at a time, zlib with byte shuffle) at a temporary name and
moved into place, so memory stays bounded and an earlier file is never half replaced.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5netcdf
import h5py
import numpy as np

from geodbk.atomic import atomic_path
from geodbk.errors import DataError
from geodbk.geo.timeaxis import format_quarter, quarter_index
from pipelines.gridfile import COMPRESSION_LEVEL, grid_attrs, open_grid

__all__ = ["TIME_UNITS", "check_same_quantity", "quarter_bounds", "write_time_stack"]

#: CF units of the ``time`` coordinate.
TIME_UNITS = "days since 1970-01-01 00:00:00"
_EPOCH = dt.date(1970, 1, 1)
#: Grid rows copied at a time.
_BLOCK_ROWS = 512


def _quarter_start(index: int) -> dt.date:
    label = format_quarter(index)
    year, q = int(label[:4]), int(label[-1])
    return dt.date(year, 3 * (q - 1) + 1, 1)


def quarter_bounds(label: str) -> tuple[float, float]:
    """``(first day, first day of the next quarter)`` in days since 1970-01-01 of a quarter
    label (``2023Q2``) or of a pooled grid's ``pooled 2019Q1:2023Q4``."""
    text = label.removeprefix("pooled").strip()
    first, _, last = text.partition(":")
    start = _quarter_start(quarter_index(first.strip()))
    end = _quarter_start(quarter_index((last or first).strip()) + 1)
    return float((start - _EPOCH).days), float((end - _EPOCH).days)


def _quantity(attrs: dict[str, Any]) -> tuple[str, str]:
    """``(label, predict options)`` of the quantity a grid maps: ``("tile quantity",
    "--quantity tile")``, or for the test quantity its tests and devices too; ``("", "")`` for
    a grid that names none (written before grids named their quantity)."""
    quantity = str(attrs.get("quantity", ""))
    if not quantity:
        return "", ""
    if quantity != "test":
        return f"{quantity} quantity", f"--quantity {quantity}"
    tests, devices = (float(attrs.get(k, 1.0)) for k in ("tests", "devices"))
    return (
        f"test quantity (tests={tests:g}, devices={devices:g})",
        f"--quantity test --tests {tests:g} --devices {devices:g}",
    )


def check_same_quantity(grids: Sequence[Path], *, predict: str = "geodbk predict") -> None:
    """Raise :class:`DataError` when a grid of ``grids`` maps another quantity (``tile``,
    ``area``, ``test`` and its tests) than the latest one: the stack carries one quantity label,
    so it would show, say, one quarter's test quantity as the tile quantity. The message names
    the grids and the ``predict`` command (``geodbk predict --run RUN --target T``) that maps
    their quarters again."""
    labels = []
    for path in grids:
        attrs = grid_attrs(path, fix=f"run `{predict}` first")
        labels.append((path, str(attrs.get("quarter", "")), *_quantity(attrs)))
    _, _, latest, options = labels[-1]
    odd = [(path, q, label) for path, q, label, _ in labels if label and latest and label != latest]
    if not odd:
        return
    path, _, label = odd[0]
    more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
    quarters = ",".join(q for _, q, _ in odd)
    raise DataError(
        f"{path}{more} maps the {label}, but {grids[-1].name}, the latest quarter's grid, the "
        f"{latest}; one stack under one quantity label would mix them. Run `{predict} "
        f"--quarter {quarters} {options}` first, or stack only the quarters of one quantity "
        "with --quarter"
    )


def write_time_stack(out: Path, grids: Sequence[Path], *, attrs: dict[str, Any]) -> Path:
    """Stack the (y, x) variables of ``grids`` (one per quarter, oldest first, same grid)
    along ``time`` into ``out`` (module docstring); ``attrs`` are added to the global ones of
    the latest grid. Raises :class:`DataError` when the grids differ in shape, variables or
    quantity (:func:`check_same_quantity`)."""
    if not grids:
        raise DataError("no grid to stack")
    check_same_quantity(grids)
    fix = "re-run `geodbk predict --quarter all` so every quarter has a grid of the same cells"
    layouts = []
    for path in grids:
        with open_grid(path, fix=fix) as ds:
            names = [n for n in ds.data_vars if ds[n].dims == ("y", "x")]
            layouts.append(
                (
                    str(ds.attrs.get("quarter", "")),
                    ds.sizes["y"],
                    ds.sizes["x"],
                    names,
                    str(ds.attrs.get("quarter_status", "")),
                )
            )
    quarters = [q for q, *_ in layouts]
    if any(not q for q in quarters):
        raise DataError(f"a grid among {', '.join(map(str, grids))} names no quarter; {fix}")
    shapes = {(lay[1], lay[2]) for lay in layouts}
    if len(shapes) != 1:
        raise DataError(f"the quarter grids have different shapes {sorted(shapes)}; {fix}")
    names = [n for n in layouts[-1][3] if all(n in lay[3] for lay in layouts)]
    bounds = np.array([quarter_bounds(q) for q in quarters])
    with atomic_path(out, suffix=".nc") as tmp:
        with h5netcdf.File(tmp, "w") as nc, open_grid(grids[-1], fix=fix) as last:
            ny, nx = shapes.pop()
            nc.dimensions = {"time": len(grids), "nv": 2, "y": ny, "x": nx}
            _coordinates(nc, last, bounds, quarters, [lay[4] for lay in layouts])
            chunks = (1, max(1, min(ny, 262_144 // max(nx, 1))), nx)
            for name in names:
                src = last[name]
                is_bool = src.dtype == np.dtype(bool)
                kind = np.int8 if is_bool else np.dtype(src.encoding.get("dtype", src.dtype))
                var = nc.create_variable(
                    name,
                    ("time", "y", "x"),
                    kind,
                    chunks=chunks,
                    compression="gzip",
                    compression_opts=COMPRESSION_LEVEL,
                    shuffle=True,
                    fillvalue=None if is_bool else src.encoding.get("_FillValue"),
                )
                if is_bool:
                    var.attrs["dtype"] = "bool"  # xarray decodes int8 + this to bool
                var.attrs.update({k: _plain(v) for k, v in src.attrs.items()})
                var.attrs["grid_mapping"] = "spatial_ref"
                var.attrs["coordinates"] = "spatial_ref quarter quarter_status"
            for t, path in enumerate(grids):
                with open_grid(path, fix=fix) as ds:
                    for start in range(0, ny, _BLOCK_ROWS):
                        rows = slice(start, min(ny, start + _BLOCK_ROWS))
                        for name in names:
                            block = ds[name].isel(y=rows).values
                            nc.variables[name][t, rows, :] = block.astype(nc.variables[name].dtype)
            nc.attrs.update({k: _plain(v) for k, v in last.attrs.items()})
            nc.attrs.update({k: _plain(v) for k, v in attrs.items()})
            nc.attrs["Conventions"] = "CF-1.8"
    return out


def _coordinates(
    nc: Any, grid: Any, bounds: np.ndarray, quarters: list[str], statuses: list[str]
) -> None:
    """``time`` (quarter middles), ``time_bnds``, ``quarter`` labels and ``quarter_status``
    (observed, extrapolation, pooled), ``y``, ``x`` and the grid's ``spatial_ref``."""
    time = nc.create_variable("time", ("time",), "f8", data=bounds.mean(axis=1))
    time.attrs.update(
        {
            "units": TIME_UNITS,
            "calendar": "standard",
            "standard_name": "time",
            "long_name": "middle of the quarter",
            "axis": "T",
            "bounds": "time_bnds",
        }
    )
    nc.create_variable("time_bnds", ("time", "nv"), "f8", data=bounds)
    labels = nc.create_variable(
        "quarter", ("time",), h5py.string_dtype(), data=np.array(quarters, dtype=object)
    )
    labels.attrs["long_name"] = "quarter of the map (or the pooled quarters)"
    status = nc.create_variable(
        "quarter_status", ("time",), h5py.string_dtype(), data=np.array(statuses, dtype=object)
    )
    status.attrs["long_name"] = "observed, extrapolation beyond the training quarters, or pooled"
    for axis in ("y", "x"):
        v = nc.create_variable(axis, (axis,), "f8", data=grid[axis].values)
        v.attrs.update({k: _plain(val) for k, val in grid[axis].attrs.items()})
    if "spatial_ref" in grid.coords or "spatial_ref" in grid.variables:
        ref = nc.create_variable("spatial_ref", (), "i4", data=np.int32(0))
        ref.attrs.update({k: _plain(v) for k, v in grid["spatial_ref"].attrs.items()})


def _plain(value: Any) -> Any:
    """An attribute value h5netcdf writes: numpy scalars as Python scalars."""
    if isinstance(value, np.generic):
        return value.item()
    return value
