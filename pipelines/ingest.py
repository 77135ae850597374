"""``geodbk ingest``: Ookla tiles + Census urban/rural layer + region -> ``RUN/tiles.parquet``.

Writes (each atomically) ``RUN/region.geojson``, ``RUN/urban_areas.geojson`` (when the urban
source has polygons), ``RUN/ingest_report.json`` and, last, ``RUN/tiles.parquet``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk import __version__
from geodbk.atomic import atomic_write_json, atomic_write_text, disk_error
from geodbk.errors import DataError
from geodbk.geo.census import UrbanLayer, resolve_urban
from geodbk.geo.frame import Scaling, frame_bounds, longitude_arc, native_box
from geodbk.geo.licence import data_licence
from geodbk.geo.ookla import read_tiles
from geodbk.geo.regions import Region, resolve_region, write_region_geojson
from geodbk.geo.table import DEFAULT_FRACTIONS, prepare_tile_table, write_tile_table
from geodbk.geo.timeaxis import format_quarter, quarter_indices
from pipelines.cli import add_bbox_option, call_with_options, stage_parser
from pipelines.rundir import file_in_run_path, file_in_run_path_message

log = logging.getLogger("geodbk.ingest")

PathLike = str | Path


def _label_unique(
    layer: UrbanLayer, lon: np.ndarray, lat: np.ndarray, keys: pd.Series
) -> np.ndarray:
    """Label each distinct tile once, then broadcast to its rows."""
    codes, uniques = pd.factorize(keys, sort=False)
    first = np.zeros(len(uniques), dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes))[::-1]
    labels = layer.label(lon[first], lat[first])
    return labels[codes]


def run_ingest(
    *,
    tiles: Sequence[PathLike],
    run: PathLike,
    state: str | None = None,
    states_file: PathLike | None = None,
    region: PathLike | None = None,
    bbox: Sequence[float] | None = None,
    urban_areas: PathLike | None = None,
    tracts: PathLike | None = None,
    rural_tracts: PathLike | None = None,
    counties: PathLike | None = None,
    rucc: PathLike | None = None,
    type: str | None = None,
    quarters: str | Sequence[str] | None = None,
    split: str = "random",
    seed: int = 0,
    block_size: float = 0.1,
    scale_by: str = "region",
) -> dict[str, Any]:
    """Run the ingest stage; returns the report written to ``RUN/ingest_report.json``.

    Parameters
    ----------
    tiles
        Tile files or folders (Ookla parquet, hive folders, shapefile zips, GeoJSON,
        GeoPackage, CSV (also compressed) or Excel).
    run
        Run directory (created if needed).
    state, states_file
        A state (postal code, name or FIPS) and the Census state-boundary file holding it.
    region
        Any polygon file as the region (instead of ``state``).
    bbox
        ``(west, south, east, north)`` degrees as the region (instead of ``state``).
    urban_areas
        Census urban-area polygons (UAC20/UAC10): inside = urban.
    tracts, rural_tracts
        Tract polygons and the list of rural tract GEOIDs (FCC).
    counties, rucc
        County polygons and USDA RUCC codes (1-3 urban).
    type
        ``mobile`` or ``fixed`` (inferred from the paths when ``None``).
    quarters
        Quarter selection, e.g. ``2019Q1:2023Q4``.
    split
        ``random`` (seeded 8:1:1 over rows), ``tile`` (every quarter of 10% of the tiles is
        test and of another 10% val: :func:`geodbk.geo.table.tile_split`), ``block`` (held-out
        spatial blocks of ``block_size`` deg) or ``forecast`` (the last quarter = test, the one
        before = val, earlier ones = train; needs at least 3 quarters).
    seed
        Split seed.
    block_size
        Block side in degrees for the block split.
    scale_by
        ``region`` (the region's bounding box, default) or ``tiles`` (the kept tiles' extent).

    Returns
    -------
    dict
        The ingest report (counts, sources, outputs; ``split`` holds the split metadata, for
        ``forecast`` with ``test_quarter``, ``val_quarter`` and ``train_quarters``;
        ``per_quarter`` the rows, urban rows and train/val/test rows of each quarter).

    Raises
    ------
    DataError
        On unusable input, with the file and the fix in the message.
    """
    t0 = time.perf_counter()
    run_dir = Path(run)
    blocker = file_in_run_path(run_dir)
    if blocker is not None:
        raise DataError(
            f"{file_in_run_path_message(run_dir, blocker)}; give --run a folder path (new or "
            "existing), not a file"
        )
    if scale_by not in ("region", "tiles"):
        raise DataError(f"unknown --scale-by {scale_by!r}: use region or tiles")
    if split not in SPLIT_KINDS:
        raise DataError(f"unknown --split {split!r}: use {', '.join(SPLIT_KINDS)}")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise DataError(f"--seed must be a whole number of at least 0 (default 0), got {seed}")
    if not (math.isfinite(block_size) and block_size > 0):
        raise DataError(
            f"--block-size must be a positive finite size in degrees (default 0.1), got "
            f"{block_size}"
        )
    if not tiles:
        raise DataError("no --tiles given: pass Ookla tile files or folders")
    _check_run_apart_from_tiles(run_dir, tiles)
    the_region: Region | None = resolve_region(
        state=state,
        states_file=states_file,
        region=region,
        bbox=tuple(bbox) if bbox is not None else None,  # type: ignore[arg-type]
    )
    read = read_tiles(
        tiles,
        type=type,
        quarters=quarters,
        exclude=[run_dir],
        within=None if the_region is None else _prefilter_box(the_region),
    )
    frame = read.frame
    dropped = dict(read.dropped)
    if len(frame) and the_region is not None:
        codes, uniques = pd.factorize(frame["quadkey"], sort=False)
        first = np.zeros(len(uniques), dtype=np.int64)
        first[codes[::-1]] = np.arange(len(codes))[::-1]
        inside_u = the_region.contains(
            frame["lon"].to_numpy()[first], frame["lat"].to_numpy()[first]
        )
        inside = inside_u[codes]
        if (~inside).any():
            dropped["outside_region"] = dropped.get("outside_region", 0) + int((~inside).sum())
            _warn_on_edge_tiles(the_region, frame, first, codes, inside_u)
            frame = frame.loc[inside].reset_index(drop=True)
    if len(frame) == 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items())) or "none"
        names = ", ".join(str(t) for t in tiles)
        raise DataError(
            f"no usable tiles left from {names}: {read.read} rows read, dropped by reason: "
            f"{reasons}; check --state/--region/--bbox, --quarters and --type"
        )
    if split == "forecast":
        _check_forecast_quarters(frame["quarter"], tiles=tiles, quarters=quarters)
    lon_w, lon_e = longitude_arc(frame["lon"].to_numpy(dtype=np.float64))
    centres_box = (lon_w, float(frame["lat"].min()), lon_e, float(frame["lat"].max()))
    if the_region is None:
        the_region = Region(name="tiles extent", geometry=_tiles_box(frame), kind="tiles")
    region_bounds = the_region.bounds
    _log_frame(the_region)
    layer = resolve_urban(
        urban_areas=urban_areas,
        tracts=tracts,
        rural_tracts=rural_tracts,
        counties=counties,
        rucc=rucc,
        bbox=region_bounds,
    )
    if layer is None:
        log.warning("no urban/rural source given: every tile is labelled rural (urban=False)")
        urban = np.zeros(len(frame), dtype=bool)
    else:
        layer = layer.clip_to(region_bounds)
        urban = _label_unique(
            layer, frame["lon"].to_numpy(), frame["lat"].to_numpy(), frame["quadkey"]
        )
    scaling = the_region.scaling() if scale_by == "region" else Scaling.from_bounds(centres_box)
    table, split_info = prepare_tile_table(
        frame, scaling=scaling, urban=urban, split=split, seed=seed, block_size=block_size
    )
    _check_split_sizes(table["split"], split=split, block_size=block_size)
    n_urban = int(table["urban"].sum())
    counts = {
        "read": int(read.read),
        "kept": len(table),
        "dropped": {k: int(v) for k, v in sorted(dropped.items())},
        "urban": n_urban,
        "rural": len(table) - n_urban,
        "tiles": int(table["quadkey"].nunique()),
    }
    quarters_kept = sorted(table["quarter"].unique().tolist())
    per_quarter = (
        table.assign(**{name: table["split"] == name for name in ("train", "val", "test")})
        .groupby("quarter", sort=True)
        .agg(
            rows=("quadkey", "size"),
            urban=("urban", "sum"),
            train=("train", "sum"),
            val=("val", "sum"),
            test=("test", "sum"),
        )
        .astype(int)
        .to_dict(orient="index")
    )
    urban_meta: dict[str, Any] | None = (
        None
        if layer is None
        else {
            "kind": layer.kind,
            "sources": layer.sources,
            **layer.info,
            "polygons_in_region": len(layer.polygons),
            "checks": urban_checks(n_urban, len(table)),
        }
    )
    shown = _shown_paths(tiles)
    if urban_meta is not None and layer is not None:
        urban_meta["sources"] = _names(layer.sources)
    metadata: dict[str, Any] = {
        "schema_version": 1,
        "scaling": {**scaling.to_dict(), "by": scale_by},
        "split": split_info,
        "sources": [shown(s["path"]) for s in read.sources],
        "data_licence": data_licence(s["path"] for s in read.sources),
        "type": read.type or type or "unknown",
        "quarters": quarters_kept,
        "region": the_region.to_dict(),
        "urban_source": urban_meta,
        "counts": counts,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
        "ingest_id": uuid.uuid4().hex,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    for leftover in run_dir.glob(".ingest-staging-*"):  # of a killed ingest
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=".ingest-staging-", dir=run_dir))
    except OSError as exc:  # a read-only or full run: name the run, not the staging folder
        raise disk_error(exc, run_dir) from exc
    try:
        _stage_and_publish(
            staging,
            run_dir,
            table=table,
            metadata=metadata,
            region=the_region,
            layer=layer,
            report=_ingest_report(metadata, read, shown, per_quarter, layer, t0),
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report = json.loads((run_dir / "ingest_report.json").read_text())
    log.info(
        "ingest: %d rows read, %d kept (%d urban, %d rural), dropped %s -> %s",
        counts["read"],
        counts["kept"],
        counts["urban"],
        counts["rural"],
        counts["dropped"] or "none",
        run_dir / "tiles.parquet",
    )
    log.info("ingest: split %s", _split_summary(split_info))
    return report


#: Degrees the region's bounding box is widened by before it drops rows as each tile file is
#: read: more than a zoom-16 tile, so a tile overlapping the region with its centre outside
#: still reaches the exact region test (and its edge warning).
PREFILTER_MARGIN_DEG = 0.05


def _prefilter_box(region: Region) -> tuple[float, float, float, float]:
    """The region's bounding box (every longitude across the 180° meridian) widened by
    :data:`PREFILTER_MARGIN_DEG`: a superset of the region, tested on each file's rows as it is
    read; the exact test on the region's boundary follows on what is left."""
    w, s, e, n = region.bounds
    m = PREFILTER_MARGIN_DEG
    return (max(w - m, -180.0), max(s - m, -90.0), min(e + m, 180.0), min(n + m, 90.0))


#: Files one ingest writes together, in the order they are moved into place
#: (``ingest_manifest.json``, which lists them, goes last).
INGEST_FILES = ("region.geojson", "urban_areas.geojson", "tiles.parquet", "ingest_report.json")
#: Share of the rows dropped as outside the region while their tiles overlap it above which the
#: region's boundary is said to be too coarse.
EDGE_SHARE_WARNED = 0.01


def _warn_on_edge_tiles(
    region: Region, frame: pd.DataFrame, first: np.ndarray, codes: np.ndarray, inside: np.ndarray
) -> None:
    """Say when over :data:`EDGE_SHARE_WARNED` of the rows were dropped whose tile overlaps the
    region with its centre outside: a generalised boundary (the 1:500k state file) cuts coastal
    tiles off; a detailed one (the state's census tracts as ``--region``) keeps them. ``first``:
    each distinct tile's first row, ``codes``: each row's tile, ``inside``: each tile's centre
    in the region."""
    if region.kind == "bbox" or inside.all():
        return
    edge = np.zeros(len(first), dtype=bool)
    edge[~inside] = region.overlaps(frame["geometry"].to_numpy()[first[~inside]])
    rows = edge[codes]
    if rows.mean() <= EDGE_SHARE_WARNED:
        return
    tests = frame["tests"].to_numpy()
    log.warning(
        "%d rows (%.1f%%; %.1f%% of the tests) were dropped as outside the region although "
        "their tile overlaps it (%d tiles whose centre the boundary of %s leaves out: a "
        "generalised coastline?); to keep them pass a detailed boundary as --region (e.g. "
        "the state's census tracts)",
        int(rows.sum()),
        100 * rows.mean(),
        100 * tests[rows].sum() / max(int(tests.sum()), 1),
        int(edge.sum()),
        region.name,
    )


MANIFEST = "ingest_manifest.json"


def _ingest_report(
    metadata: dict[str, Any],
    read: Any,
    shown: Callable[[str], str],
    per_quarter: dict[str, Any],
    layer: UrbanLayer | None,
    t0: float,
) -> dict[str, Any]:
    """``ingest_report.json``: the table metadata, the sources, per-quarter counts, outputs."""
    has_urban = layer is not None and len(layer.polygons) > 0
    return {
        **{k: v for k, v in metadata.items() if k != "schema_version"},
        "sources": [{**s, "path": shown(s["path"])} for s in read.sources],
        "per_quarter": per_quarter,
        "outputs": {
            "tiles": "tiles.parquet",
            "region": "region.geojson",
            "urban_areas": "urban_areas.geojson" if has_urban else None,
        },
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _stage_and_publish(
    staging: Path,
    run_dir: Path,
    *,
    table: Any,
    metadata: dict[str, Any],
    region: Region,
    layer: UrbanLayer | None,
    report: dict[str, Any],
) -> None:
    """Write the ingest's files into ``staging`` (a failure, e.g. a full disk, leaves the run
    as it was), then move them into ``run_dir`` and write ``ingest_manifest.json`` (the
    ``ingest_id`` and every file's size and SHA-256) last. An earlier urban layer is removed
    when this ingest has none."""
    write_region_geojson(region, staging / "region.geojson")
    if layer is not None and len(layer.polygons):
        outlines = layer.outlines(within=region.geometry)
        if outlines.empty:  # nothing urban in the region: the uncut file labels it all rural too
            outlines = layer.outlines()
        atomic_write_text(staging / "urban_areas.geojson", outlines.to_json(drop_id=True))
    write_tile_table(table, staging / "tiles.parquet", metadata)
    atomic_write_json(staging / "ingest_report.json", report)
    staged = [name for name in INGEST_FILES if (staging / name).is_file()]
    manifest = {
        "ingest_id": metadata["ingest_id"],
        "created": metadata["created"],
        "files": {name: _file_digest(staging / name) for name in staged},
    }
    for name in INGEST_FILES:
        if name in staged:
            os.replace(staging / name, run_dir / name)
        else:  # a stale layer from an earlier ingest would mislead the dashboard
            with contextlib.suppress(FileNotFoundError):
                (run_dir / name).unlink()
    atomic_write_json(run_dir / MANIFEST, manifest)


def _file_digest(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


#: Above this share of one class, the urban labels are suspect (a broken census input).
ONE_CLASS_SHARE = 0.99


def urban_checks(n_urban: int, n: int) -> dict[str, Any]:
    """The urban/rural sanity checks recorded in ``ingest_report.json``: each class's share
    and a warning (also logged) when one class is empty or holds more than 99% of the rows,
    which a damaged or mismatched census file produces."""
    share = n_urban / n if n else 0.0
    out: dict[str, Any] = {"urban_share": share, "warning": None}
    if n and (n_urban == 0 or n_urban == n or max(share, 1 - share) > ONE_CLASS_SHARE):
        side = "urban" if share > 0.5 else "rural"
        out["warning"] = (
            f"{max(share, 1 - share):.1%} of the rows are {side}: unless the region is "
            f"wholly {side}, check the census input (the right state's file, intact "
            "geometries, and a rural-tract list or RUCC table that covers the state)"
        )
        log.warning("ingest: %s", out["warning"])
    return out


#: The ``--split`` choices.
SPLIT_KINDS: tuple[str, ...] = ("random", "tile", "block", "forecast")


def _check_forecast_quarters(
    quarter: pd.Series, *, tiles: Sequence[PathLike], quarters: str | Sequence[str] | None
) -> None:
    """Refuse ``--split forecast`` on fewer than 3 quarters (train, val and test need one each)."""

    kept = [format_quarter(int(i)) for i in np.unique(quarter_indices(quarter.astype(str)))]
    if len(kept) >= 3:
        return
    names = ", ".join(str(t) for t in tiles)
    asked = f" (--quarters {quarters})" if quarters else ""
    raise DataError(
        f"--split forecast needs at least 3 quarters (train, val, test) but the tiles from "
        f"{names} have {len(kept)}: {', '.join(kept)}{asked}; widen --quarters (e.g. "
        f"--quarters 2019Q1:2023Q4) or pass tiles of more quarters, or use --split random or "
        f"--split block"
    )


def _check_run_apart_from_tiles(run_dir: Path, tiles: Sequence[PathLike]) -> None:
    """Refuse a run directory that is a ``--tiles`` folder: its outputs would be read as tiles
    by the next ingest. (A run directory inside a ``--tiles`` folder is left out of the scan.)"""
    run = run_dir.resolve()
    for t in tiles:
        if Path(t).is_dir() and Path(t).resolve() == run:
            raise DataError(
                f"--run {run_dir} is the --tiles folder {t}: the run's outputs would mix with "
                f"the tiles; give the run a folder of its own (e.g. --run {Path(t) / 'run'})"
            )


def _tiles_box(frame: Any) -> Any:
    """The box around the tiles' polygons in [-180, 180] longitudes: two boxes split at the
    180° meridian when the tiles' shortest arc of longitude crosses it."""
    return native_box(*frame_bounds(frame.geometry.to_numpy()))


def _log_frame(region: Region) -> None:
    """Say so when the region crosses the 180° meridian (Alaska's Aleutians): its scaling and
    maps then run east past 180° (:mod:`geodbk.geo.frame`), its tables stay in [-180, 180]."""
    west, _, east, _ = region.extent
    if east > 180.0:
        log.info(
            "the region %s crosses the 180° meridian: its scaling and maps span longitudes "
            "%.2f to %.2f (east of 180 = %.2f), the tile table keeps [-180, 180]",
            region.name,
            west,
            east,
            east - 360.0,
        )


def _check_split_sizes(labels: Any, *, split: str, block_size: float) -> None:
    """Refuse a split that left val or test empty (training would have no early stopping, the
    report nothing to score): blocks of ``--block-size`` so large that too few of them hold
    tiles, or a table too small to hold out a tenth of its tiles or rows. Warn when a block
    split's val or test holds over 1.5 times its share of the rows (a block with much of the
    data went there whole)."""
    empty = [name for name in ("val", "test") if not (labels == name).any()]
    if empty and split == "block":
        raise DataError(
            f"--block-size {block_size:g}: the tiles fall in too few blocks of {block_size:g}° "
            f"to hold out whole blocks, so the {' and '.join(empty)} split would be empty; use "
            "a smaller --block-size (default 0.1) or another --split"
        )
    if empty and split in ("random", "tile"):  # a forecast split refuses its own quarters
        unit = "tiles" if split == "tile" else "rows"
        raise DataError(
            f"--split {split}: the table's {len(labels)} rows are too few to hold out a tenth "
            f"of its {unit}, so the {' and '.join(empty)} split would be empty; ingest a larger "
            "region or more quarters"
        )
    if split != "block":
        return
    n = max(len(labels), 1)
    for name, want in (("val", DEFAULT_FRACTIONS[1]), ("test", DEFAULT_FRACTIONS[2])):
        share = float((labels == name).sum()) / n
        if share > 1.5 * want:
            log.warning(
                "--split block: %s holds %.0f%% of the rows (aimed at %.0f%%): a few blocks of "
                "%g° hold much of the data, and one went there whole; a smaller --block-size "
                "or another --seed spreads the rows more evenly",
                name,
                100 * share,
                100 * want,
                block_size,
            )


def _split_summary(info: dict[str, Any]) -> str:
    """One line per split kind, e.g. ``tile (seed 0); tiles train/val/test 800/100/100; rows
    train/val/test 3200/400/400`` or ``forecast: test 2023Q4, val 2023Q3, train
    2023Q1..2023Q2; rows train/val/test 5000/2600/2700``."""
    counts = info.get("counts", {})
    rows = f"rows train/val/test {counts.get('train')}/{counts.get('val')}/{counts.get('test')}"
    for unit in ("tiles", "blocks"):
        if isinstance(info.get(unit), dict):
            n = info[unit]
            rows = f"{unit} train/val/test {n.get('train')}/{n.get('val')}/{n.get('test')}; {rows}"
    if info.get("kind") == "forecast":
        train = info.get("train_quarters") or []
        span = train[0] if len(train) == 1 else f"{train[0]}..{train[-1]}"
        return (
            f"forecast: test {info['test_quarter']}, val {info['val_quarter']}, train {span}; "
            f"{rows}"
        )
    return f"{info.get('kind')} (seed {info.get('seed')}); {rows}"


#: The ingest call ``geodbk demo`` makes on the embedded synthetic region (paths relative to the
#: repository root).
DEMO_INGEST: dict[str, Any] = {
    "tiles": ["data/ookla/parquet"],
    "type": "mobile",
    "state": "SY",
    "states_file": "data/census/synthetic_state_boundaries.geojson",
    "urban_areas": "data/census/synthetic_uac20.geojson",
    "quarters": "2023Q1:2023Q4",
    "split": "random",
    "seed": 0,
}


def demo_ingest_kwargs(data_dir: PathLike | None = None) -> dict[str, Any]:
    """Keyword arguments of the demo's :func:`run_ingest` call, with absolute paths.

    Parameters
    ----------
    data_dir
        The embedded data folder (default: ``data/`` next to the ``pipelines`` package).

    Examples
    --------
    >>> report = run_ingest(run="runs/demo", **demo_ingest_kwargs())  # doctest: +SKIP
    """
    root = Path(data_dir) if data_dir is not None else Path(__file__).resolve().parents[1] / "data"
    if not (root / "ookla").is_dir():
        raise DataError(
            f"{root}: the embedded synthetic data is missing; regenerate it with "
            f"`python -m geodbk.geo.synthetic --out {root}`"
        )
    kw = dict(DEMO_INGEST)
    kw["tiles"] = [root / Path(t).relative_to("data") for t in DEMO_INGEST["tiles"]]
    for key in ("states_file", "urban_areas"):
        kw[key] = root / Path(DEMO_INGEST[key]).relative_to("data")
    return kw


def _main(args: argparse.Namespace) -> int:
    call_with_options(run_ingest, args)
    return 0


_EPILOG = """\
examples:
  # the embedded synthetic region (what `geodbk demo` runs)
  geodbk ingest --tiles data/ookla/parquet --type mobile --run runs/demo \\
      --state SY --states-file data/census/synthetic_state_boundaries.geojson \\
      --urban-areas data/census/synthetic_uac20.geojson --quarters 2023Q1:2023Q4

  # Hawaii, 20 quarters of mobile tiles, FCC rural tracts
  geodbk ingest --tiles ookla/parquet/performance --type mobile --run runs/hi \\
      --state HI --states-file cb_2018_us_state_500k.zip \\
      --tracts tl_2010_15_tract10.zip --rural-tracts fcc_rural_census_tracts_2010.csv \\
      --quarters 2019Q1:2023Q4

  # a bounding box, Census 2020 urban areas, a spatial-block split
  geodbk ingest --tiles tiles.geojson --run runs/box --bbox -158.3 21.2 -157.6 21.8 \\
      --urban-areas tl_2020_us_uac20.zip --split block --block-size 0.05

  # a forecast split: 2023Q4 = test, 2023Q3 = val, 2023Q1-Q2 = train
  geodbk ingest --tiles data/ookla/parquet --type mobile --run runs/forecast \\
      --state SY --states-file data/census/synthetic_state_boundaries.geojson \\
      --urban-areas data/census/synthetic_uac20.geojson --quarters 2023Q1:2023Q4 \\
      --split forecast

Writes RUN/tiles.parquet, RUN/region.geojson, RUN/urban_areas.geojson, RUN/ingest_report.json
and RUN/ingest_manifest.json, as one set (a failed ingest leaves the earlier set in place).
exit codes: 0 ok, 2 usage, 3 bad input data (tiles, census files, options; the message names
the file, column or option and the fix), 6 the disk refused a write.
"""


def register(subparsers: Any) -> None:
    """Add the ``ingest`` sub-command to the CLI."""
    p = stage_parser(
        subparsers,
        "ingest",
        _main,
        description=(
            "Read Ookla speed-test tiles (official parquet, hive folders, shapefile zips, "
            "GeoJSON, GeoPackage, CSV or .csv.gz, Excel), keep those in the region, label them urban or rural, scale lon/lat "
            "to [-1,1]², split train/val/test and write the run's tile table."
        ),
        epilog=_EPILOG,
    )
    p.add_argument(
        "--tiles", nargs="+", required=True, metavar="PATH", help="tile files or folders"
    )
    p.add_argument("--run", required=True, metavar="RUN", help="run directory to write")
    g = p.add_argument_group("region (one of)")
    g.add_argument("--state", help="state postal code, name or FIPS (with --states-file)")
    g.add_argument(
        "--states-file",
        metavar="FILE",
        help="Census state-boundary file (cb_2018_us_state_500k.zip)",
    )
    g.add_argument("--region", metavar="FILE", help="any polygon file as the region")
    add_bbox_option(g)
    u = p.add_argument_group("urban/rural source (one of)")
    u.add_argument(
        "--urban-areas", metavar="FILE", help="Census urban areas (tl_2020_us_uac20, UACE10)"
    )
    u.add_argument("--tracts", metavar="FILE", help="census tract polygons (with --rural-tracts)")
    u.add_argument(
        "--rural-tracts",
        metavar="FILE",
        help="rural tract GEOID list: the FCC CSV, or a CSV/Excel table with a FIPS or GEOID column",
    )
    u.add_argument("--counties", metavar="FILE", help="county polygons (with --rucc)")
    u.add_argument(
        "--rucc",
        metavar="FILE",
        help="USDA rural-urban continuum codes, the ERS CSV or Excel file (1-3 = urban)",
    )
    p.add_argument(
        "--type", choices=("mobile", "fixed"), help="network type (default: from the paths)"
    )
    p.add_argument(
        "--quarters", metavar="Q1:Q2", help="quarters to keep, e.g. 2019Q1:2023Q4 or 2023Q4"
    )
    p.add_argument(
        "--split",
        choices=SPLIT_KINDS,
        default="random",
        help="random 8:1:1 rows; tile: every quarter of 10%% of the tiles is test and of "
        "another 10%% val (a tile never measured); spatial blocks (--block-size); or forecast: "
        "the last quarter = test, the one before = val, earlier quarters = train (needs >= 3 "
        "quarters)",
    )
    p.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    p.add_argument(
        "--block-size",
        type=float,
        default=0.1,
        metavar="DEG",
        help="block side for --split block (default 0.1°)",
    )
    p.add_argument(
        "--scale-by",
        choices=("region", "tiles"),
        default="region",
        help="bounding box used for the [-1,1]² scaling (default: the region's)",
    )


def _names(paths: Sequence[Any]) -> list[Any]:
    """File names of input paths (``None`` kept): outputs record no absolute local path."""
    return [None if p is None else Path(str(p)).name for p in paths]


def _shown_paths(tiles: Sequence[PathLike]) -> Callable[[str], str]:
    """How an Ookla input file is named in outputs: relative to the ``--tiles`` folder it was
    found in (``parquet/performance/type=mobile/...``), else its file name."""
    roots = [Path(t).resolve() for t in tiles if Path(t).is_dir()]

    def shown(path: str) -> str:
        p = Path(path).resolve()
        for root in roots:
            if p.is_relative_to(root):
                return p.relative_to(root).as_posix()
        return p.name

    return shown
