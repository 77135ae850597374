"""Readers for Ookla open-data speed-test tiles, in every form users have them.

Supported inputs (files or folders, many at once):

- the official parquet distribution (``quadkey``, ``tile`` WKT, speeds, ``tests``, ``devices``),
  in its hive layout ``type=mobile/year=2023/quarter=4/2023-10-01_performance_mobile_tiles.parquet``
  or as single files;
- shapefile zips (``*.zip``; 10-character field names are mapped back);
- GeoJSON (features with ``"geometry": null`` are kept: the tile is rebuilt from the quadkey);
- CSV (also compressed: ``.csv.gz``, ``.csv.bz2``, ``.csv.xz``, ``.csv.zip``) or an Excel
  workbook's first sheet, with a ``quadkey`` column.

All of them become one normalised table (:func:`read_tiles`): the tile geometry and centroid are
always derived from the quadkey (the authoritative key; the stored geometry is redundant and
sometimes missing), the quarter comes from a ``quarter`` column, the hive path or the file name.
Rows that cannot be used are counted by reason, never dropped silently.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pandas as pd

from geodbk.errors import DataError
from geodbk.geo import quadkey as qk
from geodbk.geo.frame import tile_polygons
from geodbk.geo.quadkey import TILE_ZOOM
from geodbk.geo.tile_columns import (
    QUARTER_FORMS,
    TYPE_COLUMNS,
    numbers,
    padded_number_quadkeys,
    padded_quadkeys,
    quarters_of,
    refuse_unreadable,
    row_types,
)
from geodbk.geo.timeaxis import parse_quarters

log = logging.getLogger(__name__)

#: Columns every Ookla tile source must have.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "quadkey",
    "avg_d_kbps",
    "avg_u_kbps",
    "avg_lat_ms",
    "tests",
    "devices",
)
#: Newer columns kept when a source has them.
OPTIONAL_COLUMNS: tuple[str, ...] = ("avg_lat_down_ms", "avg_lat_up_ms", "tile_x", "tile_y")
TYPES: tuple[str, ...] = ("mobile", "fixed")
#: How each tile file name ending is read (a compressed CSV as pandas decompresses it).
_KINDS: dict[str, str] = {
    ".parquet": "parquet",
    ".geojson": "geojson",
    ".json": "geojson",
    ".zip": "shapefile",
    ".gpkg": "gpkg",
    **dict.fromkeys((".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zip"), "csv"),
    **dict.fromkeys((".xlsx", ".xls"), "excel"),
}
TILE_EXTENSIONS: tuple[str, ...] = tuple(_KINDS)

# Shapefile (dBASE) field names are cut at 10 characters.
_ALIASES = {"avg_lat_do": "avg_lat_down_ms", "avg_lat_up": "avg_lat_up_ms"}
#: Columns read besides the measures: where quarters and network types may be given.
_CONTEXT_COLUMNS: tuple[str, ...] = ("quarter", "year", "date", *TYPE_COLUMNS)


@dataclass
class TileFile:
    """One input file of tiles, with what its path says about it (``folder``: the ``--tiles``
    folder it was found in, ``None`` for a file given itself)."""

    path: Path
    kind: str
    type: str | None
    quarter: str | None
    folder: Path | None = None


@dataclass
class TileRead:
    """Result of :func:`read_tiles`.

    Attributes
    ----------
    frame
        Normalised tiles, EPSG:4326: ``quadkey``, ``quarter``, ``lon``, ``lat``, the Ookla
        measures (int64), optional columns, ``geometry`` (tile polygon).
    read
        Number of rows read from the files (before any drop).
    dropped
        Rows dropped, by reason.
    sources
        One dict per file read: path, kind, type, quarter(s), rows read, rows kept.
    type
        The network type (``mobile``/``fixed``) or ``None`` when unknown.
    """

    frame: gpd.GeoDataFrame
    read: int
    dropped: dict[str, int] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    type: str | None = None


def quarter_from_path(path: str | Path) -> str | None:
    """The quarter a file holds, from its hive path, Ookla file name or a ``2023Q4`` in its name."""
    text = str(path).replace("\\", "/")
    m = re.search(r"year=(\d{4})/quarter=([1-4])(?:/|$)", text)
    if m:
        return f"{m.group(1)}Q{m.group(2)}"
    name = Path(text).name
    m = re.search(r"(\d{4})-(\d{2})-\d{2}_performance", name)
    if m and 1 <= int(m.group(2)) <= 12:
        return f"{m.group(1)}Q{(int(m.group(2)) - 1) // 3 + 1}"
    named = {f"{y}Q{q}" for y, q in re.findall(r"(?<!\d)(\d{4})[-_ ]?[Qq]([1-4])(?!\d)", name)}
    return named.pop() if len(named) == 1 else None  # a range (2022Q3-2023Q4) names no one


def type_from_path(path: str | Path) -> str | None:
    """The network type (``mobile``/``fixed``) from a hive ``type=`` folder or the file name."""
    text = str(path).replace("\\", "/").lower()
    m = re.search(r"type=(mobile|fixed)(?:/|$)", text)
    if m:
        return m.group(1)
    name = Path(text).name
    found = [t for t in TYPES if re.search(rf"(^|[^a-z]){t}([^a-z]|$)", name)]
    return found[0] if len(found) == 1 else None


def tile_suffix(path: str | Path) -> str:
    """The file name's ending that says how to read it: the longest of :data:`TILE_EXTENSIONS`
    it ends with (``.csv.gz`` before ``.gz``), else its last suffix, lower-cased."""
    name = Path(path).name.lower()
    known = [s for s in TILE_EXTENSIONS if name.endswith(s)]
    return max(known, key=len) if known else Path(name).suffix


def _kind(path: Path) -> str:
    return _KINDS.get(tile_suffix(path), "unknown")


#: Files that together make a folder a geodbk run directory (``geodbk ingest --run``): its
#: tables are outputs, never input tiles.
RUN_DIRECTORY_FILES: tuple[str, ...] = ("tiles.parquet", "region.geojson")


def is_run_directory(folder: Path) -> bool:
    """Whether ``folder`` holds a geodbk run's :data:`RUN_DIRECTORY_FILES`."""
    return all((folder / name).is_file() for name in RUN_DIRECTORY_FILES)


def _is_tile_name(name: str) -> bool:
    """A supported tile extension, not hidden; in folders, plain ``.json`` files are sidecars
    (e.g. from ``geodbk download``), not tiles."""
    suffix = tile_suffix(name)
    return suffix in TILE_EXTENSIONS and suffix != ".json" and not name.startswith(".")


def _scan_folder(root: Path, skip: set[Path]) -> list[Path]:
    """The tile files under ``root``, leaving out the folders ``skip`` (resolved paths) and
    geodbk run directories (:func:`is_run_directory`, logged) with everything below them."""
    found: list[Path] = []
    for here, dirs, names in os.walk(root):
        folder = Path(here)
        kept = []
        for d in sorted(dirs):
            sub = folder / d
            if sub.resolve() in skip:
                continue
            if is_run_directory(sub):
                log.info("%s: a geodbk run directory, skipped in the tile scan of %s", sub, root)
                continue
            kept.append(d)
        dirs[:] = kept
        found.extend(folder / n for n in names if _is_tile_name(n) and (folder / n).is_file())
    return sorted(found)


def discover_tile_files(
    paths: Iterable[str | Path], *, exclude: Iterable[str | Path] = ()
) -> list[TileFile]:
    """Expand files and folders (searched recursively) into tile files, sorted by path.

    Parameters
    ----------
    paths
        Tile files and folders.
    exclude
        Folders left out of the folder scans with everything below them (the run directory
        being written); geodbk run directories inside a folder are always left out.

    Raises
    ------
    DataError
        If a path does not exist, a file has an unsupported extension, a folder is a geodbk run
        directory, or nothing is found.
    """
    skip = {Path(e).resolve() for e in exclude}
    files: dict[Path, Path | None] = {}
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            if is_run_directory(p):
                raise DataError(
                    f"{p}: a geodbk run directory ({', '.join(RUN_DIRECTORY_FILES)}: the "
                    "outputs of `geodbk ingest`), not a folder of Ookla tiles; pass the Ookla "
                    "tile files or their folder with --tiles"
                )
            found = _scan_folder(p, skip)
            if not found:
                raise DataError(
                    f"{p}: no tile files (*.parquet, *.geojson, *.zip, *.gpkg, *.csv, *.csv.gz, "
                    "*.xlsx) in this folder"
                )
            for f in found:
                files.setdefault(f, p)
        elif p.is_file():
            if tile_suffix(p) not in TILE_EXTENSIONS:
                raise DataError(
                    f"{p}: unsupported tile file type {tile_suffix(p)!r}; use Ookla parquet, a "
                    "shapefile zip, GeoJSON, GeoPackage, or CSV (also .csv.gz) or Excel with a "
                    "quadkey column"
                )
            files[p] = None
        else:
            raise DataError(f"{p}: no such file or folder (check the --tiles path)")
    return [
        TileFile(f, _kind(f), type_from_path(f), quarter_from_path(f), files[f])
        for f in sorted(files)
    ]


def _null_count(pf: Any, column: str) -> int:
    """Nulls in a parquet column, from the row-group statistics (reading it when they lack it)."""
    meta = pf.metadata
    idx = pf.schema_arrow.get_field_index(column)
    total = 0
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(idx).statistics
        if stats is None or not stats.has_null_count:
            return int(pf.read(columns=[column]).column(column).null_count)
        total += stats.null_count
    return int(total)


def _read_raw(tf: TileFile) -> tuple[pd.DataFrame, int]:
    """Read one file's attribute table; returns the frame and its number of null geometries."""
    path = tf.path
    null_geoms = 0
    try:
        if tf.kind == "parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            known = {*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, *_CONTEXT_COLUMNS}
            df = pq.read_table(path, columns=[c for c in names if c.lower() in known]).to_pandas()
            tile = [c for c in names if c.lower() == "tile"]
            if tile and len(df):
                null_geoms = _null_count(pq.ParquetFile(path), tile[0])
        elif tf.kind in ("csv", "excel"):  # every column as text: numbers keep their digits
            df = (
                pd.read_csv(path, dtype=str) if tf.kind == "csv" else pd.read_excel(path, dtype=str)
            )
            df = df.drop(
                columns=[c for c in df.columns if c.lower() in ("tile", "geometry", "wkt")]
            )
        else:
            import pyogrio

            gdf = pyogrio.read_dataframe(path)
            null_geoms = int(gdf.geometry.isna().sum()) if "geometry" in gdf else 0
            df = pd.DataFrame(gdf.drop(columns="geometry", errors="ignore"))
    except DataError:
        raise
    except Exception as exc:  # pyarrow / GDAL / pandas raise many types
        raise DataError(
            f"{path}: cannot read this {tf.kind} file ({type(exc).__name__}: {exc}); check that "
            f"it is complete and in one of the supported formats{_found_in(tf)}"
        ) from exc
    lower = [str(c).lower() for c in df.columns]
    df.columns = [_ALIASES.get(c, c) for c in lower]
    df = df.loc[:, ~df.columns.duplicated()]
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)} (found: {', '.join(df.columns)}); "
            f"Ookla tiles need quadkey, avg_d_kbps, avg_u_kbps, avg_lat_ms, tests, devices"
            f"{_found_in(tf)}"
        )
    return df, null_geoms


def _found_in(tf: TileFile) -> str:
    """For a file found by a folder scan: where, and how to leave it out of the tiles."""
    if tf.folder is None:
        return ""
    return (
        f"; the file was found in the --tiles folder {tf.folder}, which is read whole: if it "
        "is not a tile table, move it out of that folder or pass the tile files themselves"
    )


def _log_padded(tf: TileFile, short: int) -> None:
    """Say that ``short`` quadkeys written as numbers were zero-padded back to 16 digits."""
    log.warning(
        "%s: the quadkey column holds numbers; %d quadkeys had lost their leading "
        "zeros and were zero-padded back to 16 digits (store quadkeys as text)",
        tf.path,
        short,
    )


def _quadkeys(keys: pd.Series, tf: TileFile) -> np.ndarray:
    """The ``quadkey`` column as text. A column of numbers has lost its leading zeros: they are
    put back (zero-padded to 16 digits, logged); so are a CSV's of 14-15 digits, whose digits
    are all it has (``220333223131233.0`` read as the number it is; US keys start 02 or 03,
    Alaska's north 00). A file whose quadkeys are all of another
    length is refused (cut quadkeys, or numbers written as text); single rows of another length
    are dropped as ``quadkey_not_zoom16``. Quadkeys in a spreadsheet's scientific notation have
    lost digits and are refused."""
    if pd.api.types.is_numeric_dtype(keys):
        padded, short = padded_number_quadkeys(keys, zoom=TILE_ZOOM)
        if short:
            _log_padded(tf, short)
        return padded.to_numpy(dtype=str)
    text = pd.Series(np.where(keys.isna(), "", keys.astype(str).str.strip()), dtype=str)
    given = text[text != ""]
    if len(given) and given.str.fullmatch(r"\d(?:\.\d+)?[eE]\+?\d+").mean() > 0.5:
        raise DataError(
            f"{tf.path}: column 'quadkey' holds numbers in scientific notation (e.g. "
            f"{given.iloc[0]!r}), as a spreadsheet writes long numbers: their last digits are "
            "lost. Re-export the table with the quadkey column formatted as text"
        )
    if tf.kind == "csv":  # a CSV's numbers are text: 14-15 digits lost the zeros of 0, 00
        text, short = padded_quadkeys(text, zoom=TILE_ZOOM)
        if short:
            _log_padded(tf, short)
    lengths = text[text != ""].str.len()
    if len(lengths) and not (lengths == TILE_ZOOM).any():
        common = int(lengths.mode().iloc[0])
        raise DataError(
            f"{tf.path}: column 'quadkey' holds {common}-digit quadkeys (zoom {common}), but "
            "Ookla tiles are zoom-16 quadkeys of 16 digits; if they were written as numbers "
            "their leading zeros are lost (re-export with quadkeys as text), and if they were "
            "cut, use the original file"
        )
    return text.to_numpy(dtype=str)


def _count(dropped: dict[str, int], reason: str, n: int) -> None:
    if n:
        dropped[reason] = dropped.get(reason, 0) + int(n)


def _rows_of_type(
    raw: pd.DataFrame, type: str | None, tf: TileFile, dropped: dict[str, int], seen: set[str]
) -> pd.DataFrame:
    """The rows of network ``type`` where the table names each row's type (a ``type`` column,
    :data:`geodbk.geo.tile_columns.TYPE_COLUMNS`; the others counted as ``other_type``). Without
    ``type``, a table of both types is refused; the types found are added to ``seen``."""
    typed = row_types(raw)
    if typed is None:
        return raw
    kinds, column = typed
    if type is None:
        found = set(kinds[kinds != ""])
        if len(found) > 1:
            raise DataError(
                f"{tf.path}: column {column!r} holds both mobile and fixed rows; pass --type "
                "mobile or --type fixed"
            )
        seen |= found
        return raw
    other = (kinds != type).to_numpy()
    _count(dropped, "other_type", int(other.sum()))
    return raw.loc[~other].reset_index(drop=True)


def _hive_quarter_number(df: pd.DataFrame, quarter: str | None) -> bool:
    """Whether ``df``'s ``quarter`` column is the bare number (1-4) of the ``quarter`` its path
    names, as a hive partition's column is written into a file, without a ``year`` column."""
    if quarter is None or "quarter" not in df.columns or "year" in df.columns:
        return False
    number = pd.to_numeric(df["quarter"], errors="coerce")
    return bool(len(number)) and bool((number == int(quarter[-1])).all())


def _clean(
    df: pd.DataFrame, quarter: str | None, tf: TileFile, dropped: dict[str, int]
) -> pd.DataFrame:
    """Validate rows of one file: normalise dtypes, drop unusable rows counting the reasons."""
    out = pd.DataFrame(index=pd.RangeIndex(len(df)))
    out["quadkey"] = _quadkeys(df["quadkey"], tf)
    keep = np.ones(len(df), dtype=bool)
    found = quarters_of(df, dates=tf.quarter is None)  # a date column, unless the path says
    if found is not None and _hive_quarter_number(df, tf.quarter):
        found = None  # quarter=4 under year=2023/quarter=4/: the partition's own column
    if found is not None:  # the table's own quarters: never replaced by the path's
        q, source = found
        raw_q = df["quarter"] if "quarter" in df.columns else df["date"]
        refuse_unreadable(q, raw_q, path=tf.path, column=source, what=f"quarters ({QUARTER_FORMS})")
        out["quarter"] = q.to_numpy()
        ok_q = (out["quarter"] != "").to_numpy()
        _count(dropped, "bad_quarter", int((~ok_q).sum()))
        keep &= ok_q
    elif quarter is not None:
        out["quarter"] = quarter
    else:
        raise DataError(
            f"{tf.path}: cannot tell which quarter this file holds; name it like "
            "2023-10-01_performance_mobile_tiles.parquet, put it under year=2023/quarter=4/, "
            "include 2023Q4 in its name, add a 'quarter' column, or ingest that one quarter "
            "(--quarters 2023Q4)"
        )
    for col in REQUIRED_COLUMNS[1:]:
        values = numbers(df[col])
        refuse_unreadable(values, df[col], path=tf.path, column=col, what="numbers (12345)")
        out[col] = values.to_numpy()
    for col in OPTIONAL_COLUMNS:
        if col in df.columns:
            out[col] = numbers(df[col]).to_numpy()
    measures = out[list(REQUIRED_COLUMNS[1:])].to_numpy()
    checks: list[tuple[str, np.ndarray]] = [
        ("bad_quadkey", ~qk.valid_quadkeys(out["quadkey"].to_numpy())),
        ("quadkey_not_zoom16", out["quadkey"].str.len().to_numpy() != TILE_ZOOM),
        ("missing_value", ~np.isfinite(measures).all(axis=1)),
        ("non_positive_download", ~(out["avg_d_kbps"].to_numpy() > 0)),
        ("non_positive_upload", ~(out["avg_u_kbps"].to_numpy() > 0)),
        ("non_positive_latency", ~(out["avg_lat_ms"].to_numpy() > 0)),
        ("tests_below_1", ~(out["tests"].to_numpy() >= 1)),
        ("devices_below_1", ~(out["devices"].to_numpy() >= 1)),
    ]
    for reason, bad in checks:
        hit = bad & keep
        _count(dropped, reason, int(hit.sum()))
        keep &= ~bad
    out = out.loc[keep].reset_index(drop=True)
    for col in REQUIRED_COLUMNS[1:]:
        if col in ("tests", "devices"):
            out[col] = np.round(out[col].to_numpy()).astype(np.int64)
        else:
            out[col] = out[col].to_numpy()
    return out


def read_tiles(
    paths: Iterable[str | Path],
    *,
    type: str | None = None,
    quarters: str | Sequence[str] | None = None,
    exclude: Iterable[str | Path] = (),
    within: tuple[float, float, float, float] | None = None,
) -> TileRead:
    """Read Ookla tiles from files and folders into one normalised GeoDataFrame.

    Parameters
    ----------
    paths
        Files or folders (searched recursively; hive layouts included).
    type
        ``mobile`` or ``fixed``: files whose path says the other type are skipped. When ``None``
        and the files hold both types, a :class:`DataError` asks for one.
    quarters
        Quarter selection (``2019Q1:2023Q4``, ``2023Q4`` or a list); rows of other quarters are
        counted as ``outside_quarters``.
    exclude
        Folders left out of the folder scans (:func:`discover_tile_files`).
    within
        ``(west, south, east, north)`` in degrees: rows whose tile centre lies outside this
        box are dropped as each file is read, counted as ``outside_region`` (a region's
        bounding box, so that a national or global file costs the memory of the region's
        rows, not of the file's).

    Returns
    -------
    TileRead
        The tiles, counts by drop reason and per-file provenance.
    """
    if type is not None and type not in TYPES:
        raise DataError(f"unknown tile type {type!r}: use mobile or fixed")
    wanted = parse_quarters(quarters)
    files = discover_tile_files(paths, exclude=exclude)
    if type is not None:
        files = [f for f in files if f.type in (None, type)]
        if not files:
            raise DataError(f"no {type} tile files among the given --tiles paths")
    else:
        types = {f.type for f in files if f.type}
        if len(types) > 1:
            raise DataError(
                "the --tiles paths hold both mobile and fixed tiles; pass --type mobile or "
                "--type fixed"
            )
        type = next(iter(types)) if types else None
    if wanted is not None:
        files = [f for f in files if f.quarter is None or f.quarter in wanted]
        if not files:
            raise DataError(
                f"no tile files for quarters {wanted[0]}..{wanted[-1]} among the --tiles paths"
            )
    dropped: dict[str, int] = {}
    frames: list[pd.DataFrame] = []
    sources: list[dict[str, Any]] = []
    total = 0
    given_quarter: list[Path] = []  # files whose quarter only --quarters says
    seen_types = {f.type for f in files if f.type}
    for tf in files:
        raw, null_geoms = _read_raw(tf)
        total += len(raw)
        before = dict(dropped)
        raw = _rows_of_type(raw, type, tf, dropped, seen_types)
        quarter = tf.quarter
        if quarter is None and wanted is not None and len(wanted) == 1 and quarters_of(raw) is None:
            quarter = wanted[0]  # one quarter asked for: a file that names none holds it
            log.info("%s names no quarter: taken as %s (--quarters)", tf.path, quarter)
            given_quarter.append(tf.path)
        if len(given_quarter) > 1:
            raise DataError(
                f"{given_quarter[0]} and {given_quarter[1]} name no quarter and have no quarter "
                f"column; --quarters {quarter} can stand for one file only. Name each file's "
                "quarter (e.g. ..._2023Q4.parquet) or add a 'quarter' column"
            )
        clean = _clean(raw, quarter, tf, dropped)
        if wanted is not None and len(clean):
            inside = clean["quarter"].isin(wanted).to_numpy()
            _count(dropped, "outside_quarters", int((~inside).sum()))
            clean = clean.loc[inside].reset_index(drop=True)
        if within is not None and len(clean):
            inside = _centres_within(clean["quadkey"], within)
            _count(dropped, "outside_region", int((~inside).sum()))
            clean = clean.loc[inside].reset_index(drop=True)
        frames.append(clean)
        file_dropped = {
            k: v - before.get(k, 0) for k, v in dropped.items() if v != before.get(k, 0)
        }
        sources.append(
            {
                "path": str(tf.path),
                "kind": tf.kind,
                "type": tf.type,
                "quarter": tf.quarter,
                "rows": len(raw),
                "kept": len(clean),
                "dropped": file_dropped,
                "null_geometries_rebuilt": int(null_geoms),
            }
        )
        log.debug("read %s: %d rows, %d kept", tf.path, len(raw), len(clean))
    if type is None and len(seen_types) > 1:
        raise DataError(
            "the --tiles files hold both mobile and fixed tiles; pass --type mobile or --type fixed"
        )
    type = type if type is not None else next(iter(seen_types), None)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(df):
        dup = df.duplicated(subset=["quadkey", "quarter"], keep="first").to_numpy()
        _count(dropped, "duplicate_tile_quarter", int(dup.sum()))
        if dup.mean() > 0.1:
            log.warning(
                "%d of %d rows repeat a tile and quarter read before them and were dropped "
                "(duplicate_tile_quarter): check that no two files, or two types, are read as "
                "the same quarter",
                int(dup.sum()),
                len(df),
            )
        if dup.any():
            df = df.loc[~dup].reset_index(drop=True)
    return TileRead(
        frame=tiles_to_geodataframe(df), read=total, dropped=dropped, sources=sources, type=type
    )


def _centres_within(quadkeys: pd.Series, box: tuple[float, float, float, float]) -> np.ndarray:
    """Which rows' tile centres lie inside ``box`` ``(west, south, east, north)``, each
    distinct tile tested once."""
    codes, uniques = pd.factorize(quadkeys, sort=False)
    lon, lat = qk.quadkey_centroid(np.asarray(uniques, dtype=str))
    w, s, e, n = box
    inside = (lon >= w) & (lon <= e) & (lat >= s) & (lat <= n)
    return np.asarray(inside[codes], dtype=bool)


def tiles_to_geodataframe(df: pd.DataFrame) -> gpd.GeoDataFrame:
    """Add ``lon``/``lat`` centroids and tile polygons (from the quadkeys) to a tile frame.

    Tiles shared by several quarters are computed once.
    """
    if len(df) == 0:
        empty = pd.DataFrame(
            {c: pd.Series(dtype="float64") for c in (*REQUIRED_COLUMNS, "lon", "lat")}
        )
        empty["quadkey"] = empty["quadkey"].astype(str)
        empty["quarter"] = pd.Series(dtype=str)
        return gpd.GeoDataFrame(empty, geometry=gpd.GeoSeries([], crs="EPSG:4326"), crs="EPSG:4326")
    codes, uniques = pd.factorize(df["quadkey"], sort=False)
    west, south, east, north = qk.quadkey_bounds(np.asarray(uniques, dtype=str))
    polys = tile_polygons(west, south, east, north)
    out = df.copy()
    out["lon"] = ((west + east) / 2.0)[codes]
    out["lat"] = ((south + north) / 2.0)[codes]
    # Ookla's tile_x / tile_y are the tile centroid's lon / lat: fill rows of older quarters.
    for col, centre in (("tile_x", "lon"), ("tile_y", "lat")):
        if col in out.columns:
            out[col] = out[col].astype("float64").fillna(out[centre])
    return gpd.GeoDataFrame(out, geometry=polys[codes], crs="EPSG:4326")
