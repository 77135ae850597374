"""The prepared tile table (``RUN/tiles.parquet``): schema, splits, metadata, write and read.

See ``docs/architecture.md`` for the contract. One row per tile-quarter; GeoParquet with the
tile polygon as geometry (EPSG:4326) and a ``geodbk`` key-value metadata entry holding JSON
(schema version, scaling, split, sources, type, quarters, region, counts).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.atomic import atomic_path
from geodbk.errors import DataError, RunDirectoryError
from geodbk.geo.blocks import block_keys
from geodbk.geo.contract import TARGET_INFO
from geodbk.geo.frame import Scaling
from geodbk.geo.timeaxis import format_quarter, quarter_indices

SCHEMA_VERSION = 1
METADATA_KEY = b"geodbk"
#: Model targets and their columns (natural units: kbps for speeds, ms for latency).
LOG_COLUMNS: dict[str, str] = {t: i.log_column for t, i in TARGET_INFO.items()}
COLUMNS: tuple[str, ...] = (
    "quadkey",
    "quarter",
    "lon",
    "lat",
    "x1",
    "x2",
    "avg_d_kbps",
    "avg_u_kbps",
    "avg_lat_ms",
    "tests",
    "devices",
    "log10_download",
    "log10_upload",
    "log10_latency",
    "urban",
    "split",
)
OPTIONAL_COLUMNS: tuple[str, ...] = ("avg_lat_down_ms", "avg_lat_up_ms", "tile_x", "tile_y")
SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.8, 0.1, 0.1)


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    f = tuple(float(v) for v in fractions)
    if len(f) != 3 or min(f) < 0 or abs(sum(f) - 1.0) > 1e-9:
        raise DataError(f"split fractions must be 3 non-negative numbers summing to 1, got {f}")
    return (f[0], f[1], f[2])


def random_split(
    n: int, *, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS
) -> npt.NDArray[np.object_]:
    """Seeded random train/val/test labels for ``n`` rows with exact counts.

    ``round(n * val)`` rows go to val, ``round(n * test)`` to test, the rest to train; which rows
    is a permutation drawn from ``numpy.random.default_rng(seed)``.
    """
    f = _check_fractions(fractions)
    n_val = round(n * f[1])
    n_test = round(n * f[2])
    perm = np.random.default_rng(seed).permutation(n)
    labels = np.full(n, "train", dtype=object)
    labels[perm[:n_val]] = "val"
    labels[perm[n_val : n_val + n_test]] = "test"
    return labels


def block_split(
    lon: npt.ArrayLike,
    lat: npt.ArrayLike,
    *,
    seed: int = 0,
    block_size: float = 0.1,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> tuple[npt.NDArray[np.object_], dict[str, Any]]:
    """Spatial-block split: whole square blocks of ``block_size`` degrees are held out.

    Blocks (cells of a lon/lat grid anchored at 0°, 0°) holding data are shuffled with
    ``default_rng(seed)``; blocks go to test until it holds at least its fraction of rows, then
    to val likewise; the rest is train. Every tile of a block, in every quarter, shares the label,
    so val/test measure extrapolation to unseen areas.

    Returns
    -------
    labels, info
        Labels per row and a description (block size, block counts per split).
    """
    f = _check_fractions(fractions)
    if not block_size > 0:
        raise DataError(f"block size must be positive, got {block_size}")
    lon_a = np.asarray(lon, dtype=float)
    lat_a = np.asarray(lat, dtype=float)
    n = lon_a.shape[0]
    keys = block_keys(lon_a, lat_a, block_size=block_size)
    uniq, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
    order = np.random.default_rng(seed).permutation(uniq.shape[0])
    block_label = np.full(uniq.shape[0], "train", dtype=object)
    targets = (("test", f[2] * n), ("val", f[1] * n))
    pos = 0
    for name, want in targets:
        got = 0
        while got < want and pos < order.shape[0] - 1:
            block_label[order[pos]] = name
            got += counts[order[pos]]
            pos += 1
    labels = block_label[inv]
    info = {
        "block_size_deg": block_size,
        "blocks": {s: int((block_label == s).sum()) for s in SPLITS},
    }
    return labels, info


def tile_split(
    quadkeys: npt.ArrayLike, *, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS
) -> tuple[npt.NDArray[np.object_], dict[str, Any]]:
    """Leave-tile-out split: every quarter of a held-out tile is held out with it.

    The distinct tiles are shuffled with ``default_rng(seed)``; ``round(T * test)`` tiles go to
    test, ``round(T * val)`` to val and the rest to train, and every row of a tile takes its
    tile's label. Val and test then measure interpolation at the finest scale: a tile never
    measured, between measured neighbours (between ``random``, held-out quarters of known
    tiles, and ``block``, held-out areas).

    Returns
    -------
    labels, info
        Labels per row and ``{"tiles": {split: number of tiles}}``.
    """
    f = _check_fractions(fractions)
    keys = np.asarray(quadkeys).astype(str)
    uniq, inv = np.unique(keys, return_inverse=True)
    n_tiles = uniq.size
    n_val, n_test = round(n_tiles * f[1]), round(n_tiles * f[2])
    perm = np.random.default_rng(seed).permutation(n_tiles)
    tile_label = np.full(n_tiles, "train", dtype=object)
    tile_label[perm[:n_test]] = "test"
    tile_label[perm[n_test : n_test + n_val]] = "val"
    info = {"tiles": {s: int((tile_label == s).sum()) for s in SPLITS}}
    return tile_label[inv], info


def forecast_split(quarters: npt.ArrayLike) -> tuple[npt.NDArray[np.object_], dict[str, Any]]:
    """Forecast split: the last quarter is the test set, the one before it validation.

    Every tile of the latest quarter goes to ``test`` and every tile of the quarter before to
    ``val``; all earlier quarters are ``train``. This measures what a "current map" user needs:
    predicting a quarter the model has never seen, from the past only.

    Returns
    -------
    labels, info
        Labels per row and ``{"test_quarter", "val_quarter", "train_quarters"}``.

    Raises
    ------
    DataError
        With fewer than 3 distinct quarters (train, val and test each need one).
    """

    idx = quarter_indices(np.asarray(quarters, dtype=object))
    uniq = np.unique(idx)
    if uniq.size < 3:
        raise DataError(
            f"the forecast split needs at least 3 quarters (train, val, test), got "
            f"{[format_quarter(int(i)) for i in uniq]}; widen --quarters or use --split random"
        )
    labels = np.full(idx.shape[0], "train", dtype=object)
    labels[idx == uniq[-2]] = "val"
    labels[idx == uniq[-1]] = "test"
    info = {
        "test_quarter": format_quarter(int(uniq[-1])),
        "val_quarter": format_quarter(int(uniq[-2])),
        "train_quarters": [format_quarter(int(i)) for i in uniq[:-2]],
    }
    return labels, info


def prepare_tile_table(
    tiles: gpd.GeoDataFrame,
    *,
    scaling: Scaling,
    urban: npt.ArrayLike,
    split: str = "random",
    seed: int = 0,
    block_size: float = 0.1,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> tuple[gpd.GeoDataFrame, dict[str, Any]]:
    """Turn normalised tiles into the training table.

    Parameters
    ----------
    tiles
        Output frame of :func:`geodbk.geo.ookla.read_tiles` (filtered).
    scaling
        Lon/lat -> [-1, 1]² map.
    urban
        Urban label per row.
    split
        ``random`` (seeded 8:1:1 over rows), ``tile`` (every quarter of 10% of the tiles held
        out, :func:`tile_split`), ``block`` (held-out spatial blocks) or ``forecast`` (last
        quarter = test, the one before = val; see :func:`forecast_split`).
    seed
        Split seed.
    block_size
        Block side in degrees for ``split="block"``.
    fractions
        Train/val/test fractions.

    Returns
    -------
    table, split_info
        The table (columns per the contract, rows sorted by quarter then quadkey) and the
        ``split`` metadata entry.
    """
    f = _check_fractions(fractions)
    df = tiles.copy()
    df["urban"] = np.asarray(urban, dtype=bool)
    df = df.sort_values(["quarter", "quadkey"], kind="stable").reset_index(drop=True)
    x1, x2 = scaling.scale(df["lon"].to_numpy(), df["lat"].to_numpy())
    df["x1"] = x1
    df["x2"] = x2
    for target, col in ((t, i.column) for t, i in TARGET_INFO.items()):
        df[col] = df[col].astype("float64")
        df[LOG_COLUMNS[target]] = np.log10(df[col].to_numpy())
    df["tests"] = df["tests"].astype("int64")
    df["devices"] = df["devices"].astype("int64")
    df["quadkey"] = df["quadkey"].astype(str)
    df["quarter"] = df["quarter"].astype(str)
    info: dict[str, Any] = {"kind": split, "seed": int(seed), "fractions": list(f), "unit": "row"}
    if split == "random":
        labels = random_split(len(df), seed=seed, fractions=f)
    elif split == "block":
        labels, extra = block_split(
            df["lon"].to_numpy(),
            df["lat"].to_numpy(),
            seed=seed,
            block_size=block_size,
            fractions=f,
        )
        info.update(extra)
        info["unit"] = "block"
    elif split == "tile":
        labels, extra = tile_split(df["quadkey"].to_numpy(), seed=seed, fractions=f)
        info.update(extra)
        info["unit"] = "tile"
    elif split == "forecast":
        labels, extra = forecast_split(df["quarter"].to_numpy())
        info.update(extra)
        info["unit"] = "quarter"
        info.pop("fractions")
    else:
        raise DataError(f"unknown split {split!r}: use random, tile, block or forecast")
    df["split"] = pd.array(labels, dtype=str) if len(labels) else pd.array([], dtype=str)
    info["counts"] = {s: int((labels == s).sum()) for s in SPLITS}
    columns = list(COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in df.columns] + ["geometry"]
    table = gpd.GeoDataFrame(df[columns], geometry="geometry", crs="EPSG:4326")
    return table, info


def _to_arrow(table: gpd.GeoDataFrame) -> pa.Table:
    try:
        from geopandas.io.arrow import _geopandas_to_arrow

        return _geopandas_to_arrow(table, index=False)
    except (ImportError, TypeError):  # pragma: no cover - future geopandas
        buf = pa.BufferOutputStream()
        table.to_parquet(buf, index=False)
        return pq.read_table(pa.BufferReader(buf.getvalue()))


#: Rows per parquet row group of the tile table: the unit of per-rank sharding
#: (``--distributed``) and of the streaming shuffle window (``--streaming``).
ROW_GROUP_SIZE = 65_536


def write_tile_table(table: gpd.GeoDataFrame, path: str | Path, metadata: dict[str, Any]) -> None:
    """Write the table as GeoParquet with the ``geodbk`` JSON metadata, atomically."""
    meta = dict(metadata)
    meta.setdefault("schema_version", SCHEMA_VERSION)
    arrow = _to_arrow(table)
    kv = dict(arrow.schema.metadata or {})
    kv[METADATA_KEY] = json.dumps(meta, sort_keys=True, allow_nan=False).encode("utf-8")
    arrow = arrow.replace_schema_metadata(kv)
    with atomic_path(path) as tmp:
        pq.write_table(arrow, tmp, compression="zstd", row_group_size=ROW_GROUP_SIZE)


def read_table_metadata(path: str | Path) -> dict[str, Any]:
    """Read only the ``geodbk`` metadata of a tile table (cheap: the parquet footer)."""
    p = Path(path)
    if not p.is_file():
        raise RunDirectoryError(
            f"{p}: no tile table here; run `geodbk ingest --run {p.parent}` first"
        )
    try:
        kv = pq.read_schema(p).metadata or {}
    except Exception as exc:
        raise DataError(
            f"{p}: not a readable parquet file ({type(exc).__name__}: {exc}); rerun `geodbk ingest`"
        ) from exc
    if METADATA_KEY not in kv:
        raise DataError(
            f"{p}: not a geodbk tile table (no 'geodbk' metadata); write it with `geodbk ingest`"
        )
    try:
        meta: dict[str, Any] = json.loads(kv[METADATA_KEY])
    except ValueError as exc:
        raise DataError(f"{p}: corrupt geodbk metadata ({exc}); rerun `geodbk ingest`") from exc
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DataError(
            f"{p}: tile table schema version {version!r}, this geodbk reads {SCHEMA_VERSION}; "
            "rerun `geodbk ingest` with this version"
        )
    return meta


def validate_tile_table(
    table: pd.DataFrame, *, path: str | Path = "tiles.parquet", geometry: bool = True
) -> None:
    """Check columns, dtypes and values of a tile table (with its ``geometry`` column unless
    ``geometry=False``); raise :class:`DataError` on problems."""
    missing = [c for c in (*COLUMNS, *(["geometry"] if geometry else [])) if c not in table.columns]
    if missing:
        raise DataError(
            f"{path}: tile table lacks column(s) {', '.join(missing)}; rerun `geodbk ingest`"
        )
    problems = []
    if len(table) == 0:
        problems.append("it has no rows")
    if table["urban"].dtype != bool:
        problems.append(f"'urban' is {table['urban'].dtype}, not bool")
    bad_split = ~table["split"].isin(SPLITS)
    if bad_split.any():
        problems.append(f"{int(bad_split.sum())} rows have a split other than train/val/test")
    for col in ("lon", "lat", "x1", "x2", *LOG_COLUMNS.values()):
        if not np.isfinite(table[col].to_numpy(dtype=float)).all():
            problems.append(f"'{col}' has missing or infinite values")
    for col in ("tests", "devices"):
        if not pd.api.types.is_integer_dtype(table[col]):
            problems.append(f"'{col}' is {table[col].dtype}, not an integer")
    if problems:
        raise DataError(f"{path}: invalid tile table: {'; '.join(problems)}; rerun `geodbk ingest`")


def read_tile_table(
    path: str | Path, *, geometry: bool = True
) -> tuple[gpd.GeoDataFrame | pd.DataFrame, dict[str, Any]]:
    """Read ``RUN/tiles.parquet`` (or a path to it) and its metadata, validated.

    ``geometry=False`` leaves the tile polygons out and returns a plain DataFrame: what
    training needs, at a fraction of the memory (a shapely polygon per row costs about as much
    as the row's other columns together).

    Parameters
    ----------
    path
        The table file, or a run directory containing ``tiles.parquet``.

    Returns
    -------
    table, metadata
        GeoDataFrame (EPSG:4326) and the ``geodbk`` metadata dict.

    Raises
    ------
    RunDirectoryError
        If the file does not exist.
    DataError
        If it is not a valid geodbk tile table.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "tiles.parquet"
    meta = read_table_metadata(p)
    try:
        if geometry:
            table = gpd.read_parquet(p)
        else:
            names = pq.read_schema(p).names
            table = pq.read_table(p, columns=[c for c in names if c != "geometry"]).to_pandas()
    except Exception as exc:
        raise DataError(f"{p}: cannot read the tile table ({type(exc).__name__}: {exc})") from exc
    for col in ("quadkey", "quarter", "split"):
        if col in table.columns:
            table[col] = table[col].astype(str)
    validate_tile_table(table, path=p, geometry=geometry)
    return table, meta
