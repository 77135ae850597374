"""Cached readers of run-directory files.

Every reader takes the file path as a string plus a ``stamp`` (modification time and size) so a
rebuilt run is re-read, and raises :class:`LoadError` with a readable message for a missing or
corrupt file. Large objects (grids, models, grid features) use ``st.cache_resource`` and are
treated as read-only; small ones use ``st.cache_data``.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import streamlit as st
from numpy.typing import NDArray

from app.quarters import with_time
from app.runs import RAW_COLUMNS, RAW_TO_NATURAL, TARGETS, to_natural
from geodbk.geo.contract import Z95
from geodbk.geo.frame import Scaling
from geodbk.geo.longitude import wrap_near
from geodbk.geo.quadkey import quadkey_bounds
from geodbk.metrics import canonical_keys

Stamp = tuple[int, int]
T = TypeVar("T")


class LoadError(Exception):
    """A run file that is missing or cannot be read; the message says which and why."""


def stamp(path: Path) -> Stamp:
    """``(mtime_ns, size)`` of a file, the cache key that notices a rebuilt run."""
    try:
        st_ = path.stat()
    except OSError as exc:
        raise LoadError(f"{path} is missing ({exc.strerror}).") from exc
    return (st_.st_mtime_ns, st_.st_size)


def _fail(path: str, exc: BaseException) -> LoadError:
    return LoadError(f"Could not read {path}: {type(exc).__name__}: {exc}")


def _read(
    path: str,
    read: Callable[[str], T],
    errors: type[Exception] | tuple[type[Exception], ...] = (OSError, ValueError),
) -> T:
    """``read(path)``, with any of ``errors`` raised as a :class:`LoadError` naming the file."""
    try:
        return read(path)
    except errors as exc:
        raise _fail(path, exc) from exc


def _json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@st.cache_data(show_spinner=False, max_entries=64)
def load_json(path: str, _stamp: Stamp) -> Any:
    """Read a JSON file."""
    return _read(path, _json)


@st.cache_data(show_spinner=False, max_entries=16)
def load_metrics(path: str, stamp_: Stamp) -> Any:
    """Read a report JSON (``metrics.json``, ``summary.json``) with every metric under its
    :mod:`geodbk.metrics` name (:func:`geodbk.metrics.canonical_keys`)."""
    return _read(path, lambda p: canonical_keys(_json(p)))


@st.cache_data(show_spinner=False, max_entries=16)
def load_geojson(path: str, stamp_: Stamp) -> dict[str, Any]:
    """Read a GeoJSON file as a FeatureCollection dict (a bare geometry or feature is wrapped)."""
    data = _read(path, _json)
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "FeatureCollection" and isinstance(data.get("features"), list):
        return data
    if kind == "Feature":
        return {"type": "FeatureCollection", "features": [data]}
    if (isinstance(kind, str) and "coordinates" in data) or kind == "GeometryCollection":
        return {
            "type": "FeatureCollection",
            "features": [{"type": "Feature", "properties": {}, "geometry": data}],
        }
    raise LoadError(f"{path} is not GeoJSON (expected a FeatureCollection).")


@st.cache_data(show_spinner=False, max_entries=16)
def load_text(path: str, stamp_: Stamp) -> str:
    """Read a small text file (YAML config, Markdown report)."""
    return _read(path, lambda p: Path(p).read_text(encoding="utf-8"), (OSError, UnicodeDecodeError))


@st.cache_data(show_spinner=False, max_entries=16)
def load_csv(path: str, stamp_: Stamp) -> pd.DataFrame:
    """Read a CSV file (training history)."""
    return _read(path, pd.read_csv)


@st.cache_data(show_spinner=False, max_entries=16)
def load_parquet(path: str, stamp_: Stamp) -> pd.DataFrame:
    """Read a plain Parquet table (``predictions.parquet``)."""
    return _read(path, pd.read_parquet, Exception)  # pyarrow raises many types for corrupt files


# --------------------------------------------------------------------------------------------
# Tile table


TILE_COLUMNS = ("quadkey", "quarter", "lon", "lat", "x1", "x2", "tests", "urban")


def _tile_bounds(frame: pd.DataFrame, geometry: pd.Series | None) -> pd.DataFrame:
    """West/south/east/north of each tile from its geometry, else from its quadkey."""
    if geometry is not None:
        try:
            import shapely

            geoms = shapely.from_wkb(geometry.to_numpy())
            b = shapely.bounds(geoms)
            if np.isfinite(b).all():
                return pd.DataFrame(
                    b, columns=["west", "south", "east", "north"], index=frame.index
                )
        except Exception:  # fall back to the quadkey below
            pass

    west, south, east, north = quadkey_bounds(frame["quadkey"].astype(str).to_numpy())
    return pd.DataFrame(
        {"west": west, "south": south, "east": east, "north": north}, index=frame.index
    )


#: xarray engine by a file's first bytes: NetCDF-4 (HDF5, what ``pipelines.gridfile`` writes)
#: or classic NetCDF (older runs). Naming it skips xarray's engine guessing, which imports every
#: installed backend plugin (rioxarray's among them): about 1 s on the first page load of a
#: fresh server.
GRID_ENGINES: dict[bytes, str] = {b"\x89HDF": "h5netcdf", b"CDF": "scipy"}


def grid_engine(path: str | Path) -> str | None:
    """The xarray engine that reads a grid file (``None``: let xarray guess)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None
    return next((e for magic, e in GRID_ENGINES.items() if head.startswith(magic)), None)


@dataclass(frozen=True)
class TileTable:
    """The observed tiles (plain pandas, geometry reduced to bounds) and the table metadata."""

    frame: pd.DataFrame
    metadata: dict[str, Any]

    @property
    def quarters(self) -> list[str]:
        """Quarters present, sorted."""
        return sorted(self.frame["quarter"].astype(str).unique().tolist())

    def scaling(self) -> dict[str, float] | None:
        """The lon/lat -> [-1, 1] scaling from the metadata, if recorded."""
        sc = self.metadata.get("scaling") if isinstance(self.metadata, dict) else None
        keys = ("lon_min", "lon_max", "lat_min", "lat_max")
        if isinstance(sc, dict) and all(k in sc for k in keys):
            return {k: float(sc[k]) for k in keys}
        return None


def _in_frame_of(frame: pd.DataFrame, scaling: Any) -> pd.DataFrame:
    """Tiles' ``lon``, ``west`` and ``east`` moved by whole turns into the run's frame (the
    half-turn either side of the middle of its scaled box, :mod:`geodbk.geo.frame`), so that
    a run across the 180° meridian draws its tiles beside its maps."""
    try:
        centre = 0.5 * (float(scaling["lon_min"]) + float(scaling["lon_max"]))
    except (KeyError, TypeError, ValueError):
        return frame
    lon = frame["lon"].to_numpy(dtype=float)
    shift = wrap_near(lon, centre=centre) - lon
    if not shift.any():
        return frame
    return frame.assign(
        lon=frame["lon"] + shift, west=frame["west"] + shift, east=frame["east"] + shift
    )


@st.cache_data(show_spinner=False, max_entries=4)
def load_tiles(path: str, stamp_: Stamp) -> TileTable:
    """Read ``tiles.parquet`` without geopandas: columns, tile bounds and ``geodbk`` metadata.

    Adds ``value_<target>`` columns in natural units (Mbps / ms) for the targets present.
    """
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        meta_raw = (table.schema.metadata or {}).get(b"geodbk")
        metadata = json.loads(meta_raw) if meta_raw else {}
        frame = table.to_pandas()
    except Exception as exc:
        raise _fail(path, exc) from exc
    missing = [c for c in TILE_COLUMNS if c not in frame.columns]
    if missing:
        raise LoadError(f"{path} lacks the columns {', '.join(missing)}.")
    geometry = frame.pop("geometry") if "geometry" in frame.columns else None
    frame["quarter"] = frame["quarter"].astype(str)
    frame["quadkey"] = frame["quadkey"].astype(str)
    frame["urban"] = frame["urban"].astype(bool)
    frame = pd.concat([frame, _tile_bounds(frame, geometry)], axis=1)
    frame = _in_frame_of(frame, metadata.get("scaling") if isinstance(metadata, dict) else None)
    for target in TARGETS:
        col = RAW_COLUMNS[target]
        if col in frame.columns:
            frame[f"value_{target}"] = frame[col].astype(float) / RAW_TO_NATURAL[target]
    return TileTable(frame=frame, metadata=metadata if isinstance(metadata, dict) else {})


# --------------------------------------------------------------------------------------------
# Predictive grid

GRID_VARIABLES = ("mean", "std")


@dataclass(frozen=True)
class Grid:
    """A loaded predictive grid with north-up arrays and lon/lat cell centres."""

    target: str
    lon: NDArray[np.float64]  # (nx,) ascending
    lat: NDArray[np.float64]  # (ny,) descending (row 0 = north)
    arrays: Mapping[str, NDArray[np.float64]]
    attrs: dict[str, Any]
    #: The variable whose finite cells are the region (``mean``; trend grids: the change).
    primary: str = "mean"

    @property
    def shape(self) -> tuple[int, int]:
        """``(ny, nx)``."""
        return (self.lat.size, self.lon.size)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """Outer edges (west, south, east, north) of the grid cells."""
        dx = float(abs(self.lon[1] - self.lon[0])) if self.lon.size > 1 else 0.01
        dy = float(abs(self.lat[0] - self.lat[1])) if self.lat.size > 1 else 0.01
        return (
            float(self.lon[0] - dx / 2),
            float(self.lat[-1] - dy / 2),
            float(self.lon[-1] + dx / 2),
            float(self.lat[0] + dy / 2),
        )

    @property
    def in_region(self) -> NDArray[np.bool_]:
        """Cells inside the region (``in_region`` variable, else where the primary variable is
        finite)."""
        values = self.arrays[self.primary]
        if "in_region" in self.arrays:
            return self.arrays["in_region"].astype(bool) & np.isfinite(values)
        return np.isfinite(values)

    def natural(self, name: str) -> NDArray[np.float64]:
        """A variable in natural units: ``<name>_natural`` if stored, else derived from log10."""
        if f"{name}_natural" in self.arrays:
            return self.arrays[f"{name}_natural"]
        if name == "pi_width":
            out: NDArray[np.float64] = self.natural("pi_upper") - self.natural("pi_lower")
            return out
        if name in ("pi_lower", "pi_upper") and name not in self.arrays:
            sign = -1.0 if name == "pi_lower" else 1.0
            return to_natural(self.arrays["mean"] + sign * Z95 * self.arrays["std"], self.target)
        return to_natural(self.arrays[name], self.target)

    def cell_of(self, lon: float, lat: float) -> tuple[int, int] | None:
        """``(row, col)`` of the cell containing a point, or None outside the grid (a longitude
        a whole turn away, as a map across the 180° meridian may give, is taken back)."""
        w, s, e, n = self.bounds
        lon = float(wrap_near(lon, centre=0.5 * (w + e)))
        if not (w <= lon <= e and s <= lat <= n):
            return None
        col = int(np.argmin(np.abs(self.lon - lon)))
        row = int(np.argmin(np.abs(self.lat - lat)))
        return row, col


class LazyVariables(Mapping[str, NDArray[np.float64]]):
    """The 2-D variables of a grid file, each read (north-up, float64) on first access.

    A page draws one or two layers of a grid that holds ~25 variables; reading them all up
    front cost about 0.6 s on the first load of the demo, so a variable is read when a layer
    asks for it and kept (the :class:`Grid` itself is cached across sessions).
    """

    def __init__(
        self, path: str, names: dict[str, bool], *, yname: str, xname: str, flip: tuple[bool, bool]
    ) -> None:
        self._path = path
        self._transpose = names  # name -> stored as (x, y) rather than (y, x)
        self._dims = (yname, xname)
        self._flip = flip
        self._values: dict[str, NDArray[np.float64]] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> NDArray[np.float64]:
        if name not in self._transpose:
            raise KeyError(name)
        with self._lock:
            if name not in self._values:
                self._values[name] = self._read(name)
            return self._values[name]

    def _read(self, name: str) -> NDArray[np.float64]:
        import xarray as xr

        try:
            with xr.open_dataset(self._path, engine=grid_engine(self._path)) as ds:
                var = ds[name]
                if self._transpose[name]:
                    var = var.transpose(*self._dims)
                values = np.asarray(var.values, dtype=np.float64)
        except Exception as exc:
            raise _fail(self._path, exc) from exc
        if self._flip[0]:
            values = values[::-1, :]
        if self._flip[1]:
            values = values[:, ::-1]
        return np.ascontiguousarray(values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._transpose)

    def __len__(self) -> int:
        return len(self._transpose)


def _read_grid(path: str, target: str, required: tuple[str, ...], primary: str) -> Grid:
    """Open a grid file as a north-up :class:`Grid` (variables read lazily, see
    :class:`LazyVariables`); raises :class:`LoadError` if unusable."""
    try:
        import xarray as xr

        with xr.open_dataset(path, engine=grid_engine(path)) as ds:
            data_vars = {str(k): tuple(str(d) for d in v.dims) for k, v in ds.data_vars.items()}
            coords = {
                str(k): np.asarray(v.values, dtype=np.float64)
                for k, v in ds.coords.items()
                if k in ("x", "y", "lon", "lat")
            }
            attrs = {str(k): _plain(v) for k, v in ds.attrs.items()}
    except Exception as exc:
        raise _fail(path, exc) from exc
    missing = [v for v in required if v not in data_vars]
    if missing:
        raise LoadError(f"{path} lacks the variables {', '.join(missing)}.")
    xname = "x" if "x" in coords else ("lon" if "lon" in coords else None)
    yname = "y" if "y" in coords else ("lat" if "lat" in coords else None)
    if xname is None or yname is None:
        raise LoadError(f"{path} has no x/y (lon/lat) coordinates.")
    lon, lat = coords[xname], coords[yname]
    flip_y = lat.size > 1 and float(lat[0]) < float(lat[-1])
    flip_x = lon.size > 1 and float(lon[0]) > float(lon[-1])
    names = {
        name: dims != (yname, xname)
        for name, dims in data_vars.items()
        if set(dims) == {yname, xname} and len(dims) == 2
    }
    return Grid(
        target=target,
        lon=lon[::-1].copy() if flip_x else lon,
        lat=lat[::-1].copy() if flip_y else lat,
        arrays=LazyVariables(path, names, yname=yname, xname=xname, flip=(flip_y, flip_x)),
        attrs=attrs,
        primary=primary,
    )


def _plain(value: Any) -> Any:
    """NetCDF attribute values as plain Python (numpy scalars and bytes unwrapped)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


@st.cache_resource(show_spinner=False, max_entries=8)
def load_grid(path: str, stamp_: Stamp, target: str) -> Grid:
    """Read ``grids/TARGET.nc`` (or ``grids/TARGET_QUARTER.nc``) into memory, north-up."""
    return _read_grid(path, target, GRID_VARIABLES, "mean")


#: Variables a trend grid must hold (``geodbk predict --trend Q1:Q2``).
TREND_VARIABLES = ("change_per_year", "p_improved", "ratio_per_year")


@st.cache_resource(show_spinner=False, max_entries=4)
def load_trend(path: str, stamp_: Stamp, target: str) -> Grid:
    """Read a trend grid ``grids/TARGET_trend_Q1_Q2.nc`` (change per year of the latent mean)."""
    return _read_grid(path, target, TREND_VARIABLES, "change_per_year")


@st.cache_data(show_spinner=False, max_entries=64)
def load_grid_attrs(path: str, stamp_: Stamp) -> dict[str, Any]:
    """Only the global attributes of a grid file (no data read): quarter, status, ..."""
    try:
        import xarray as xr

        with xr.open_dataset(path, engine=grid_engine(path)) as ds:
            return {str(k): _plain(v) for k, v in ds.attrs.items()}
    except Exception as exc:
        raise _fail(path, exc) from exc


@st.cache_data(show_spinner=False, max_entries=8)
def load_tile_metadata(path: str, stamp_: Stamp) -> dict[str, Any]:
    """The ``geodbk`` metadata of ``tiles.parquet`` from the file footer (no rows read)."""
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
        doc = json.loads(meta.get(b"geodbk", b"{}"))
    except Exception as exc:
        raise _fail(path, exc) from exc
    return doc if isinstance(doc, dict) else {}


# --------------------------------------------------------------------------------------------
# Model and features


@st.cache_resource(show_spinner=False, max_entries=4)
def load_model(model_dir: str, stamp_: Stamp) -> Any:
    """Load a model bundle with ``DBKRegressor.load`` (safetensors + JSON, no pickle)."""
    try:
        # local: the dashboard shows maps without torch; only the kernel tab loads a model
        from geodbk.estimator import DBKRegressor
    except ImportError as exc:
        raise LoadError(f"The geodbk model code is not available ({exc}).") from exc
    try:
        return DBKRegressor.load(model_dir)
    except Exception as exc:
        raise LoadError(f"Could not load the model in {model_dir}: {exc}") from exc


def scale_lonlat(
    lon: NDArray[np.floating], lat: NDArray[np.floating], scaling: dict[str, float]
) -> NDArray[np.float64]:
    """Scale lon/lat to the model's ``[-1, 1]^2`` inputs (the tile table's scaling, by
    :meth:`geodbk.geo.frame.Scaling.scale`)."""
    x1, x2 = Scaling.from_dict(scaling).scale(lon, lat)
    return np.column_stack([x1, x2])


@dataclass(frozen=True)
class GridFeatures:
    """``phi`` of the in-region grid cells (possibly subsampled), float32."""

    phi: NDArray[np.float32]  # (n, r)
    rows: NDArray[np.intp]
    cols: NDArray[np.intp]
    shape: tuple[int, int]  # (ny, nx) of the (subsampled) slice image
    lon: NDArray[np.float64]
    lat: NDArray[np.float64]
    seconds: float


#: Budget of float32 values for the cached phi(grid): 64 M values = 256 MB.
FEATURE_BUDGET = 64_000_000


@st.cache_resource(show_spinner=False, max_entries=6)
def grid_features(
    model_dir: str,
    model_stamp: Stamp,
    grid_path: str,
    grid_stamp: Stamp,
    target: str,
    scaling: tuple[tuple[str, float], ...],
    t: float | None = None,
) -> GridFeatures:
    """Compute and cache ``phi(grid)`` once per model, grid and time input.

    The inputs are ``[x1, x2]`` (a pooled model, ``t`` is None) or ``[x1, x2, t]`` with one
    ``t`` for every cell (a time-aware model at one quarter, see :mod:`app.quarters`).
    The grid is subsampled by a stride when needed so the float32 features fit
    :data:`FEATURE_BUDGET` values (about 250k cells at rank 256, 62k at rank 1024).
    """
    import time

    model = load_model(model_dir, model_stamp)
    grid = load_grid(grid_path, grid_stamp, target)
    n_in = int(grid.in_region.sum())
    probe = with_time(scale_lonlat(grid.lon[:1], grid.lat[:1], dict(scaling)), t)
    try:
        rank = int(np.asarray(model.features(probe)).shape[1])
    except Exception as exc:
        raise LoadError(f"The model could not compute features: {exc}") from exc
    max_cells = max(10_000, FEATURE_BUDGET // max(rank, 1))
    stride = max(1, math.ceil(math.sqrt(n_in / max_cells)))
    lat = grid.lat[::stride]
    lon = grid.lon[::stride]
    mask = grid.in_region[::stride, ::stride]
    rows, cols = np.nonzero(mask)
    X = with_time(scale_lonlat(lon[cols], lat[rows], dict(scaling)), t)
    t0 = time.perf_counter()
    try:
        phi = np.asarray(model.features(X), dtype=np.float32)
    except Exception as exc:
        raise LoadError(f"The model could not compute features on the grid: {exc}") from exc
    return GridFeatures(
        phi=phi,
        rows=rows.astype(np.intp),
        cols=cols.astype(np.intp),
        shape=(lat.size, lon.size),
        lon=lon,
        lat=lat,
        seconds=time.perf_counter() - t0,
    )
